"""A compiled engine built between runs (present/compiling.py, ui/background.py), proven on a CPU with
--cache static --capture compile: runs start at once on the dynamic cache, a run that arrives while the programs
are built is served without waiting for them all, the compiled engine is swapped in between runs, and the tokens
are the same before and after."""

import time

import pytest
import torch

from medusa_lib.present import Playground
from ui.background import compile_between_runs
from ui.live import DeviceTurn

pytestmark = pytest.mark.slow
PROMPT = "w10 w11 w12 w13"


def greedy(pg) -> dict:
    """Token ids per column of a greedy comparison, and whether Medusa greedy equalled plain greedy."""
    out = pg.compare(PROMPT, pg.settings_of({"max_new_tokens": 16, "temperature": 0.0}))
    return {"ids": {m: r["token_ids"] for m, r in out["methods"].items()}, "equal": out["greedy_match"]["equal"]}


def test_runs_start_on_the_dynamic_cache_and_the_compiled_engine_is_swapped_in_between_runs(model_folder):
    pg = Playground.load(
        model=str(model_folder),
        heads=None,
        device="cpu",
        dtype="float32",
        cache="static",
        capture="compile",
        compile_in_background=True,
        numerics_copy=False,
    )
    pending = pg.pending
    assert pg.cache == "dynamic" and pg.static_kv is None and pending is not None and pending.total >= 2
    assert pending.status().startswith(f"compiling 1 of {pending.total} step programs; runs use the dynamic KV cache")
    before = greedy(pg)

    said = []
    device = DeviceTurn()
    t0 = time.perf_counter()
    thread = compile_between_runs(pg, device, say=said.append)
    # a run that arrives now runs at once, on the engine that needs no compiling
    during = device.call(greedy, pg)
    waited = time.perf_counter() - t0
    assert pending.left == pending.total and pg.cache == "dynamic", "no program was built before the run"
    assert during == before and before["equal"]
    thread.join(timeout=600)
    assert not thread.is_alive() and pending.swapped and pg.pending is None
    assert pg.cache == "static" and pg.static_kv.capture == "compile" and "compiled by Inductor" in pg.engine
    assert any(s.startswith("Engine: static KV cache, each whole decode step compiled by Inductor") for s in said)
    # no compile inside a run: every program was built before the swap
    torch._dynamo.config.error_on_recompile = True
    try:
        after = device.call(greedy, pg)
    finally:
        torch._dynamo.config.error_on_recompile = False
    assert after == before
    assert waited < pending.seconds, "the first run did not wait for the compiles"
