"""The EAGLE draft head: one decoder layer that drafts autoregressively at the feature level.

EAGLE (Li et al., arXiv 2401.15077) and EAGLE-2 (arXiv 2406.16858); reference code
SafeAILab/EAGLE (``cnets.py``: ``Model.forward`` and ``topK_genrate``). A Medusa head reads only
h_t, so it cannot know which token the model will pick at t+1; EAGLE's drafter reads that token:

    g_t = Layer( fc([ e(x_{t+1}) ; f_t ]) )          f_t: the base model's feature (final-norm
    q(x_{t+2} | ...) = softmax( lm_head(g_t) )            hidden state, what lm_head reads)

``fc`` is Linear(2d, d), ``Layer`` one decoder layer of the base model's own transformers class
(its own small KV cache, the base model's rotary embedding), ``e`` and ``lm_head`` are the base
model's, frozen and not stored; the lm_head is restricted to a proposal vocabulary
(``proposal_ids``) as our Medusa heads are. g_t regresses f_{t+1}, so the drafter can feed its own
output back in and draft further: the next draft step reads (e(x_{t+2}), g_t).

Per decoding step (``eagle_run.EagleRun``): the accepted tokens' *verified* features enter the drafter's
cache first (they replace whatever it drafted there; reference ``update_inference_inputs``); then
the dynamic tree (``dynamic_tree.py``) is drafted level by level, and its entries are cropped
from the drafter's cache again before the next step. Verification, acceptance and exactness are
the Medusa decoder's (``decoding.py``): only ``propose`` differs.

Folder format (``save`` / ``load_eagle``): ``eagle.safetensors`` (fc, layer, proposal_ids) +
``config.json`` (``format: medusa-playground-eagle-1``, sizes, the base model, the default
dynamic tree) + a README.md model card.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from .dynamic_tree import DynamicTreeConfig
from .eagle_run import EagleRun  # noqa: F401  (re-exported: one run of a head)
from .heads import hidden_size_of
from .messages import InputError
from .packing import (
    can_int8,
    frozen_projection,
    int8_linear_weights,
)

EAGLE_FILE = "eagle.safetensors"
CONFIG_FILE = "config.json"
FORMAT = "medusa-playground-eagle-1"


class EagleError(InputError):
    """An EAGLE head that cannot be built, loaded or run. One sentence that says what to change."""


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int
    vocab_size: int
    # draft onto this many frequent tokens (None: the full vocabulary)
    num_proposal_tokens: int | None = None
    base_model: str | None = None
    # the base model's family: the layer is of its class
    model_type: str | None = None
    # default dynamic tree (dynamic_tree.DynamicTreeConfig)
    top_k: int = 8
    depth: int = 5
    num_nodes: int = 24
    # EAGLE-3 (arXiv 2503.01840): the drafter reads the inputs of these base layers (low, middle, high),
    # fused, where EAGLE-1 reads f_t (None). Its drafted g then needs not regress f_{t+1}.
    fuse_layers: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.fuse_layers is not None:
            object.__setattr__(self, "fuse_layers", tuple(self.fuse_layers))

    @property
    def recipe(self) -> str:
        return "EAGLE-3 (fused features)" if self.fuse_layers else "EAGLE-1 (top feature)"

    @property
    def tree(self) -> DynamicTreeConfig:
        return DynamicTreeConfig(top_k=self.top_k, depth=self.depth, num_nodes=self.num_nodes)


def eagle_refusal(model: nn.Module) -> str | None:
    """Why an EAGLE head cannot be built on this model (one sentence), or None."""
    body = getattr(model, "base_model", None)
    if getattr(body, "layers", None) is None or getattr(body, "rotary_emb", None) is None:
        return (
            "The EAGLE drafter needs a decoder with rotary position embeddings (Llama, Qwen2, Mistral); "
            f"{type(model).__name__} has none, so use the Medusa heads."
        )
    return None


class EagleHead(nn.Module):
    """fc + one decoder layer; the base model's embedding and lm_head are bound, not owned."""

    def __init__(self, model: nn.Module, config: EagleConfig):
        super().__init__()
        why = eagle_refusal(model)
        if why:
            raise EagleError(why)
        self.config = config
        d = config.hidden_size
        text = copy.deepcopy(model.config.get_text_config(decoder=True))
        text.num_hidden_layers = 1
        body = model.base_model
        # the draft's projection and layer in int8 (``use_int8``)
        self.int8 = False
        self.fc = nn.Linear(2 * d, d, bias=True)
        if config.fuse_layers:
            self.fuse = nn.Linear(len(config.fuse_layers) * d, d, bias=False)
        # the base model's own decoder-layer class
        self.layer = type(body.layers[0])(text, layer_idx=0)
        # positions as the base model encodes them
        self.rotary = type(body.rotary_emb)(config=text)
        if config.num_proposal_tokens:
            self.register_buffer("proposal_ids", torch.arange(config.num_proposal_tokens), persistent=True)
        else:
            self.proposal_ids = None
        self.bind(model)

    def bind(self, model: nn.Module) -> None:
        """Read the token embedding and project through ``model``'s own (frozen) modules."""
        object.__setattr__(self, "_embed", model.get_input_embeddings())
        object.__setattr__(self, "_lm_head", model.get_output_embeddings())
        self._proposal_key = None

    def use_int8(self) -> int:
        """Draft in int8 (``packing.Int8Linear``) where it runs (a float32 head on a CPU with fbgemm): the
        vocabulary projection and the layer's attention and MLP matrices; ``fc`` stays float (it reads the
        model's features, whose outliers int8 loses: measured, docs/performance.md). Decoding stays exact;
        returns how many matrices were swapped (0: the head stays float)."""
        if not can_int8(self.fc.weight):
            return 0
        self.int8, self._proposal_key = True, None
        return int8_linear_weights(self.layer)

    def draft_input(self, features: torch.Tensor) -> torch.Tensor:
        """What the drafter reads at a verified position: f_t [..., d] (EAGLE-1), or the fused layer inputs
        [..., n, d] (EAGLE-3): each RMS-normalised (they hold massive activations), concatenated, projected."""
        if not self.config.fuse_layers:
            return features
        x = features.to(self.fuse.weight.dtype)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.fuse(x.flatten(-2))

    def check_fits(self, model: nn.Module) -> None:
        check_sizes(self.config, hidden_size_of(model.config), model.get_output_embeddings().weight.shape[0])

    # ------------------------------------------------------------------ the maths
    def forward(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """g [B, T, d] from features f [B, T, d] and the next tokens x [B, T] (x_{t+1} beside f_t)."""
        dtype = self.fc.weight.dtype
        x = self.fc(torch.cat([self._embed(tokens).to(dtype), features.to(dtype)], dim=-1))
        pe = self.rotary(x, position_ids)
        return self.layer(
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=pe,
        )

    def projection_weight(self) -> torch.Tensor:
        """[V', d] lm_head rows of the proposal tokens (all rows without a proposal vocabulary)."""
        w = self._lm_head.weight
        return w if self.proposal_ids is None else w[self.proposal_ids.to(w.device)]

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., V'] over the proposal vocabulary; a frozen, once-gathered (packed) map."""
        w = self._lm_head.weight
        key = (w.data_ptr(), w._version, w.dtype, w.device, self.int8)
        if self._proposal_key != key:
            rows = self.projection_weight().detach()
            object.__setattr__(self, "_proj", frozen_projection(rows, packed=True, int8=self.int8))
            self._proposal_key = key
        return self._proj(g.to(w.dtype))

    def set_proposal(self, ids: torch.Tensor | None) -> None:
        """Draft onto the tokens ``ids`` (distinct ids of the vocabulary; None: all of it). A subset of the
        trained proposal tokens is a smaller projection, a cheaper draft, with the drafter's logits over the
        kept tokens, and so their order, unchanged (``pipeline/eagle_tune.py`` measures what it costs)."""
        if ids is None:
            if self.proposal_ids is not None:
                del self.proposal_ids
                self.proposal_ids = None
            object.__setattr__(self, "config", replace(self.config, num_proposal_tokens=None))
            self._proposal_key = None
            return
        ids = torch.sort(ids.to(torch.long).flatten().cpu()).values
        if (
            ids.numel() == 0
            or ids.unique().numel() != ids.numel()
            or not 0 <= int(ids.min()) <= int(ids.max()) < (self.config.vocab_size)
        ):
            raise EagleError(
                f"A proposal vocabulary must be distinct token ids from 0 to {self.config.vocab_size - 1}; "
                "choose them from the head's proposal_ids."
            )
        if self.proposal_ids is None:
            del self.proposal_ids
        self.register_buffer("proposal_ids", ids.to(self.fc.weight.device), persistent=True)
        object.__setattr__(self, "config", replace(self.config, num_proposal_tokens=int(ids.numel())))
        self._proposal_key = None

    def token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.proposal_ids is None else self.proposal_ids[columns]

    # ------------------------------------------------------------------ saving
    def save(self, folder: str | Path, *, dtype: torch.dtype | None = None, **extra) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        cast = lambda v: (  # noqa: E731
            v.detach().to(dtype=dtype if dtype is not None and v.is_floating_point() else v.dtype).contiguous().cpu()
        )
        state = {k: cast(v) for k, v in self.state_dict().items() if not k.startswith("rotary.")}
        tmp = folder / (EAGLE_FILE + ".tmp")
        save_file(state, str(tmp), metadata={"format": "pt"})
        # never a half-written checkpoint
        tmp.replace(folder / EAGLE_FILE)
        meta = {"format": FORMAT, **asdict(self.config), "base_model_name_or_path": self.config.base_model, **extra}
        (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return folder


def new_eagle_head(
    model: nn.Module,
    *,
    proposal_ids: torch.Tensor | None = None,
    base_model: str | None = None,
    tree: DynamicTreeConfig = DynamicTreeConfig(),
    fuse_layers: tuple[int, ...] | None = None,
) -> EagleHead:
    """A fresh (random) EAGLE head for ``model``, in float32 on the CPU."""
    cfg = EagleConfig(
        hidden_size=hidden_size_of(model.config),
        vocab_size=model.get_output_embeddings().weight.shape[0],
        num_proposal_tokens=int(proposal_ids.numel()) if proposal_ids is not None else None,
        base_model=base_model,
        model_type=getattr(model.config, "model_type", None),
        top_k=tree.top_k,
        depth=tree.depth,
        num_nodes=tree.num_nodes,
        fuse_layers=fuse_layers,
    )
    head = EagleHead(model, cfg).float()
    if proposal_ids is not None:
        head.proposal_ids.copy_(proposal_ids)
    return head


def check_sizes(cfg, d: int, V: int) -> None:
    """Refuse an EAGLE head (its config) made for another hidden size ``d`` or vocabulary ``V`` than the model's (or
    its config's, before it loads)."""
    if cfg.hidden_size != d or cfg.vocab_size != V:
        raise EagleError(
            f"This EAGLE head was made for hidden size {cfg.hidden_size} "
            f"and {cfg.vocab_size} tokens, but the model has {d} and {V}; "
            "load an EAGLE head trained for this model"
            f"{f' ({cfg.base_model})' if cfg.base_model else ''}."
        )
