"""A calibration written beside its heads: the trees into trees.json, the record into config.json.

The trees are shared by every device and numerics (the calibrated-N trees are named by size, merged
by name); the record (the default tree, the lookup length and the figures, with the device, its kind
and the numerics) goes to the top level of config.json for the first calibration (or the same device
kind and numerics again), else under ``calibrations["<kind>-<numerics>"]``: a GPU's best tree is not
a CPU's, nor float32's bfloat16's (``core/defaults.py`` reads them). ``calibrate.py --write`` calls it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.defaults import KIND_NAMES, calibration_key, record_kind, record_numerics
from ..core.heads import CONFIG_FILE, TREES_FILE
from .jsonl import replace_file


def write_calibration(folder: Path, record: dict, trees: dict[str, list], *, say=print) -> str:
    """Write a calibration beside the heads in ``folder``; return where in config.json it went.

    ``record`` names its ``default_tree``, ``lookup``, ``device_kind`` and ``dtype``. It replaces the
    top-level calibration (and config.json's ``default_tree`` and ``lookup``) when there is none or it
    was made on the same kind of device in the same numerics (a record without a kind was made on a
    CPU); otherwise it replaces the record of its kind and numerics in ``calibrations`` (under
    ``calibration_key``: "cuda-bfloat16", "cpu-float32") and the top-level one stays as it is.
    ``trees`` join trees.json by name; a name whose choices differ from the stored ones takes the new
    choices (said). Each file is replaced whole (written beside it, then renamed), trees.json first,
    so config.json never names a tree trees.json lacks.
    """
    trees_path, config_path = folder / TREES_FILE, folder / CONFIG_FILE
    stored = json.loads(trees_path.read_text()) if trees_path.exists() else {}
    changed = [n for n in trees if n in stored and stored[n] != trees[n]]
    # Smallest first, as the tree menu lists them.
    merged = dict(sorted({**stored, **trees}.items(), key=lambda kv: len(kv[1])))
    cfg = json.loads(config_path.read_text())
    kind, top = record["device_kind"], cfg.get("calibration")

    # this device kind and numerics (a record saying none: any)
    def same(r: dict, key: str | None = None) -> bool:
        return record_kind(r, key) == kind and record_numerics(r) in (None, record_numerics(record))

    # the other calibrations, under any older key too
    others = {k: r for k, r in (cfg.get("calibrations") or {}).items() if not same(r, k)}
    if isinstance(top, dict) and not same(top):
        key = calibration_key(record)
        others[key] = record
        where = f"calibrations.{key} of {CONFIG_FILE}; the top-level {calibration_key(top)} calibration is kept"
    else:
        cfg["default_tree"], cfg["lookup"], cfg["calibration"] = record["default_tree"], record["lookup"], record
        where = f"the top level of {CONFIG_FILE}"
    if others:
        cfg["calibrations"] = others
    else:
        cfg.pop("calibrations", None)
    replace_file(trees_path, json.dumps(merged, indent=None) + "\n")
    replace_file(config_path, json.dumps(cfg, indent=2) + "\n")
    if changed:
        say(
            f"note: {', '.join(changed)} in {TREES_FILE} had other choices from an earlier calibration; "
            "kept this one's "
            "(figures recorded for them on another device were measured with the old ones: recalibrate there too)"
        )
    say(
        f"wrote {trees_path}, default_tree={record['default_tree']} and lookup={record['lookup']} "
        f"({' '.join(x for x in (KIND_NAMES.get(kind, kind), record_numerics(record)) if x)} calibration: {where})"
    )
    return where
