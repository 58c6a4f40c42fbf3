"""The class check users can run (``server_check --class N``), played against a live tiny server: every session
served, the table's counts, the answers checked against solo runs, the memory line."""

from __future__ import annotations

import os
import re
from types import SimpleNamespace

import pytest
from conftest import launch, tiny_playground

from medusa_lib.pipeline.class_check import run_class


@pytest.mark.slow  # a live server, 12 sessions and their solo runs: ~11 s on 2 cores
def test_a_small_class_is_served_shared_and_checked_against_solo_runs(capsys):
    demo, url = launch(tiny_playground())
    try:
        args = SimpleNamespace(class_size=6, rounds=2, within=0.5, check_all=False, watchers=3)
        run_class(args, url, os.getpid(), ["w10 w11 w12", "w20 w21"], ["w30 w31", "w40 w41", "w50 w51"])
    finally:
        demo.close()
    out = capsys.readouterr().out
    rows = {
        m.group(1): [int(x) for x in m.groups()[1:]]
        for m in re.finditer(r"^(example|own|all) +(\d+) +(\d+) +(\d+) +(\d+)", out, re.M)
    }
    # sessions, served, refused, errors: 4 examples and 2 own prompts a round, all served
    assert rows["example"] == [4, 4, 0, 0] and rows["own"] == [2, 2, 0, 0] and rows["all"] == [6, 6, 0, 0]
    # the two examples each ran once at most: the other two example sessions shared a run (joined or recorded)
    shared = [tuple(map(int, m.groups())) for m in re.finditer(r"^all .* (\d+) +(\d+) +(\d+)$", out, re.M)]
    assert all(recorded + joined >= 2 for recorded, joined, _ in shared), out
    identical = "answers identical to the same prompt alone (every column's token ids and text, the page's numerics)"
    assert f"{identical}: 6/6" in out
    assert re.search(r"server memory \(RSS\): \d+ MB after 6 requests, \d+ MB after 12 requests", out)
    assert "the last own prompt was complete" in out and "is met" in out
    assert "with 3 page sessions watching it" in out
