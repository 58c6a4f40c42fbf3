"""Medusa heads from a checkpoint: the module built from a state dict's own layout, checked and placed beside a model.

``heads_io.read_checkpoint`` finds and reads the files (every public format and ours, converted to the
reference layout ``{i}.{j}.linear.*``, ``{i}.{L}.weight``); ``heads_from_state_dict`` reads the heads'
shape from those keys (heads, layers, an own projection or the shared ``lm_head``, root- and
path-conditioning) and builds ``heads.MedusaHeads``; ``load_heads`` does both, reads the settings
shipped beside them (trees, calibrations) and fits them to ``model``: its size, device, dtype, the
CPU's pre-packed weights and the int8 projection where it pays.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from .heads import HeadsConfig, MedusaHeads
from .heads_io import read_checkpoint, read_settings
from .messages import HeadsError
from .packing import can_int8, int8_fits, is_prepacked, prepack_linear_weights

_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def heads_from_state_dict(
    state: dict[str, torch.Tensor], *, config: dict | None = None, base_model: str | None = None
) -> MedusaHeads:
    """Build heads from a reference-layout state dict (keys ``{i}.{j}.linear.*``, ``{i}.{L}.weight``)."""

    state = dict(state)
    proposal_ids = state.pop("proposal_ids", None)
    # R^(k) of root-conditioned heads, P^(k,j) of path-conditioned heads
    root = {k[len("root.") :]: state.pop(k) for k in [k for k in state if k.startswith("root.")]}
    path = {k[len("path.") :]: state.pop(k) for k in [k for k in state if k.startswith("path.")]}
    heads: dict[int, dict[int, set[str]]] = {}
    for key in state:
        m = _KEY.match(key)
        if not m:
            raise HeadsError(f"Unexpected tensor {key!r} in the Medusa heads checkpoint; is this a Medusa checkpoint?")
        heads.setdefault(int(m[1]), {}).setdefault(int(m[2]), set()).add(m[3])
    if not heads:
        raise HeadsError("The checkpoint holds no Medusa head tensors.")
    K = max(heads) + 1
    if sorted(heads) != list(range(K)):
        raise HeadsError(f"The checkpoint's heads are numbered {sorted(heads)}; expected 0..{K - 1}.")
    layers = heads[0]
    L = sum(1 for j in layers if "linear.weight" in layers[j])
    own = any("weight" in layers[j] for j in layers if "linear.weight" not in layers[j])
    for i, h in heads.items():
        if h != heads[0]:
            raise HeadsError(f"Medusa head {i} has a different layout from head 0; the checkpoint is damaged.")
    d = state["0.0.linear.weight"].shape[1]
    if own:
        V_out = state[f"0.{L}.weight"].shape[0]
    vocab = int((config or {}).get("vocab_size") or 0)
    if own and proposal_ids is None:
        vocab = V_out
    if not vocab:
        raise HeadsError(
            "Cannot tell the heads' vocabulary size: the checkpoint shares the lm_head but its config has no "
            "vocab_size."
        )
    cfg = HeadsConfig(
        hidden_size=d,
        vocab_size=vocab,
        num_heads=K,
        num_layers=L,
        shared_lm_head=not own,
        num_proposal_tokens=int(proposal_ids.numel()) if proposal_ids is not None else None,
        base_model=base_model or (config or {}).get("base_model_name_or_path"),
        root_conditioned=bool(root),
        path_conditioned=bool(path),
    )
    if path and not root:
        raise HeadsError(
            "The checkpoint has branch (path.*) tensors but no root.* tensors; path-conditioned heads need both, "
            "so the checkpoint is damaged."
        )
    module = MedusaHeads(cfg)
    try:
        module.heads.load_state_dict(state, strict=True)
        if root:
            module.root.load_state_dict(root, strict=True)
        if path:
            module.path.load_state_dict(path, strict=True)
    except RuntimeError as e:
        raise HeadsError(f"The Medusa heads checkpoint does not fit its own layout: {str(e).splitlines()[0]}") from None
    if proposal_ids is not None:
        module.proposal_ids.copy_(proposal_ids.long())
    return module


def load_heads(
    name_or_path: str | Path, *, model: nn.Module | None = None, local_only: bool = False, int8: bool | None = None
) -> MedusaHeads:
    """Load Medusa heads in any of the three public formats or ours; check them against ``model``.
    ``int8``: project the drafts onto the proposal tokens in int8 (None: where ``packing.int8_fits``
    the model, float32 on a CPU); the ResBlocks stay float (they read the model's features)."""
    folder, state, config = read_checkpoint(name_or_path, local_only=local_only)
    if not config.get("vocab_size") and model is not None:
        config = {**config, "vocab_size": model.get_output_embeddings().weight.shape[0]}
    heads = heads_from_state_dict(state, config=config)
    read_settings(heads, folder, config)
    if model is not None:
        heads.check_fits(model)
        p = next(model.parameters())
        heads.to(device=model.get_output_embeddings().weight.device, dtype=p.dtype)
        # pre-packed like the model (CPU)
        if is_prepacked(model):
            heads.requires_grad_(False)
            prepack_linear_weights(heads)
        want = int8_fits(model) if int8 is None else int8
        # only a shared projection onto proposal tokens goes int8, and only where it runs
        rows = model.get_output_embeddings().weight
        heads.int8 = bool(want and heads.config.shared_lm_head and heads.proposal_ids is not None and can_int8(rows))
    heads.eval()
    return heads


__all__ = ["heads_from_state_dict", "load_heads"]
