"""The start-up machine fit on a Playground (present/fit.py): it times the shipped trees here, makes the fastest
by prediction the default of the page, /compare and the Tree lab, caches it per machine key, and a shipped
calibration made on this very machine wins without timing anything."""

import pytest
from conftest import PROMPT, tiny_playground

from medusa_lib.core.machine_fit import this_machine
from medusa_lib.present import fit as fit_module
from medusa_lib.present.fit import fit_playground
from medusa_lib.present.lab import tree_lab

TREES = {
    # nodes (root included), tokens/step simulated with a 2-token lookup branch and without it
    "chain-1": (2, 1.9, 1.5),
    "chain-2": (3, 2.3, 1.9),
    "chain-3": (4, 2.5, 2.2),
    "topk-2x2": (7, 2.6, 2.3),
}


def calibrated(pg, *, machine: dict | None = None):
    """``pg``'s heads with a float32 calibration of TREES (default chain-1), made on ``machine`` if given."""
    record = {
        "dtype": "torch.float32",
        "device_kind": "cpu",
        "lookup": 2,
        "default_tree": "chain-1",
        "trees": {
            name: {"nodes": n, "simulated_tokens_per_step": w, "heads_only_simulated_tokens_per_step": wo}
            for name, (n, w, wo) in TREES.items()
        },
    }
    if machine is not None:
        record["machine"] = machine
    heads = pg.heads
    heads.calibration, heads.default_tree, heads.lookup, heads.tree_presets = record, "chain-1", 2, {}
    pg.defaults = pg.defaults_for(None)
    return pg


def test_the_fit_times_the_trees_here_and_its_choice_is_what_runs(tmp_path):
    pg = calibrated(tiny_playground())
    assert pg.defaults.tree == "chain-1" and pg.defaults.why == ""
    said = []
    fits = fit_playground(pg, "auto", folder=tmp_path, say=said.append)
    fit = fits["float32"]
    assert fit.how == "measured" and fit.plain_ms > 0 and fit.rows
    best = fit.best("medusa")
    # the page's default is the fit's choice, and says why
    assert (pg.defaults.tree, pg.defaults.lookup_length) == (best.candidate.name, best.candidate.lookup)
    assert "chosen at start-up from this machine's measured costs" in pg.defaults.why
    assert any("Machine fit (float32): timing" in s for s in said)
    # every row's prediction is its shipped gain over its measured cost
    for r in fit.rows:
        assert r.predicted == pytest.approx(r.candidate.gain / r.cost)
        assert r.cost > 0
    # the page's starting values and a run that names no tree take it
    assert pg.starting_request().tree == best.candidate.name
    out = pg.compare(PROMPT, pg.settings_of({"max_new_tokens": 12, "temperature": 0.0}))
    assert out["tree"].startswith(best.candidate.name) and out["greedy_match"]["equal"] is True
    # the Tree lab's cost curve is the start-up measurement
    lab = tree_lab(pg)
    assert lab.cost.source == "start-up" and "timed at start-up" in lab.cost_note
    assert list(tmp_path.glob("*.json"))


def test_a_later_start_reads_the_cached_fit_and_times_nothing(tmp_path, monkeypatch):
    first = fit_playground(calibrated(tiny_playground()), "auto", folder=tmp_path)["float32"]

    def no_timing(*a, **kw):
        raise AssertionError("a cached fit is not measured again")

    monkeypatch.setattr(fit_module, "measure", no_timing)
    pg = calibrated(tiny_playground())
    again = fit_playground(pg, "auto", folder=tmp_path)["float32"]
    assert again.how == "cached" and again.rows == first.rows
    assert pg.defaults.tree == first.best("medusa").candidate.name
    assert "at an earlier start" in pg.defaults.why
    # "again" measures anew
    with pytest.raises(AssertionError, match="not measured again"):
        fit_playground(calibrated(tiny_playground()), "again", folder=tmp_path)


def test_a_calibration_made_on_this_machine_wins_and_nothing_is_timed(tmp_path, monkeypatch):
    key = this_machine("cpu", "float32", "dynamic")
    here = {"device": key.device, "flags": key.flags, "threads": key.threads, "engine": key.engine}
    monkeypatch.setattr(fit_module, "measure", lambda *a, **kw: pytest.fail("nothing to time"))
    pg = calibrated(tiny_playground(), machine=here)
    fit_playground(pg, "auto", folder=tmp_path)
    assert pg.defaults.tree == "chain-1" and "calibrated on this machine" in pg.defaults.why
    # another machine's calibration does not
    monkeypatch.undo()
    pg = calibrated(tiny_playground(), machine={**here, "threads": here["threads"] + 7})
    fit_playground(pg, "auto", folder=tmp_path)
    assert pg.fits["float32"].rows


def test_off_keeps_the_shipped_choice(tmp_path):
    pg = calibrated(tiny_playground())
    assert fit_playground(pg, "off", folder=tmp_path) == {}
    assert pg.defaults.tree == "chain-1" and not list(tmp_path.iterdir())
