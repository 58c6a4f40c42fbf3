"""pipeline/page_check: the page's own path at its starting values over many prompts (tiny random model, no network)."""

from __future__ import annotations

import json

from conftest import PROMPT, tiny_playground

from medusa_lib.pipeline.page_check import check, format_summary, page_prompts, summarize


def test_page_prompts_take_the_first_of_each_category_and_the_examples(tmp_path):
    bench = tmp_path / "bench.jsonl"
    bench.write_text(
        "".join(
            json.dumps({"id": f"{c}-{i}", "category": c, "prompt": f"{c} {i}"}) + "\n"
            for c in ("a", "b")
            for i in range(3)
        )
    )
    examples = tmp_path / "examples.json"
    examples.write_text(json.dumps([{"label": "One", "prompt": "first example"}]))
    assert page_prompts(bench=bench, examples=examples, per_category=1) == [
        ("a-0", "a 0"),
        ("b-0", "b 0"),
        ("example-1", "first example"),
    ]
    assert len(page_prompts(bench=bench, examples=None)) == 6


def test_every_badge_is_green_in_float32_and_the_rows_come_as_they_are_measured():
    pg = tiny_playground()
    seen = []
    rows = check(
        pg,
        [("p1", PROMPT), ("p2", "w17 w40 w8")],
        modes=("greedy", "sampling"),
        numerics=("float32",),
        max_new_tokens=8,
        on_row=lambda rs: seen.append(len(rs)),
    )
    assert seen == [1, 2, 3, 4]  # one callback per compare, prompt by prompt, both modes of a prompt together
    assert [(r["id"], r["mode"]) for r in rows] == [
        ("p1", "greedy"),
        ("p1", "sampling"),
        ("p2", "greedy"),
        ("p2", "sampling"),
    ]
    assert all(r["equal"] and r["numerics"] == "float32" and r["plain_tps"] > 0 for r in rows)
    summary = summarize(rows)
    assert [(s["mode"], s["green"], s["prompts"], s["differs"]) for s in summary] == [
        ("greedy", 2, 2, []),
        ("sampling", 2, 2, []),
    ]
    assert all(s["medusa_speedup"] > 0 and s["typical_speedup"] > 0 for s in summary)
    table = format_summary(summary, setup="tiny")
    assert table.splitlines()[0] == "tiny" and "greedy    float32       2 / 2" in table and "differs" not in table
