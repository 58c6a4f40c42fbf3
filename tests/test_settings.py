"""The settings boundary: every bad input to /compare and to the page's Run gets its one sentence.

The table of cases is docs/bad-input.md's (a test keeps the two the same); the server keeps serving
after each, and the page keeps the previous run's results. Tiny random models, no network.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pytest
from conftest import (
    API_DEFAULTS,
    API_ORDER,
    LIMIT,
    PROMPT,
    api_args,
    call_api,
    page_start,
    status_text,
    tiny_playground,
)

ROOT = Path(__file__).resolve().parents[1]


TOO_DEEP = "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]"


TOO_BIG = json.dumps(
    [[a] for a in range(10)]
    + [[a, b] for a in range(10) for b in range(10)]
    + [[0, b, c] for b in range(10) for c in range(10)]
)


CASES = [
    ("empty prompt", "", {}, "The prompt is empty; type a question or pick an example."),
    ("whitespace prompt", " \n\t ", {}, "The prompt is empty; type a question or pick an example."),
    ("1 MB paste", "x" * 1_000_000, {}, "The prompt has 1,000,000 characters; the limit is 32,000: shorten it."),
    (
        "prompt longer than the context",
        " ".join(["w10"] * 600),
        {},
        "The prompt has 602 tokens but the model's context holds 512; shorten the prompt.",
    ),
    (
        "max new tokens 0",
        PROMPT,
        {"max_new_tokens": 0},
        f"Max new tokens must be a whole number from 1 to {LIMIT} (got 0).",
    ),
    (
        "max new tokens too large",
        PROMPT,
        {"max_new_tokens": 5000},
        f"Max new tokens must be a whole number from 1 to {LIMIT} (got 5000).",
    ),
    (
        "max new tokens not whole",
        PROMPT,
        {"max_new_tokens": 2.5},
        f"Max new tokens must be a whole number from 1 to {LIMIT} (got 2.5).",
    ),
    ("negative temperature", PROMPT, {"temperature": -0.5}, "Temperature must be between 0 and 2 (got -0.5)."),
    (
        "temperature too small for float32 (1e-46 rounds to 0)",
        PROMPT,
        {"temperature": 1e-46},
        "Temperature must be 0 (greedy) or between 1e-30 and 2 (got 1e-46).",
    ),
    ("epsilon out of range", PROMPT, {"epsilon": 1.5}, "Epsilon must be between 0 and 1 (got 1.5)."),
    ("delta out of range", PROMPT, {"delta": -0.1}, "Delta must be between 0 and 1 (got -0.1)."),
    (
        "tree: not JSON",
        PROMPT,
        {"custom_tree": "[[0], [0, 1"},
        "The tree text is not valid JSON (Expecting ',' delimiter); write it like [[0], [0, 0], [1]].",
    ),
    (
        "tree: not a list",
        PROMPT,
        {"custom_tree": '{"a": 1}'},
        "The tree text must be a JSON list of nodes, like [[0], [0, 0], [1]].",
    ),
    (
        "tree deeper than the heads",
        PROMPT,
        {"custom_tree": TOO_DEEP},
        "The tree is 5 levels deep but the heads only predict 4 tokens ahead; use a tree of depth <= 4.",
    ),
    (
        "tree rank >= 10",
        PROMPT,
        {"custom_tree": "[[0], [10]]"},
        "Tree node [10] uses rank 10, but ranks must be between 0 and 9 (top-10 per head).",
    ),
    (
        "tree node without parent",
        PROMPT,
        {"custom_tree": "[[1], [0, 0]]"},
        "Tree node [0, 0] has no parent: add [0] to the tree.",
    ),
    (
        "tree too large",
        PROMPT,
        {"custom_tree": TOO_BIG},
        "The custom tree has 210 nodes; the limit is 128: remove some nodes.",
    ),
    (
        "tree nested 1,000 deep",
        PROMPT,
        {"custom_tree": "[" * 1000 + "]" * 1000},
        "The tree text is nested too deeply; write it as a flat list of paths like [[0], [0, 0], [1]].",
    ),
    (
        "tree nested 900 deep",
        PROMPT,
        {"custom_tree": "[" * 900 + "0" + "]" * 900},
        "The tree text is nested too deeply; write it as a flat list of paths like [[0], [0, 0], [1]].",
    ),
    ("tree nested 3 deep", PROMPT, {"custom_tree": "[[[0]]]"}, "Tree node [[0]] must contain whole-number ranks only."),
    (
        "lone surrogate in the prompt",
        "abc \ud800 def",
        {},
        "The prompt has an invalid character at position 5 (U+D800, half of a UTF-16 pair); "
        "delete it or paste the text again.",
    ),
    (
        "max new tokens true",
        PROMPT,
        {"max_new_tokens": True},
        f"Max new tokens must be a whole number from 1 to {LIMIT}: send a number, not true/false (got true).",
    ),
    (
        "max new tokens as text",
        PROMPT,
        {"max_new_tokens": "8"},
        f"Max new tokens must be a whole number from 1 to {LIMIT}: send a number, not text (got '8').",
    ),
    (
        "max new tokens 1e308",
        PROMPT,
        {"max_new_tokens": 1e308},
        f"Max new tokens must be a whole number from 1 to {LIMIT} (got 1e+308).",
    ),
    (
        "temperature as text",
        PROMPT,
        {"temperature": "0.7"},
        "Temperature must be between 0 and 2: send a number, not text (got '0.7').",
    ),
    (
        "chat template as text",
        PROMPT,
        {"chat_template": "false"},
        "The chat template switch (chat_template) must be true or false, not text (got 'false').",
    ),
    (
        "lookup branch as a number",
        PROMPT,
        {"lookup_branch": 1},
        "The lookup branch switch (lookup_branch) must be true or false, not a number (got 1).",
    ),
    (
        "tree preset not text",
        PROMPT,
        {"tree": 5},
        "The tree preset must be the name of a preset, not a number (got 5).",
    ),
    ("seed negative", PROMPT, {"seed": -1}, "The seed must be a whole number from 0 to 9223372036854775807 (got -1)."),
    (
        "seed not whole",
        PROMPT,
        {"seed": 1.5},
        "The seed must be a whole number from 0 to 9223372036854775807 (got 1.5).",
    ),
    (
        "seed as text",
        PROMPT,
        {"seed": "7"},
        "The seed must be a whole number from 0 to 9223372036854775807: send a number, not text (got '7').",
    ),
    (
        "sampling switch as text",
        PROMPT,
        {"sample": "yes"},
        "The sampling switch (sample) must be true or false, not text (got 'yes').",
    ),
    (
        "sampling at temperature 0",
        PROMPT,
        {"sample": True, "temperature": 0},
        "Sampling needs a temperature above 0 (at 0 every method is greedy); raise Temperature or turn sampling off.",
    ),
    (
        "preset name of 5,000 characters",
        PROMPT,
        {"tree": "t" * 5000},
        "Unknown tree preset 'ttttttttttttttttt...tttttttttttttttttt'; choose one of: {presets}.",
    ),
    ("numerics not loaded", PROMPT, {"numerics": "float64"}, "Numerics must be one of: float32 (got 'float64')."),
    (
        "numerics not text",
        PROMPT,
        {"numerics": 16},
        "Numerics must be the name of one of: float32, not a number (got 16).",
    ),
    (
        "drafter not known",
        PROMPT,
        {"drafter": "EAGLE"},
        'The drafter must be "medusa", "eagle", "lookup" or "rest" (got \'EAGLE\').',
    ),
    (
        "drafter not text",
        PROMPT,
        {"drafter": 3},
        'The drafter must be "medusa", "eagle", "lookup" or "rest", not a number (got 3).',
    ),
    (
        'drafter "eagle" on a server without an EAGLE head',
        PROMPT,
        {"drafter": "eagle"},
        'This server has no EAGLE head for its model, so the drafter must be "medusa" or "lookup" (or left empty).',
    ),
    ("epsilon just over 1", PROMPT, {"epsilon": 1.0000001}, "Epsilon must be between 0 and 1 (got 1.0000001)."),
    (
        "delta as an object",
        PROMPT,
        {"delta": {"a": 1}},
        'Delta must be between 0 and 1: send a number, not an object (got {{"a": 1}}).',
    ),
    (
        "tree node of true",
        PROMPT,
        {"custom_tree": "[[true]]"},
        "Tree node [true] must contain whole-number ranks only.",
    ),
    (
        "tree node of 1e400",
        PROMPT,
        {"custom_tree": "[[1e400]]"},
        "Tree node [Infinity] must contain whole-number ranks only.",
    ),
]


DOCS = ROOT / "docs" / "bad-input.md"


TABLE_START, TABLE_END = (
    "<!-- table from tests/test_settings.py CASES: start -->",
    "<!-- table from tests/test_settings.py CASES: end -->",
)


def cases_table() -> str:
    rows = ["| Input | Message (page: status line + warning; `/compare`: the error) |", "|---|---|"]
    rows += [f"| {case} | {msg.format(presets='(the presets)').replace('|', '&#124;')} |" for case, _, _, msg in CASES]
    return "\n".join(rows)


def test_the_docs_table_of_bad_inputs_is_the_tests_table():
    """docs/bad-input.md shows exactly the cases tested below; UPDATE_DOCS=1 rewrites it from them."""
    assert len({c for c, *_ in CASES}) == len(CASES)
    text = DOCS.read_text(encoding="utf-8")
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    want = f"{head}{TABLE_START}\n{cases_table()}\n{TABLE_END}{tail}"
    if os.environ.get("UPDATE_DOCS") == "1":
        DOCS.write_text(want, encoding="utf-8")
    assert text == want, (
        "docs/bad-input.md is out of date: run UPDATE_DOCS=1 pytest tests/test_settings.py -k docs_table"
    )


@pytest.mark.parametrize("case, prompt, overrides, message", CASES, ids=[c[0] for c in CASES])
def test_api_bad_input_gets_its_sentence_and_the_server_keeps_serving(served, case, prompt, overrides, message):
    pg, url, client = served
    assert call_api(url, "compare", api_args(prompt, overrides)) == (
        "error",
        message.format(presets=", ".join(pg.tree_names())),
    )
    assert client.predict(PROMPT, 2, api_name="/compare")["methods"]["plain"]["tokens"] == 2


def test_api_odd_types_get_a_sentence(served):
    from gradio_client.exceptions import AppError

    pg, _, client = served
    for args, message in [
        ((42,), "The prompt must be text, not a number."),
        (([PROMPT],), "The prompt must be text, not a list."),
        (
            (PROMPT, 8, 0.7, 0.09, 0.3, "no-such-tree"),
            f"Unknown tree preset 'no-such-tree'; choose one of: {', '.join(pg.tree_names())}.",
        ),
    ]:
        with pytest.raises(AppError) as err:
            client.predict(*args, api_name="/compare")
        assert str(err.value) == message
    out = client.predict(
        PROMPT, 4, 0.7, 0.09, 0.3, "chain-2", [[0], [0, 0]], api_name="/compare"
    )  # the paths as JSON, not text: accepted
    assert out["tree"] == "custom"


def test_ui_handler_shows_each_sentence_keeps_the_previous_results_and_the_next_run_works():
    import gradio as gr

    from ui.handlers import RUN_OUTPUTS, Handlers

    pg = tiny_playground(oracle=False)
    pg.max_new_tokens_limit = LIMIT
    h = Handlers(pg)
    status = RUN_OUTPUTS.index("status")
    first = list(h.run(*page_start(max_new_tokens=4, numerics=None)))
    assert first[-1][status].startswith("Done")
    for case, prompt, overrides, message in CASES:
        if "sample" in overrides:  # the page's switch is the Mode choice (its own case below)
            continue
        message = message.format(presets=", ".join(pg.tree_names()))
        a = {**API_DEFAULTS, **overrides}
        with pytest.warns(UserWarning) as warned:  # gr.Warning outside a request is a Python warning
            outs = list(
                h.run(
                    prompt,
                    *(a[k] for k in API_ORDER if k not in ("sample", "drafter")),
                    "Medusa greedy / exact sampling",
                    drafter=a["drafter"],
                )
            )
        assert status_text(outs[-1][status]) == f"**Cannot run:** {message}", (
            case
        )  # escaped for the Markdown: shows as typed
        assert html.unescape(str(warned[-1].message)) == message, (
            case
        )  # the toast renders HTML: the message comes escaped
        for out in outs:  # only the status line changes: the previous run's columns, summary and replay stay
            assert all(v == gr.skip() for i, v in enumerate(out) if i != status), case
    with pytest.warns(UserWarning) as warned:
        outs = list(h.run(*page_start(max_new_tokens=4, numerics=None), "both"))
    assert str(warned[-1].message) == "The mode must be 'greedy' or 'sampling' (got 'both')."
    assert all(v == gr.skip() for out in outs for i, v in enumerate(out) if i != status)
    outs = list(h.run(*page_start(max_new_tokens=4, numerics=None), run_live=True))
    sessions = [o[RUN_OUTPUTS.index("session")] for o in outs if o[RUN_OUTPUTS.index("session")] != gr.skip()]
    assert sessions[0] is None  # a run that starts clears the session: no half-run is kept for replay
    assert outs[-1][status].startswith("Done") and set(outs[-1][RUN_OUTPUTS.index("session")]) == {
        "plain",
        "medusa-greedy",
        "medusa-typical",
    }  # the default mode: greedy, typical at T
    outs = list(h.run(*page_start(max_new_tokens=4, numerics=None), "sampling"))
    assert set(outs[-1][RUN_OUTPUTS.index("session")]) == {
        "plain-sample",
        "medusa-sample",
        "medusa-typical",
    }  # the sampling mode: all three at T


def test_a_null_or_empty_tree_or_numerics_means_the_default():
    """What the API's description and docs/serving.md say: null or "" = the default; any other value must name one
    (a number is refused)."""
    pg = tiny_playground(oracle=False)
    for empty in (None, ""):
        s = pg.settings_of({"max_new_tokens": 8, "tree": empty, "numerics": empty, "drafter": empty})
        assert (s.tree, s.numerics, s.drafter) == (pg.defaults.tree, None, None)
        pg.prepare(PROMPT, s)  # runs on the heads' default tree, the default numerics and drafter
    assert pg.pair(pg.settings_of({"tree": None})) == pg.variants[pg.default_numerics]


def test_one_request_names_the_settings_and_holds_their_defaults():
    """``Request`` is the one list of what a caller may name, in /compare's order, and the one place of its
    defaults: ``Settings`` takes them under the same names; a name left out means what the page starts on."""
    from dataclasses import fields, replace

    from medusa_lib.present import Settings
    from medusa_lib.present.settings import REQUEST_NAMES, Request

    assert list(REQUEST_NAMES) == API_ORDER
    shared = {f.name for f in fields(Settings)} & set(REQUEST_NAMES)
    assert shared == set(REQUEST_NAMES) - {"lookup_branch"}  # the switch becomes Settings.lookup, a length
    assert all(getattr(Settings(), name) == getattr(Request(), name) for name in shared - {"tree"})
    pg = tiny_playground(oracle=False)
    start = pg.starting_request()
    assert (start.tree, start.lookup_branch, start.numerics, start.drafter) == (
        pg.defaults.tree,
        pg.defaults.lookup_on,
        pg.default_numerics,
        pg.drafters.default,
    )
    assert (
        replace(pg.settings_of(start), numerics=None, drafter=None) == pg.settings_of({}) == pg.settings_of(Request())
    )
    assert pg.starting_request(10**6).max_new_tokens == pg.max_new_tokens_limit
    with pytest.raises(ValueError, match=r"^Unknown setting 'epsilonn'; the settings are: max_new_tokens, temperature"):
        pg.settings_of({"epsilonn": 0.1})


def test_the_page_and_compare_start_from_the_playground_s_starting_request():
    """The page's components start at ``starting_request``'s values and /compare documents them as its defaults."""
    import inspect

    from ui import build_demo

    pg = tiny_playground(oracle=False)
    start = pg.starting_request(16)
    demo = build_demo(pg, max_new_tokens=16)
    props = [c["props"] for c in demo.config["components"] if "props" in c]
    by_id = {p["elem_id"]: p.get("value") for p in props if p.get("elem_id")}
    by_label = {p.get("label"): p.get("value") for p in props}
    assert {k: by_id[k] for k in ("max-new-tokens", "temperature", "seed", "tree-preset", "custom-tree")} == {
        "max-new-tokens": start.max_new_tokens,
        "temperature": start.temperature,
        "seed": start.seed,
        "tree-preset": start.tree,
        "custom-tree": start.custom_tree,
    }
    assert (by_id["lookup-branch"], by_id["numerics"], by_id["drafter"], by_id["mode"]) == (
        start.lookup_branch,
        start.numerics,
        start.drafter,
        "greedy",
    )
    assert (by_label["\u03b5 epsilon"], by_label["\u03b4 delta"], by_label["Use the chat template"]) == (
        start.epsilon,
        start.delta,
        start.chat_template,
    )
    compare = next(f.fn for f in demo.fns.values() if f.api_name == "compare")
    defaults = {k: p.default for k, p in inspect.signature(compare).parameters.items() if k != "prompt"}
    assert defaults == {**{name: getattr(start, name) for name in API_ORDER}, "run_live": False}


def test_a_bad_value_is_quoted_as_the_json_it_came_in():
    """Issue #26: 1.0000001 was quoted as 1, [[true]] as [True], 1e400 as inf, {"a": 1} as {'a': 1}."""
    from medusa_lib.core.messages import shown

    cases = [
        (1.0000001, "1.0000001"),
        (1e308, "1e+308"),
        (2.5, "2.5"),
        (float("inf"), "Infinity"),
        (float("nan"), "NaN"),
        (None, "null"),
        (True, "true"),
        ([True], "[true]"),
        ([float("inf")], "[Infinity]"),
        ({"a": 1}, '{"a": 1}'),
        (["a", None], '["a", null]'),
        ("8", "'8'"),
        (list(range(9)), "[0, 1, 2, 3, 4, 5, ...]"),
        ([[[[[0]]]]], "[[[[...]]]]"),
        (10**40000, "about 1e+40000"),
    ]
    assert [shown(v) for v, _ in cases] == [want for _, want in cases]
    assert shown("t" * 5000) == "'ttttttttttttttttt...tttttttttttttttttt'" and len(shown([["x" * 99] * 9])) <= 50


def test_an_exception_inside_a_sentence_is_its_type_and_first_line():
    from medusa_lib.core.messages import cause

    assert cause(RuntimeError("out of memory.\nTried to allocate 2 GiB")) == "RuntimeError: out of memory"
    assert cause(OSError("  ")) == "OSError"  # no text: the type alone, not "OSError: OSError"
    assert cause(ValueError("x" * 300), 120) == "ValueError: " + "x" * 120
