"""Which tree and which lookup-branch length to use with given heads on a given device: one answer
for the page, the ``/compare`` API and the benchmark.

Heads calibrated by ``python -m medusa_lib.pipeline.calibrate`` name their default tree and the
lookup length it was calibrated with (``config.json``: ``default_tree``, ``lookup``; ``lookup: 0``
means calibrated without the branch). A tree is calibrated per *kind* of device and per numerics:
a GPU verifies a big tree for about the cost of one token, a CPU does not, and on a CPU a float32
verify costs more per extra token than a bfloat16 one where bfloat16 is native, so the best tree
differs. The top-level calibration is the first one made (a record without ``device_kind`` was
made on a CPU); the others live in ``calibrations[name]`` with their own ``default_tree`` and
``lookup`` (the name is a label; each record's ``device_kind`` and ``dtype`` say what it is for).
A run takes the record of its device kind and numerics, else one of its device kind (the top-level
first), else the other kind's tree with ``HeadsDefaults.note`` saying so. Heads without any
calibration get a 16-node tree that a CPU verifies cheaply, or a chain as deep as the heads when
they predict fewer than 3 tokens ahead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .config import DEFAULT_LOOKUP
from .tree.presets import get_tree, preset_names

# 16 nodes: cheap enough on a CPU, wide enough to show a tree
FALLBACK_TREE = "topk-4x3x2-16"
# the device kind of a calibration record that names none (the first ones were all made on a CPU)
LEGACY_KIND = "cpu"
KIND_NAMES = {"cpu": "CPU", "cuda": "CUDA"}


@dataclass(frozen=True)
class HeadsDefaults:
    # preset name: the heads' calibrated default, else FALLBACK_TREE, else chain-<depth>
    tree: str
    # the lookup branch's length when it is on
    lookup: int
    # on unless the heads were calibrated without it
    lookup_on: bool
    # the calibration record the tree comes from (its measured figures), None if not calibrated
    calibration: dict | None = None
    # one sentence when that record was made on another kind of device than this one
    note: str | None = None
    # one sentence on where the tree comes from when a machine fit decided it (``machine_fit``): a shipped
    # calibration of this very machine, or this machine's measured costs
    why: str = ""

    @property
    def lookup_length(self) -> int:
        """The branch length a run uses when nobody says otherwise (0 = off)."""
        return self.lookup if self.lookup_on else 0


def device_kind(device: torch.device | str | None = None) -> str:
    """'cpu', 'cuda', ... of a torch.device or a name like 'cuda:0' (None: 'cpu')."""
    return torch.device(device).type if device is not None else "cpu"


def record_kind(record: dict, key: str | None = None) -> str:
    """The device kind a calibration record was made on; a record without one: the kind its ``calibrations``
    name starts with (``key``: "cuda", "cuda-bfloat16"), else LEGACY_KIND (the top level's first records)."""
    return record.get("device_kind") or (key.split("-")[0] if key else LEGACY_KIND)


def machine_key(device: torch.device | str | None, dtype: torch.dtype | str) -> str:
    """The kind of machine a timed choice (EAGLE's node budget) holds for: device kind and numerics,
    and on a CPU with bfloat16 instructions (AVX512-BF16, AMX) "-native-bf16", since there a float32
    verify of many tokens costs much less over a plain step than on an AVX2-only CPU, so the fastest
    tree differs: "cpu-float32", "cpu-float32-native-bf16", "cpu-bfloat16-native-bf16", "cuda-bfloat16"."""
    from .device import cpu_has_native_bf16

    kind = device_kind(device)
    return _machine_key(kind, dtype, kind == "cpu" and cpu_has_native_bf16())


def _machine_key(kind: str, dtype: torch.dtype | str, native_bf16: bool) -> str:
    return f"{kind}-{str(dtype).removeprefix('torch.')}" + ("-native-bf16" if native_bf16 else "")


def sweep_key(sweep: dict) -> str:
    """The ``machine_key`` a recorded tree sweep was timed on: its ``key``, else (the first sweeps, made
    on a CPU before sweeps named one) read from its dtype and the machine line's CPU flags."""
    from .device import native_bf16_in

    if sweep.get("key"):
        return str(sweep["key"])
    return _machine_key("cpu", sweep.get("dtype") or "float32", native_bf16_in(str(sweep.get("machine") or "")))


def swept_tree(meta: dict, key: str) -> tuple[int, int, int] | None:
    """The dynamic tree (top-k, depth, nodes) an EAGLE head's timed sweep chose on machines of ``key``
    (config.json's ``tree_sweeps[key]``, written by ``eagle_tune --write-tree``), None if none did:
    the head's top-level tree holds (the one its top-level ``tree_sweep`` chose)."""
    sweep = (meta.get("tree_sweeps") or {}).get(key)
    try:
        top_k, depth, nodes = (int(x) for x in str(sweep["chosen"]).split(","))
    except (TypeError, KeyError, ValueError):
        return None
    return top_k, depth, nodes


def record_numerics(record: dict) -> str | None:
    """The numerics a calibration record was timed in ('float32', 'bfloat16', ...), None if it says none."""
    dtype = record.get("dtype")
    return str(dtype).removeprefix("torch.") if dtype else None


def calibration_key(record: dict) -> str:
    """The name a calibration goes under in config.json's ``calibrations``: its device kind and numerics."""
    return "-".join(x for x in (record_kind(record), record_numerics(record)) if x)


def calibration_records(heads) -> list[tuple[dict, str | None, int | None]]:
    """(record, default tree, lookup) of every calibration the heads carry, the top-level one first (its
    tree and lookup are config.json's top-level ``default_tree``, ``lookup``)."""
    out = []
    top = getattr(heads, "calibration", None)
    if isinstance(top, dict):
        out.append((top, getattr(heads, "default_tree", None), getattr(heads, "lookup", None)))
    for key, record in (getattr(heads, "calibrations", None) or {}).items():
        # an older record named by its kind only
        if not record.get("device_kind"):
            record = {**record, "device_kind": record_kind(record, key)}
        out.append((record, record.get("default_tree"), record.get("lookup")))
    return out


def heads_defaults(
    heads, device: torch.device | str | None = None, numerics: str | None = None, *, fit=None
) -> HeadsDefaults:
    """The defaults for ``heads`` (a MedusaHeads; calibrations read by ``load_heads``) on ``device``
    (the model's; None = CPU) in ``numerics`` (the model's dtype name, e.g. 'float32'; None = any): the
    calibration made on this very machine (``fit.key``, a ``machine_fit.Fit`` of this device and numerics),
    else the tree ``fit`` chose from this machine's measured costs, else the calibration made on this kind
    of device in these numerics, else on this kind of device, else another kind's (with a ``note``), else
    the uncalibrated fallback."""
    kind = device_kind(device)
    found = calibration_records(heads)
    # the trees a run can name: trees.json's and the presets
    known = set(getattr(heads, "tree_presets", None) or ()) | set(preset_names())
    if fit is not None:
        here = [f for f in found if fit.key.same_as(f[0]) and f[1] in known]
        best = fit.best("medusa")
        if here:
            record, tree, lookup = here[0]
            why = f"Tree {tree} calibrated on this machine ({fit.key.label()}), shipped with the heads."
            return HeadsDefaults(
                tree=tree, lookup=lookup or DEFAULT_LOOKUP, lookup_on=lookup != 0, calibration=record, why=why
            )
        if best is not None and best.candidate.name in known:
            # the figures of this device kind's calibration stay the page's reference, where there is one
            base = heads_defaults(heads, device, numerics)
            lookup = best.candidate.lookup
            return replace(
                base,
                tree=best.candidate.name,
                lookup=lookup or base.lookup,
                lookup_on=lookup != 0,
                note=None,
                why=fit.why("medusa"),
            )
    mine = [f for f in found if record_kind(f[0]) == kind]
    exact = [f for f in mine if numerics and record_numerics(f[0]) == str(numerics).removeprefix("torch.")]
    note = None
    if exact or mine:
        record, calibrated, lookup = (exact or mine)[0]
    elif found:
        # calibrated, but on another kind of device: its tree beats a guess, and the page says whose it is
        record, calibrated, lookup = found[0]
        other = record_kind(record)
        where = record.get("device") or KIND_NAMES.get(other, other)
        note = (
            f"These heads have no tree calibrated on {KIND_NAMES.get(kind, kind)}; "
            f"using the tree calibrated on {where} "
            "(run python -m medusa_lib.pipeline.calibrate --write on this device for one)."
        )
    else:
        # no calibration record: what config.json says at the top level, if anything
        record, calibrated, lookup = None, getattr(heads, "default_tree", None), getattr(heads, "lookup", None)
    if calibrated and calibrated in known:
        tree = calibrated
    else:
        # no tree named, or one trees.json lacks: no calibration applies to the tree we pick
        record = note = None
        tree = FALLBACK_TREE if get_tree(FALLBACK_TREE).depth <= heads.num_heads else f"chain-{min(heads.num_heads, 4)}"
    return HeadsDefaults(
        tree=tree, lookup=lookup or DEFAULT_LOOKUP, lookup_on=lookup != 0, calibration=record, note=note
    )
