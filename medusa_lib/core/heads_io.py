"""Medusa heads checkpoint files: finding and reading every public format and ours, writing ours.

Checkpoint formats read by ``heads_load.load_heads``:
1. heads-only ``medusa_lm_head.pt`` (or ``.safetensors``) + ``config.json`` with
   ``medusa_num_heads``/``medusa_num_layers``; keys ``{i}.{j}.linear.*`` and ``{i}.{L}.weight``;
2. a full model whose state dict also holds ``medusa_head.{i}...`` keys;
3. ResBlock-only ``medusa_lm_head.safetensors`` (keys ``{i}.{j}.linear.*`` only, shared lm_head);
4. vLLM's Medusa layout (``blocks.{i}.layers.{j}.*``, ``lm_heads.*``, ``token_map``): ``vllm_format.py``.
Ours is format 3 (or 1, with own projections) plus ``proposal_ids`` for a pruned vocabulary,
``root.{i}.weight`` for the root projections of root-conditioned heads and ``path.{i}.{j}.weight``
for the branch projections P^(i+1, j+1) of path-conditioned heads.
The tensors decide the number of heads and layers; the config may understate them.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from .config import MAX_LOOKUP, is_lookup_length
from .file_checks import Unreadable, read_json
from .messages import HeadsError, is_number, shown
from .messages import kind as kind_of
from .tree.shape import TreeError, validate_choices
from .vllm_format import read_vllm_medusa

# our own format: safetensors + config.json
HEADS_FILE = "medusa_lm_head.safetensors"
CONFIG_FILE = "config.json"
# trees calibrated for these heads, {name: choices}
TREES_FILE = "trees.json"


def save_heads(
    heads: nn.Module, folder: str | Path, *, base_model: str | None = None, dtype: torch.dtype | None = None, **extra
) -> Path:
    """``MedusaHeads.save``: ``medusa_lm_head.safetensors`` + ``config.json`` (read back by ``load_heads``)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def cast(v: torch.Tensor) -> torch.Tensor:
        keep = dtype is None or not v.is_floating_point()
        return v.detach().to(dtype=v.dtype if keep else dtype).contiguous().cpu()

    state = {f"{k}": cast(v) for k, v in heads.heads.state_dict().items()}
    if heads.root is not None:
        state.update({f"root.{k}": cast(v) for k, v in heads.root.state_dict().items()})
    if heads.path is not None:
        state.update({f"path.{k}": cast(v) for k, v in heads.path.state_dict().items()})
    if heads.proposal_ids is not None:
        state["proposal_ids"] = heads.proposal_ids.cpu()
    cfg = asdict(heads.config)
    meta = {
        "medusa_num_heads": cfg["num_heads"],
        "medusa_num_layers": cfg["num_layers"],
        "base_model_name_or_path": base_model or cfg["base_model"],
        "hidden_size": cfg["hidden_size"],
        "vocab_size": cfg["vocab_size"],
        "shared_lm_head": cfg["shared_lm_head"],
        "num_proposal_tokens": cfg["num_proposal_tokens"],
        "root_conditioned": cfg["root_conditioned"],
        "path_conditioned": cfg["path_conditioned"],
        "format": "medusa-playground-1",
        **extra,
    }
    tmp = folder / (HEADS_FILE + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    # never leave a half-written checkpoint
    tmp.replace(folder / HEADS_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return folder


def _read_tensors(path: Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of one file whose key starts with ``prefix`` (prefix stripped)."""
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return {k[len(prefix) :]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
        except SafetensorError as e:
            # truncated or not a safetensors file at all
            first = (str(e).strip().splitlines() or ["damaged"])[0][:200]
            raise HeadsError(
                f"The heads file {path} is not a readable safetensors file ({first}); "
                "copy the heads again or train new ones."
            ) from None
    try:
        # never unpickle arbitrary code
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise HeadsError(
            f"{path.name} is not a plain tensor checkpoint and is not loaded, for safety ({type(e).__name__}); "
            "save the heads as a state dict of tensors."
        ) from None
    if not isinstance(obj, dict):
        raise HeadsError(f"{path.name} does not hold a state dict.")
    return {k[len(prefix) :]: v for k, v in obj.items() if k.startswith(prefix)}


def _full_model_head_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """``medusa_head.*`` tensors of a full-model checkpoint (single file or sharded)."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index_file = folder / index_name
        if index_file.exists():
            weight_map = json.loads(index_file.read_text())["weight_map"]
            shards = sorted({v for k, v in weight_map.items() if k.startswith("medusa_head.")})
            out: dict[str, torch.Tensor] = {}
            for shard in shards:
                out.update(_read_tensors(folder / shard, "medusa_head."))
            return out
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).exists():
            return _read_tensors(folder / name, "medusa_head.")
    return {}


def _resolve_folder(name_or_path: str | Path, *, local_only: bool) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        return path.parent
    name = str(name_or_path)
    if local_only or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise HeadsError(
            f"No Medusa heads found at {name!r}: give a folder with medusa_lm_head.* and config.json, "
            "or a Hub id like FasterDecoding/medusa-vicuna-7b-v1.3."
        )
    # a Hub id: fetch only the files that can hold heads
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                name,
                allow_patterns=[
                    "config.json",
                    "medusa_lm_head.*",
                    "*.safetensors",
                    "*.safetensors.index.json",
                    "pytorch_model*.bin",
                    "pytorch_model.bin.index.json",
                ],
            )
        )
    except Exception as e:
        # offline, unknown repo, gated repo ...
        raise HeadsError(
            f"Could not fetch Medusa heads {name!r} from the Hugging Face Hub ({type(e).__name__}); "
            "check the id and your connection, or give a local folder."
        ) from None


def read_trees(path: Path, *, num_heads: int) -> dict[str, list[list[int]]]:
    """A heads folder's trees.json, {name: choices}, every tree one these heads can verify; else one sentence."""
    fix = "calibrate again (python -m medusa_lib.pipeline.calibrate --write) or delete it"
    try:
        trees = read_json(path)
    except Unreadable as why:
        raise HeadsError(f"{path} cannot be read ({why}); {fix}.") from None
    if not isinstance(trees, dict):
        raise HeadsError(
            f'{path} holds {kind_of(trees)}, not an object of named trees like {{"t": [[0], [1]]}}; {fix}.'
        )
    for name, choices in trees.items():
        try:
            if not isinstance(choices, list):
                raise TreeError(f"it is {kind_of(choices)}, not a list of paths")
            validate_choices(choices, num_heads=num_heads)
        except TreeError as e:
            raise HeadsError(
                f"{path} has a tree {shown(name)} these heads cannot verify ({str(e).rstrip('.')}); {fix}."
            )
    return trees


def check_record(record, *, where: str, name: str) -> dict | None:
    """A calibration record as the lab reads it: an object whose ``accuracy`` (if any) is one row of
    numbers per head; else one sentence naming the file."""
    if record is None:
        return None
    accuracy = record.get("accuracy") if isinstance(record, dict) else None
    rows_ok = accuracy is None or (
        isinstance(accuracy, list) and all(isinstance(r, list) and all(map(is_number, r)) for r in accuracy)
    )
    if not isinstance(record, dict) or not rows_ok:
        what = f"{name}.accuracy={shown(accuracy)}" if isinstance(record, dict) else f"{name}={shown(record)}"
        raise HeadsError(
            f"{where} has {what}, but a calibration is an object whose accuracy is a list of numbers per head; "
            f"recalibrate (python -m medusa_lib.pipeline.calibrate --write) or delete {name}."
        )
    return record


def device_calibrations(value, *, where: str) -> dict[str, dict]:
    """config.json's ``calibrations``: name -> calibration record (``default_tree`` and ``lookup``
    included), one per device kind and numerics the heads were calibrated in besides the top-level one
    (named "cuda-bfloat16", "cpu-float32"; the first ones were named by the device kind alone)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise HeadsError(
            f"{where} has calibrations={value!r}; it must map a device kind and numerics (cuda-bfloat16) "
            "to a calibration record, or be left out."
        )
    for kind, record in value.items():
        if not isinstance(record, dict):
            raise HeadsError(
                f"{where} has a {kind!r} calibration that is not a record; recalibrate on that device or delete "
                f"calibrations.{kind}."
            )
        check_record(record, where=where, name=f"calibrations.{kind}")
        tree, lookup = record.get("default_tree"), record.get("lookup")
        if not isinstance(tree, str) or not tree:
            raise HeadsError(
                f"{where} has a {kind!r} calibration without a default_tree name; "
                f"recalibrate on that device or delete calibrations.{kind}."
            )
        if lookup is not None and not is_lookup_length(lookup):
            raise HeadsError(
                f"{where} has a {kind!r} calibration with lookup={lookup!r}; it must be a whole number from 0 (no "
                f"lookup branch) to {MAX_LOOKUP}."
            )
    return dict(value)


def read_checkpoint(
    name_or_path: str | Path, *, local_only: bool = False
) -> tuple[Path, dict[str, torch.Tensor], dict]:
    """The folder of a heads checkpoint (local, or fetched from the Hub), its head tensors in the reference
    layout, and its config.json, in any of the three public formats or ours."""
    folder = _resolve_folder(name_or_path, local_only=local_only)
    config_path = folder / CONFIG_FILE
    try:
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
    except RecursionError:
        # JSON nested past Python's stack
        raise HeadsError(
            f"{config_path} cannot be read (it is nested too deeply); copy the heads again or train new ones."
        ) from None
    if not isinstance(config, dict):
        raise HeadsError(
            f"{config_path} holds {kind_of(config)}, not an object of settings; copy the heads again or train new ones."
        )
    state: dict[str, torch.Tensor] = {}
    for name in ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "medusa_lm_head.bin"):
        if (folder / name).exists():
            state = _read_tensors(folder / name)
            break
    else:
        state = _full_model_head_tensors(folder)
    # vLLM's layout, what pipeline.export writes
    if not state and config.get("model_type") == "medusa":
        state, config = read_vllm_medusa(folder)
    if not state:
        raise HeadsError(f"{folder} holds no Medusa heads (no medusa_lm_head.* file and no medusa_head.* tensors).")
    return folder, state, config


def read_settings(heads: nn.Module, folder: Path, config: dict) -> None:
    """What the folder says beside the tensors, set on ``heads``: its calibrated trees (trees.json), the
    default tree, lookup length and calibrations of config.json; and the conditioning the tensors must have."""
    if (folder / TREES_FILE).exists():
        heads.tree_presets = read_trees(folder / TREES_FILE, num_heads=heads.num_heads)
    # where they came from (the page's export command names it)
    heads.folder = folder
    heads.default_tree = config.get("default_tree")
    if heads.default_tree is not None and not isinstance(heads.default_tree, str):
        raise HeadsError(
            f"{folder}/config.json has default_tree={shown(heads.default_tree)}; it must be the name of a tree "
            "(text) or left out."
        )
    heads.calibration = check_record(config.get("calibration"), where=f"{folder}/config.json", name="calibration")
    heads.lookup = config.get("lookup")
    if heads.lookup is not None and not is_lookup_length(heads.lookup):
        raise HeadsError(
            f"{folder}/config.json has lookup={heads.lookup!r}; it must be a whole number from 0 (no lookup branch) to "
            f"{MAX_LOOKUP}."
        )
    heads.calibrations = device_calibrations(config.get("calibrations"), where=f"{folder}/config.json")
    for kind in ("root", "path"):
        if config.get(f"{kind}_conditioned") and not getattr(heads, f"{kind}_conditioned"):
            raise HeadsError(
                f"{folder}/config.json says the heads are {kind}-conditioned, but the checkpoint holds no {kind}.* "
                "tensors; the checkpoint is incomplete."
            )
