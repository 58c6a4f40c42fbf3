"""Our Medusa heads in vLLM's Medusa format, and back (vLLM 0.32: ``vllm/model_executor/models/medusa.py``).

vLLM's Medusa drafter is plain Medusa-1 (arXiv 2401.10774, eq. 1): K heads of L ResBlocks
x + SiLU(W x + b) on the target's final-norm hidden state h_t, head i (0-based) proposing token
t+2+i, top-1 each: one chain, no tree, no lookup branch. Its folder is ``config.json`` plus any
``*.safetensors``:

    blocks.{i}.layers.{j}.weight|bias   ResBlock j of head i       ours: {i}.{j}.linear.weight|bias
    lm_heads.{i}.weight                 head i's projection [V', d] ours: {i}.{L}.weight
    lm_heads.0.weight, original_lm_head one projection for all heads ours: the base model's lm_head
    token_map                           int64 token id of each of the V' rows (V' = truncated_vocab_size)
                                        ours: proposal_ids

``medusa_fc_bias`` must be true (vLLM's default is false: its blocks would drop our biases).
Only the shared head is truncated to ``token_map``'s rows: vLLM sizes per-head projections to the
full vocabulary, so heads with their own projections onto a proposal vocabulary are refused.
Root- and path-conditioned heads (``heads.py``) read the root token and their branch besides h_t;
vLLM's heads read h_t only, so they have no counterpart there.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .messages import HeadsError

VLLM_WEIGHTS = "model.safetensors"
# config.json's "exported_by": marks a folder this module wrote
EXPORTED_BY = "medusa-playground"
# root and path conditioning are off unless asked for
TRAIN_PLAIN = "python -m medusa_lib.pipeline.train --out DIR"


def vllm_refusal(heads) -> str | None:
    """Why vLLM's Medusa cannot run ``heads`` (a ``heads.MedusaHeads``) (one sentence that says which heads
    can), or None."""
    cfg = heads.config
    if not cfg.shared_lm_head and cfg.num_proposal_tokens and not (heads.root_conditioned or heads.path_conditioned):
        # vLLM 0.32 sizes per-head projections to the full vocabulary; only its one shared head is truncated
        # by token_map.
        return (
            f"These heads have their own projections onto a {cfg.num_proposal_tokens}-token proposal vocabulary, "
            "which vLLM's Medusa "
            "cannot load (it restricts the vocabulary only for one head shared by all); "
            "train heads on the shared lm_head "
            f"(the default: {TRAIN_PLAIN}) or with full-vocabulary projections (--proposal-tokens 0), and export those."
        )
    if not (heads.root_conditioned or heads.path_conditioned):
        return None
    kind = (
        "path-conditioned (each head also reads the tree's root and its own branch)"
        if heads.path_conditioned
        else "root-conditioned (they also read the tree's root token)"
    )
    return (
        f"These heads are {kind}, which vLLM's Medusa cannot run: it feeds its heads the hidden state only; "
        f"only plain heads export to vLLM (such as assets/heads/smollm2-135m-instruct-plain), so train them without "
        f"--root-conditioned or --path-conditioned ({TRAIN_PLAIN}) and export those."
    )


def export_command(folder: str | Path | None, out: str = "OUT") -> str:
    """The export command line for the heads in ``folder``."""
    return f"python -m medusa_lib.pipeline.export --heads {folder or 'DIR'} --to vllm --out {out}"


def to_vllm_medusa(
    heads, lm_head_weight: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float32
) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, config.json) of ``heads`` (a ``heads.MedusaHeads``) in vLLM's Medusa layout. Heads that share the base
    model's lm_head need its weight [V, d]: its rows at ``proposal_ids`` become the one shared head."""
    why = vllm_refusal(heads)
    if why:
        raise HeadsError(why)
    cfg = heads.config
    cast = lambda t: t.detach().to(device="cpu", dtype=dtype).contiguous()  # noqa: E731
    state: dict[str, torch.Tensor] = {}
    for i, head in enumerate(heads.heads):
        for j in range(cfg.num_layers):
            state[f"blocks.{i}.layers.{j}.weight"] = cast(head[j].linear.weight)
            state[f"blocks.{i}.layers.{j}.bias"] = cast(head[j].linear.bias)
        if not cfg.shared_lm_head:
            state[f"lm_heads.{i}.weight"] = cast(head[-1].weight)
    if cfg.shared_lm_head:
        if lm_head_weight is None:
            raise HeadsError("These heads share the base model's lm_head; pass its weight to export them.")
        if tuple(lm_head_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise HeadsError(
                f"The lm_head given is {tuple(lm_head_weight.shape)}, but the heads need [{cfg.vocab_size}, "
                f"{cfg.hidden_size}]; export with the model they were trained for."
            )
        w = (
            lm_head_weight
            if heads.proposal_ids is None
            else lm_head_weight[heads.proposal_ids.to(lm_head_weight.device)]
        )
        # the rows of the proposal tokens only: V' x d, not V x d
        state["lm_heads.0.weight"] = cast(w)
    if heads.proposal_ids is not None:
        state["token_map"] = heads.proposal_ids.detach().to("cpu", torch.int64).contiguous()
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "medusa_num_heads": cfg.num_heads,
        "medusa_num_layers": cfg.num_layers,
        "medusa_fc_bias": True,
        "original_lm_head": cfg.shared_lm_head,
        "truncated_vocab_size": cfg.num_proposal_tokens or cfg.vocab_size,
        "base_model_name_or_path": cfg.base_model,
        "torch_dtype": str(dtype).replace("torch.", ""),
        "exported_by": EXPORTED_BY,
    }
    return state, config


def read_vllm_medusa(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """vLLM's Medusa folder as (our state dict, our config): ResBlocks as ``{i}.{j}.linear.*``, each
    head's projection as ``{i}.{L}.weight`` (the shared head copied to every head, as vLLM uses it),
    ``token_map`` as ``proposal_ids``. ``heads_load.load_heads`` calls this for such folders."""
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    raw: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            raw.update({k: st.get_tensor(k) for k in st.keys()})
    K = int(next((v for k, v in config.items() if "num" in k and "heads" in k), 0))
    L = int(next((v for k, v in config.items() if "num" in k and "layers" in k), 0))
    V = int(config.get("vocab_size") or 0)
    if not (K and L and V):
        raise HeadsError(
            f"{folder}/config.json lacks the number of heads, of layers or the vocabulary size; "
            "is this a vLLM Medusa folder?"
        )
    token_map = raw.pop("token_map", None)
    truncated = int(config.get("truncated_vocab_size") or V)
    if truncated < V and token_map is None:
        raise HeadsError(
            f"{folder} has truncated_vocab_size {truncated} < vocab_size {V} but no token_map tensor; "
            "the export is incomplete."
        )
    state: dict[str, torch.Tensor] = {}
    for i in range(K):
        for j in range(L):
            # vLLM renames the old keys too.
            w = raw.get(f"blocks.{i}.layers.{j}.weight", raw.get(f"{i}.{j}.linear.weight"))
            if w is None:
                raise HeadsError(f"{folder} has no tensor for ResBlock {j} of head {i}; the export is incomplete.")
            b = raw.get(f"blocks.{i}.layers.{j}.bias", raw.get(f"{i}.{j}.linear.bias"))
            state[f"{i}.{j}.linear.weight"] = w
            state[f"{i}.{j}.linear.bias"] = (
                b if b is not None and config.get("medusa_fc_bias") else torch.zeros(w.shape[0], dtype=w.dtype)
            )
        proj = raw.get("lm_heads.0.weight" if config.get("original_lm_head") else f"lm_heads.{i}.weight")
        if proj is None:
            raise HeadsError(f"{folder} has no projection for head {i}; the export is incomplete.")
        if token_map is not None and truncated < V and proj.shape[0] > token_map.numel():
            # a full-vocabulary head is sliced by the token map, as vLLM does
            proj = proj[token_map]
        state[f"{i}.{L}.weight"] = proj
    if token_map is not None and truncated < V:
        state["proposal_ids"] = token_map.long()
    ours = {
        "vocab_size": V,
        "medusa_num_heads": K,
        "medusa_num_layers": L,
        "base_model_name_or_path": config.get("base_model_name_or_path"),
    }
    return state, ours


def eagle_vllm_refusal(config) -> str | None:
    """Why vLLM's EAGLE drafter cannot run an EAGLE head of this ``EagleConfig`` (one sentence), or None."""
    if config.fuse_layers:
        return (
            f"This EAGLE head fuses base layers {list(config.fuse_layers)} (the EAGLE-3 recipe), which vLLM's EAGLE "
            "drafter cannot run: its EAGLE-1 reads the final hidden state only and its EAGLE-3 is another layer; "
            "export an EAGLE-1 head (fuse_layers null, such as assets/heads/smollm2-135m-instruct-eagle)."
        )
    if config.model_type not in (None, "llama"):
        return (
            f"This EAGLE head drafts for a {config.model_type} model; the export writes vLLM's EAGLE drafter for "
            "Llama models only (EagleLlamaForCausalLM), so export a head trained for a Llama model."
        )
    return None
