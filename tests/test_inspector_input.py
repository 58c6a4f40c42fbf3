"""The step inspector's slider, sent by any client (the page's events go through the queue too): NaN, infinity
and text show a step instead of failing with no message, and the queue's door refuses a non-finite number in one
sentence before any handler runs."""

from __future__ import annotations

import math

import pytest
from conftest import page_start, tiny_playground


@pytest.fixture(scope="module")
def run():
    from ui.handlers import RUN_OUTPUTS, Handlers

    pg = tiny_playground()
    h = Handlers(pg)
    outs = list(h.run(*page_start(max_new_tokens=24, numerics=None)))
    return pg, h, outs[-1][RUN_OUTPUTS.index("session")]


@pytest.mark.parametrize("step", [math.nan, math.inf, -math.inf, "3", None, 1e300])
def test_the_inspector_shows_a_step_for_any_slider_value(run, step):
    pg, h, records = run
    tree, mask, table = h.inspector(records, "Medusa greedy / exact sampling", step)
    assert "step" in tree.layout.title.text and len(table) > 0, tree.layout.title.text


def test_the_queue_s_door_refuses_nan_for_the_inspector_s_slider_in_one_sentence(run):
    from ui import build_demo
    from ui.door import not_a_number

    pg, h, records = run
    demo = build_demo(pg, max_new_tokens=16)
    fn = next(f for f in demo.fns.values() if f.api_name == "inspector")
    label = fn.inputs[2].label
    assert not_a_number(fn, [None, "Medusa greedy / exact sampling", math.nan]) == (
        f"{label} must be a whole number from 1 to 2 (got NaN)."
    )
    assert not_a_number(fn, [None, "Medusa greedy / exact sampling", 2]) is None
