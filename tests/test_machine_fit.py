"""The machine fit's arithmetic and cache (core/machine_fit.py): candidates from the shipped figures, the
choice, the key a shipped calibration must match to win, and the cache round trip."""

import json
from pathlib import Path

import pytest

from medusa_lib.core.defaults import calibration_records, heads_defaults
from medusa_lib.core.heads_load import load_heads
from medusa_lib.core.machine_fit import (
    Candidate,
    Fit,
    MachineKey,
    Timed,
    choose,
    eagle_candidates,
    medusa_candidates,
    read_fit,
    write_fit,
)
from medusa_lib.core.tree import preset_names

ROOT = Path(__file__).resolve().parents[1]
HEADS = ROOT / "assets" / "heads" / "smollm2-135m-instruct"
EAGLE = ROOT / "assets" / "heads" / "smollm2-135m-instruct-eagle"
KEY = MachineKey("Some CPU", "avx2", "float32", 2, "dynamic")


def shipped_heads():
    return load_heads(HEADS)


def medusa(name, tokens, gain, lookup=4):
    return Candidate("medusa", name, tokens, lookup, gain, "test")


def test_medusa_candidates_come_from_the_shipped_figures_with_and_without_the_branch():
    heads = shipped_heads()
    known = set(heads.tree_presets) | set(preset_names())
    cands = medusa_candidates(calibration_records(heads), known, "float32")
    by = {(c.name, c.lookup): c for c in cands}
    # the float32 record speaks first for its trees: calibrated-3 simulated 2.08 with the branch, 1.725 without
    assert by[("calibrated-3", 4)].gain == pytest.approx(2.08)
    assert by[("calibrated-3", 0)].gain == pytest.approx(1.725)
    assert by[("calibrated-3", 4)].tokens == 4 + 4 and by[("calibrated-3", 0)].tokens == 4
    # a tree only another record simulated is still offered, with that record's figure
    assert by[("calibrated-32-h200", 4)].gain == pytest.approx(2.674)
    assert "NVIDIA H200" in by[("calibrated-32-h200", 4)].source
    # smallest step first
    assert [c.tokens for c in cands] == sorted(c.tokens for c in cands)


def test_eagle_candidates_take_the_sweep_of_the_same_numerics():
    meta = json.loads((EAGLE / "config.json").read_text())
    bf16 = {c.name: c for c in eagle_candidates(meta, "bfloat16")}
    f32 = {c.name: c for c in eagle_candidates(meta, "float32")}
    assert bf16["8,3,8"].gain == pytest.approx(2.308) and f32["8,3,8"].gain == pytest.approx(2.165)
    assert bf16["8,3,8"].tokens == 9 and bf16["8,4,16"].tokens == 17


def test_choose_takes_the_best_prediction_and_a_bigger_step_must_beat_a_smaller_by_the_tie():
    small, big, bigger = medusa("a", 8, 2.0), medusa("b", 12, 2.2), medusa("c", 20, 2.6)
    rows = [Timed(small, 10.0, 1.0), Timed(big, 10.9, 1.09), Timed(bigger, 16.0, 1.6)]
    # 2.0 vs 2.018 (within 2%): the smaller stays
    assert choose(rows).candidate is small
    rows[1] = Timed(big, 10.5, 1.05)  # 2.095: more than 2% better
    assert choose(rows).candidate is big
    assert choose([]) is None


def test_a_shipped_calibration_of_this_very_machine_wins_else_the_fit_decides():
    heads = shipped_heads()
    f32 = next(r for r, _, _ in calibration_records(heads) if str(r.get("dtype")).endswith("float32"))
    fit = Fit(KEY, 10.0, (Timed(medusa("calibrated-16", 21, 2.5), 13.0, 1.3),), 1.0, "2026-11-29")
    d = heads_defaults(heads, "cpu", "float32", fit=fit)
    assert (d.tree, d.lookup_length) == ("calibrated-16", 4)
    assert "chosen at start-up from this machine's measured costs: 21 tokens for 1.30x a plain step" in d.why
    # the float32 record made on this key: it wins over the measurement
    f32["machine"] = {"device": "Some CPU", "flags": "avx2", "threads": 2, "engine": "dynamic"}
    d = heads_defaults(heads, "cpu", "float32", fit=fit)
    assert d.tree == f32["default_tree"] and "calibrated on this machine" in d.why
    # another engine is another machine
    other = Fit(MachineKey("Some CPU", "avx2", "float32", 2, "static"), 10.0, fit.rows, 1.0, "2026-11-29")
    assert heads_defaults(heads, "cpu", "float32", fit=other).tree == "calibrated-16"
    # a heads-only choice turns the branch off
    alone = Fit(KEY, 10.0, (Timed(medusa("calibrated-8", 9, 2.0, lookup=0), 11.0, 1.1),), 1.0, "2026-11-29")
    f32.pop("machine")
    assert heads_defaults(heads, "cpu", "float32", fit=alone).lookup_length == 0


def test_swept_here_reads_an_eagle_sweeps_machine_line():
    sweep = {"machine": "AMD EPYC, 2 cores, flags: avx2 avx512f avx512_bf16, torch threads 2", "dtype": "bfloat16"}
    assert MachineKey("AMD EPYC", "avx2 avx512f avx512_bf16", "bfloat16", 2, "dynamic").swept_here(sweep)
    assert not MachineKey("AMD EPYC", "avx2", "bfloat16", 2, "dynamic").swept_here(sweep)
    assert not MachineKey("AMD EPYC", "avx2 avx512f avx512_bf16", "float32", 2, "dynamic").swept_here(sweep)
    assert not MachineKey("AMD EPYC", "avx2 avx512f avx512_bf16", "bfloat16", 4, "dynamic").swept_here(sweep)


def test_the_cache_round_trips_per_key_and_a_stale_or_broken_file_is_measured_again(tmp_path):
    fit = Fit(KEY, 10.0, (Timed(medusa("calibrated-5", 10, 2.2), 12.0, 1.2),), 3.5, "2026-11-29", skipped=("x",))
    path = write_fit(fit, tmp_path)
    back = read_fit(KEY, tmp_path)
    assert back.how == "cached" and back.rows == fit.rows and back.skipped == ("x",)
    assert "at an earlier start (2026-11-29)" in back.why()
    # another key: nothing cached
    assert read_fit(MachineKey("Some CPU", "avx2", "bfloat16", 2, "dynamic"), tmp_path) is None
    path.write_text("{ not json")
    assert read_fit(KEY, tmp_path) is None
    data = fit.to_json() | {"version": 0}
    path.write_text(json.dumps(data))
    assert read_fit(KEY, tmp_path) is None


def test_an_unwritable_cache_is_no_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    fit = Fit(KEY, 10.0, (), 0.0, "2026-11-29")
    assert write_fit(fit, blocker / "sub") is None
