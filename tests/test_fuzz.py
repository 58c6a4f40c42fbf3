"""Property-based fuzzing of the settings boundary and the tree parser (hypothesis, seeded).

Every ``/compare`` parameter gets values of every kind a JSON client can send, and some it cannot
(NaN, lone UTF-16 surrogates, lists nested 1,000 deep): numbers of any size, true/false, null,
text with control characters, JSON-looking text, lists and objects. One parameter is bad at a
time, so the property is exact: each call either runs, or ends in one sentence that names that
parameter; never a traceback, never the 'failed unexpectedly' sentence; and the server still
answers afterwards. ``derandomize=True``: the same examples on every run, so a failure reproduces.
"""

from __future__ import annotations

import json

import gradio as gr
import pytest
from conftest import PROMPT, call_api, launch, tiny_playground
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medusa_lib.core.tree import TreeError, build_tree, parse_choices
from medusa_lib.present import GREEDY_VIEWS, SAMPLED_VIEWS

LIMIT = 12  # max new tokens for the fuzzed server: a valid run stays short
VALID = {
    "prompt": PROMPT,
    "max_new_tokens": 4,
    "temperature": 0.7,
    "epsilon": 0.09,
    "delta": 0.3,
    "tree": "chain-2",
    "custom_tree": "",
    "chat_template": True,
    "lookup_branch": True,
    "sample": True,
    "seed": 0,
    "numerics": "float32",
    "drafter": "",
    "run_live": False,
}
NAMED = {
    "prompt": "prompt",
    "max_new_tokens": "max new tokens",
    "temperature": "temperature",
    "epsilon": "epsilon",
    "delta": "delta",
    "tree": "tree",
    "custom_tree": "tree",
    "chat_template": "chat template",
    "lookup_branch": "lookup branch",
    "sample": "sampling",
    "seed": "seed",
    "numerics": "numerics",
    "drafter": "drafter",
    "run_live": "run live",
}
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Text of every kind: control characters (Cc) and lone surrogates (Cs) included.
anything_text = st.text(st.characters(codec=None, categories=None), max_size=60)
json_like = st.text(st.sampled_from('[]{},:"0123456789-.eE truefalsn\\'), max_size=80)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-3, 20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-3, 3),
    anything_text,
    json_like,
    st.sampled_from(["8", "0.5", "true", "false", "null", "[[0]]", "chain-2", "NaN", "1e308", ""]),
)
nested = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=12,
)
deep_text = st.integers(1, 1500).flatmap(
    lambda n: st.sampled_from(["[" * n + "]" * n, "[" * n + "0" + "]" * n, "[[0]" + ",[0" * n + "]" * n + "]"])
)


def deep_list(n: int) -> list:
    value: list = []
    for _ in range(n):
        value = [value]
    return value


EDGES = [  # sent to every parameter, every run; the random values below come on top
    None,
    True,
    False,
    0,
    -1,
    1,
    10**400,
    -(10**400),
    1e308,
    -1e308,
    5e-324,
    1e-40,
    -0.0,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    " ",
    "8",
    "0.7",
    "true",
    "false",
    "null",
    "NaN",
    "[[0]]",
    "chain-2",
    "abc \ud800 def",
    "\udfff",
    "\x00\x01\x1b[31m\x7f",
    "\u202e\u200b\ufeff",
    "\U0001f980" * 3,
    "t" * 5000,
    "[" * 1000 + "]" * 1000,
    "[" * 900 + "0" + "]" * 900,
    "[[0]" + ",[0" * 999 + "]" * 1000,
    [],
    {},
    [[0], [0, 0]],
    [[0]] * 3,
    [["0"]],
    {"a": [1]},
    deep_list(900),
    deep_list(5000),
    [1.5],
    [[True]],
]
values = st.one_of(
    scalars, nested, nested.map(json.dumps), deep_text, st.integers(1, 1500).map(deep_list), st.sampled_from(EDGES)
)
trees = st.lists(st.lists(st.integers(-1, 11), min_size=1, max_size=5), max_size=12)  # paths, valid and not
tree_texts = st.one_of(trees.map(json.dumps), json_like, deep_text, nested.map(json.dumps), anything_text)


def sendable(value) -> bool:
    """What an HTTP client can write as JSON: Python's encoder overflows on lists nested ~1,000 deep
    (such bodies reach gradio only from other clients, and it answers them with HTTP 400 itself)."""
    try:
        json.dumps(value)
    except RecursionError:
        return False
    return True


def assert_one_sentence_naming(param: str, message) -> None:
    assert isinstance(message, str) and message, (param, message)
    assert "\n" not in message and "Traceback" not in message and message.endswith("."), (param, message)
    assert len(message) <= 600, (param, message)
    assert not message.startswith("The run failed unexpectedly"), (param, message)  # a bug, not a bad input
    assert NAMED[param] in message.lower(), (param, message)


@pytest.fixture(scope="module")
def handlers():
    from ui.handlers import Handlers

    pg = tiny_playground(oracle=False)
    pg.max_new_tokens_limit = LIMIT
    return Handlers(pg)


def runs_or_names(handlers, param: str, value) -> str:
    """One /compare call through the handler with ``param`` set to ``value``: 'ran' or 'refused'."""
    try:
        out = handlers.compare(*{**VALID, param: value}.values())
    except gr.Error as e:
        assert_one_sentence_naming(param, e.message)
        return "refused"
    assert tuple(out["methods"]) == (SAMPLED_VIEWS if out.get("sampling") else GREEDY_VIEWS)
    assert all(1 <= m["tokens"] <= LIMIT for m in out["methods"].values())
    return "ran"


@pytest.mark.parametrize("param", list(VALID))
def test_every_parameter_runs_or_gets_its_sentence(handlers, param):
    outcomes = [runs_or_names(handlers, param, value) for value in EDGES]
    assert "refused" in outcomes

    @settings(FUZZ, max_examples=120)
    @given(value=values)
    def check(value):
        runs_or_names(handlers, param, value)

    check()


@settings(FUZZ, max_examples=400)
@given(text=tree_texts)
def test_the_tree_parser_returns_a_tree_or_one_tree_error(text):
    try:
        choices = parse_choices(text)
        tree = build_tree(choices, num_heads=5)
    except TreeError as e:
        assert_one_sentence_naming("custom_tree", str(e))
    else:
        assert tree.num_nodes == len(choices) + 1 and tree.depth <= 5


@pytest.fixture(scope="module")
def server():
    pg = tiny_playground(oracle=False)
    pg.max_new_tokens_limit = LIMIT
    demo, url = launch(pg)
    try:
        yield url
    finally:
        demo.close()


def test_through_the_server_every_call_runs_or_gets_its_sentence_and_the_server_still_answers(server):
    """Over HTTP as any client sends it (ASCII-escaped JSON, so surrogates and NaN travel too)."""
    seen = {"complete": 0, "error": 0}

    @settings(FUZZ, max_examples=90)
    @given(param=st.sampled_from(list(VALID)), value=values.filter(sendable))
    def check(param, value):
        event, data = call_api(server, "compare", list({**VALID, param: value}.values()))
        seen[event] += 1
        if event == "error":
            assert_one_sentence_naming(param, data)
        else:
            assert event == "complete" and tuple(data["methods"]) == (
                SAMPLED_VIEWS if data.get("sampling") else GREEDY_VIEWS
            ), (param, value, event, data)

    check()
    assert seen["error"] > 30 and seen["complete"] > 3, seen  # both sides of the property were exercised
    assert call_api(server, "compare", list(VALID.values()))[0] == "complete"  # still serving
