"""heads_defaults: one tree and lookup length per device kind, the calibration they come from, and
the note when the heads were calibrated on another kind of device only."""

import pytest
import torch
from conftest import random_heads

from medusa_lib import heads_defaults

CPU = {
    "device": "CPU, 2 threads",
    "dtype": "torch.bfloat16",
    "lookup": 4,
    "trees": {"calibrated-5": {"nodes": 6, "measured_tokens_per_step": 2.3, "speedup": 1.6}},
}  # as shipped: no device_kind
CUDA = {
    "default_tree": "calibrated-12",
    "lookup": 0,
    "device": "NVIDIA H100 80GB HBM3",
    "device_kind": "cuda",
    "dtype": "torch.bfloat16",
    "trees": {"calibrated-12": {"nodes": 13, "measured_tokens_per_step": 2.9, "speedup": 2.4}},
}
TREES = {
    "calibrated-5": [[0], [0, 0], [1], [0, 0, 0], [2]],
    "calibrated-12": [[0], [0, 0], [1], [0, 0, 0], [2], [0, 1], [1, 0], [3], [0, 2], [4], [2, 0], [0, 0, 0, 0]],
}


def calibrated(top: dict | None, *, default_tree=None, lookup=None, others: dict | None = None):
    """Heads as load_heads leaves them: trees.json, config.json's top-level calibration and the other kinds'."""
    heads = random_heads(4)
    heads.tree_presets, heads.calibration, heads.calibrations = dict(TREES), top, dict(others or {})
    heads.default_tree, heads.lookup = default_tree, lookup
    return heads


def test_each_device_kind_gets_its_own_calibration():
    heads = calibrated(CPU, default_tree="calibrated-5", lookup=4, others={"cuda": CUDA})
    for device in (None, "cpu", torch.device("cpu")):  # a record without device_kind was made on a CPU
        d = heads_defaults(heads, device)
        assert (d.tree, d.lookup_length, d.calibration, d.note) == ("calibrated-5", 4, CPU, None)
    for device in ("cuda", "cuda:0", torch.device("cuda", 1)):
        d = heads_defaults(heads, device)
        assert (d.tree, d.lookup_on, d.lookup, d.calibration, d.note) == (
            "calibrated-12",
            False,
            4,
            CUDA,
            None,
        )  # calibrated without the branch: off, 4 when ticked


def test_a_device_kind_without_a_calibration_borrows_the_other_and_says_so():
    d = heads_defaults(calibrated(CPU, default_tree="calibrated-5", lookup=4), "cuda:0")
    assert (d.tree, d.lookup_length, d.calibration) == ("calibrated-5", 4, CPU)
    assert d.note == (
        "These heads have no tree calibrated on CUDA; using the tree calibrated on CPU, 2 threads "
        "(run python -m medusa_lib.pipeline.calibrate --write on this device for one)."
    )
    d = heads_defaults(calibrated(CUDA, default_tree="calibrated-12", lookup=0), "cpu")  # calibrated on a GPU first
    assert (d.tree, d.lookup_length, d.calibration) == ("calibrated-12", 0, CUDA)
    assert d.note.startswith(
        "These heads have no tree calibrated on CPU; using the tree calibrated on NVIDIA H100 80GB HBM3 (run "
    )
    assert heads_defaults(calibrated(CUDA, default_tree="calibrated-12", lookup=0), "cuda").note is None


def test_no_calibration_is_todays_fallback_without_a_note():
    for device in ("cpu", "cuda"):
        d = heads_defaults(calibrated(None), device)
        assert (d.tree, d.lookup_length, d.calibration, d.note) == ("topk-4x3x2-16", 4, None, None)
        d = heads_defaults(
            calibrated(None, default_tree="chain-2", lookup=0), device
        )  # a default named in config.json without figures
        assert (d.tree, d.lookup_length, d.calibration, d.note) == ("chain-2", 0, None, None)


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_a_calibrated_tree_the_heads_lack_is_not_quoted(kind):
    heads = calibrated(
        CPU, default_tree="calibrated-64", lookup=4, others={"cuda": {**CUDA, "default_tree": "calibrated-64"}}
    )  # trees.json lost it
    d = heads_defaults(heads, kind)
    assert (d.tree, d.lookup_length, d.calibration, d.note) == ("topk-4x3x2-16", 4 if kind == "cpu" else 0, None, None)
    d = heads_defaults(
        calibrated(CPU, default_tree="calibrated-64", lookup=4), "cuda"
    )  # borrowed, but lost: no note about a tree not used
    assert (d.tree, d.calibration, d.note) == ("topk-4x3x2-16", None, None)


def test_each_numerics_gets_its_own_calibration_on_a_device_kind():
    """A float32 calibration beside the bfloat16 one: a float32 run takes it, a bfloat16 run the other;
    numerics without a record of their own take the device kind's first (the top level), without a note."""
    cpu32 = {
        **CPU,
        "default_tree": "calibrated-12",
        "lookup": 0,
        "device_kind": "cpu",
        "dtype": "torch.float32",
    }
    heads = calibrated(CPU, default_tree="calibrated-5", lookup=4, others={"cpu-float32": cpu32, "cuda": CUDA})
    for numerics, want in [
        ("float32", ("calibrated-12", 0, cpu32)),
        ("torch.float32", ("calibrated-12", 0, cpu32)),
        ("bfloat16", ("calibrated-5", 4, CPU)),
        ("float16", ("calibrated-5", 4, CPU)),
        (None, ("calibrated-5", 4, CPU)),
    ]:
        d = heads_defaults(heads, "cpu", numerics)
        assert (d.tree, d.lookup_length, d.calibration, d.note) == (*want, None), numerics
    d = heads_defaults(heads, "cuda", "float32")  # the GPU's own kind, in other numerics: still its tree
    assert (d.tree, d.calibration, d.note) == ("calibrated-12", CUDA, None)


def test_a_record_named_by_its_kind_alone_is_that_kinds():
    """An older calibrations entry keyed "cuda" whose record names no device_kind is a CUDA one, not a CPU one."""
    untyped = {k: v for k, v in CUDA.items() if k != "device_kind"}
    heads = calibrated(CPU, default_tree="calibrated-5", lookup=4, others={"cuda": untyped})
    d = heads_defaults(heads, "cuda", "bfloat16")
    assert (d.tree, d.note, d.calibration["device_kind"]) == ("calibrated-12", None, "cuda")
    assert heads_defaults(heads, "cpu").tree == "calibrated-5"


def test_the_shipped_heads_carry_a_gpus_own_calibration_beside_the_cpus():
    """The default heads on a GPU run the tree an H200 chose by measurement (calibrate --device cuda),
    not the CPU's; the trees it timed sit in trees.json under their own names, so the CPU's trees of
    the same size, which its records timed, stay as they were."""
    from medusa_lib.core.heads_load import load_heads
    from medusa_lib.present.drafter_files import SHIPPED_HEADS

    heads = load_heads(SHIPPED_HEADS)
    gpu = heads_defaults(heads, "cuda", "bfloat16")
    assert gpu.tree == "calibrated-32-h200" and gpu.lookup == 4 and gpu.note is None
    assert gpu.calibration["device"] == "NVIDIA H200" and gpu.calibration["device_kind"] == "cuda"
    assert set(gpu.calibration["trees"]) <= set(heads.tree_presets)  # every tree it timed is there by name
    assert len(heads.tree_presets["calibrated-32-h200"]) == 32
    assert heads.tree_presets["calibrated-32-h200"] != heads.tree_presets["calibrated-32"]
    assert heads_defaults(heads, "cuda", "float32").tree == "calibrated-32-h200"  # the GPU's, in either numerics
    assert heads_defaults(heads, "cpu", "float32").tree == "calibrated-3"
    assert heads_defaults(heads, "cpu", "bfloat16").tree == "calibrated-5"
