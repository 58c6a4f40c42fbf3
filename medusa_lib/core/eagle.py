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

from .defaults import machine_key, swept_tree
from .dynamic_tree import DynamicTreeConfig
from .eagle_run import EagleRun  # noqa: F401  (re-exported: one run of a head)
from .heads import hidden_size_of
from .messages import InputError, cause, is_number, kind, shown
from .packing import (
    can_int8,
    frozen_projection,
    int8_fits,
    int8_linear_weights,
    is_prepacked,
    prepack_linear_weights,
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


def update_eagle_config(folder: str | Path, **fields) -> Path:
    """Set ``fields`` in an EAGLE folder's config.json (a record of how it was measured, its tree, ...),
    the rest kept; written beside it and renamed, never half a file. Returns the config's path."""
    path = Path(folder) / CONFIG_FILE
    cfg = json.loads(path.read_text())
    cfg.update(fields)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cfg, indent=2) + "\n")
    tmp.replace(path)
    return path


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


def is_eagle_folder(folder: str | Path) -> bool:
    return (Path(folder) / EAGLE_FILE).exists()


# whole numbers >= 1
INT_FIELDS = ("hidden_size", "vocab_size", "top_k", "depth", "num_nodes")
TEXT_FIELDS = ("base_model", "model_type")


def read_eagle_config(folder: str | Path) -> EagleConfig:
    """The checked ``EagleConfig`` of an EAGLE folder, without a model: config.json is this project's,
    its sizes are whole numbers, its dynamic tree can be built, and the weights file's header reads.
    One sentence (EagleError) naming the file otherwise."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder).expanduser()
    if not is_eagle_folder(folder):
        raise EagleError(f"No EAGLE head at {str(folder)!r}: give a folder with {EAGLE_FILE} and {CONFIG_FILE}.")
    where = folder / CONFIG_FILE
    try:
        meta = json.loads(where.read_text())
    except (OSError, ValueError, RecursionError) as e:
        # RecursionError: JSON nested past Python's stack
        why = "it is nested too deeply" if isinstance(e, RecursionError) else cause(e, 120)
        raise EagleError(f"{where} cannot be read ({why}); copy the EAGLE head again or train a new one.") from None
    if not isinstance(meta, dict):
        raise EagleError(
            f"{where} holds {kind(meta)}, not an object, so it is not an EAGLE head of this project; "
            "copy the EAGLE head again or train a new one."
        )
    if meta.get("format") != FORMAT:
        raise EagleError(
            f"{where} is not an EAGLE head of this project (format {meta.get('format')!r}, expected {FORMAT!r})."
        )
    for name in INT_FIELDS + ("num_proposal_tokens",):
        value = meta.get(name)
        whole = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        # the others have defaults
        if whole or (value is None and name not in ("hidden_size", "vocab_size")):
            continue
        raise EagleError(
            f"{where} has {name}={shown(value)}; it must be a whole number of at least 1 "
            "(copy the EAGLE head again or train a new one)."
        )
    for name in TEXT_FIELDS:
        if meta.get(name) is not None and not isinstance(meta[name], str):
            raise EagleError(f"{where} has {name}={shown(meta[name])}; it must be text (a name) or left out.")
    fuse = meta.get("fuse_layers")
    if fuse is not None and not (
        isinstance(fuse, list) and fuse and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in fuse)
    ):
        raise EagleError(
            f"{where} has fuse_layers={shown(fuse)}; it must be a list of layer numbers "
            "(copy the EAGLE head again or train a new one)."
        )
    record = meta.get("calibration")
    figures = (
        [record.get(k) for k in ("speedup", "medusa_speedup", "lookup_speedup", "medusa_heads_speedup")]
        if isinstance(record, dict)
        else []
    )
    if record is not None and (not isinstance(record, dict) or not all(v is None or is_number(v) for v in figures)):
        raise EagleError(
            f"{where} has a calibration that is not a record of numbers ({shown(record)}); "
            "measure it again (python -m medusa_lib.pipeline.bench --record-eagle) or delete calibration."
        )
    sweeps = meta.get("tree_sweeps")
    if sweeps is not None and not (isinstance(sweeps, dict) and all(isinstance(v, dict) for v in sweeps.values())):
        raise EagleError(
            f"{where} has tree_sweeps={shown(sweeps)}; it must be an object of sweeps by kind of machine, as "
            "eagle_tune --write-tree writes it: time the trees again or delete tree_sweeps."
        )
    cfg = EagleConfig(**{k: meta[k] for k in EagleConfig.__dataclass_fields__ if k in meta})
    try:
        cfg.tree.check()
    except InputError as e:
        raise EagleError(
            f"{where} holds a dynamic tree that cannot be built ({str(e).rstrip('.')}); "
            "fix its top_k, depth and num_nodes or train a new head."
        ) from None
    try:
        with safe_open(str(folder / EAGLE_FILE), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError) as e:
        raise EagleError(
            f"The EAGLE weights {folder / EAGLE_FILE} are not a readable safetensors file ({cause(e, 120)}); "
            "copy the EAGLE head again or train a new one."
        ) from None
    return cfg


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


def load_eagle(folder: str | Path, *, model: nn.Module, int8: bool | None = None) -> EagleHead:
    """An EAGLE head from ``folder`` (``read_eagle_config``), checked against ``model`` and placed like its
    lm_head; ``int8``: draft in int8 (None: where ``packing.int8_fits`` the model, float32 on a CPU)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder).expanduser()
    cfg = read_eagle_config(folder)
    meta = json.loads((folder / CONFIG_FILE).read_text())
    p = next(model.parameters())
    # the tree a timed sweep chose on machines like this
    swept = swept_tree(meta, machine_key(p.device, p.dtype))
    if swept:
        cfg = replace(cfg, top_k=swept[0], depth=swept[1], num_nodes=swept[2])
        try:
            cfg.tree.check()
        except InputError as e:
            raise EagleError(f"{folder / CONFIG_FILE}, tree_sweeps: {e} Time the trees again (eagle_tune).") from None
    if cfg.model_type and getattr(model.config, "model_type", None) != cfg.model_type:
        raise EagleError(
            f"This EAGLE head has a {cfg.model_type} layer but the model is a {model.config.model_type}; "
            "load an EAGLE head trained for this model."
        )
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    if cfg.fuse_layers and max(cfg.fuse_layers) >= layers:
        raise EagleError(
            f"This EAGLE head fuses layer {max(cfg.fuse_layers)} but the model has {layers} layers; "
            "load an EAGLE head trained for this model."
        )
    head = EagleHead(model, cfg)
    head.check_fits(model)
    try:
        state = load_file(str(folder / EAGLE_FILE))
    except (SafetensorError, OSError) as e:
        # cut short after its header
        raise EagleError(
            f"The EAGLE weights {folder / EAGLE_FILE} are not a readable safetensors file ({cause(e, 120)}); "
            "copy the EAGLE head again or train a new one."
        ) from None
    try:
        head.load_state_dict(state, strict=False)
        missing = [k for k in head.state_dict() if k not in state and not k.startswith("rotary.")]
        if missing:
            raise RuntimeError(f"missing {', '.join(missing[:3])}")
    except RuntimeError as e:
        raise EagleError(f"The EAGLE checkpoint does not fit its own layout: {str(e).splitlines()[0]}") from None
    head.calibration = meta.get("calibration")
    head.folder = Path(folder)
    # which EAGLE it is and what its training measured, one line for the page
    about = meta.get("about")
    head.about = f"This is {cfg.recipe}" + (f": {about}" if isinstance(about, str) and about.strip() else ".")
    head.to(device=model.get_output_embeddings().weight.device, dtype=p.dtype)
    head.requires_grad_(False)
    if is_prepacked(model):
        prepack_linear_weights(head)
    if int8_fits(model) if int8 is None else int8:
        head.use_int8()
    return head.eval()
