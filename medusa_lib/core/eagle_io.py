"""An EAGLE head's folder: reading its config.json and weights, checked, and loading the head beside a model.

``read_eagle_config`` checks a folder without a model (the start-up's file check reads it before the
model loads: config.json is this project's, its sizes whole numbers, its dynamic tree buildable, the
weights' header readable); ``eagle.check_sizes`` holds it against a model's hidden size and vocabulary;
``load_eagle`` builds the head (``eagle.EagleHead``) on the model with the tree a timed sweep chose on
machines like this one, placed and packed like the model's lm_head. ``update_eagle_config`` records
what was measured, written whole or not at all.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from torch import nn

from .defaults import machine_key, swept_tree
from .eagle import CONFIG_FILE, EAGLE_FILE, FORMAT, EagleConfig, EagleError, EagleHead
from .file_checks import Unreadable, read_json
from .messages import InputError, cause, is_number, kind, shown
from .packing import int8_fits, is_prepacked, prepack_linear_weights


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
        meta = read_json(where)
    except Unreadable as why:
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
