"""Where a run stops: every decoder stops exactly where plain greedy decoding stops.

A Medusa step commits several tokens at once; they are cut to the new-token budget and the
context first, then at the first EOS inside that cut (issue #17: a step used to look for EOS
before cutting, so a run could end one or more tokens past Max new tokens or the context).
The grid runs float32 tiny models with heads rigged to accept 3-4 tokens per step.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from conftest import PROMPT as TEXT
from conftest import OracleHeads, make_model, tiny_playground

from medusa_lib import DecodeConfig, get_tree
from medusa_lib.core.compose import run_method
from medusa_lib.present import Settings

PROMPT = [1, 17, 33, 250, 99, 4, 61]
N_REF = 24
BUDGETS = range(1, 15)
TREE = get_tree("mc_sim_7b_63")  # depth 4: up to 5 tokens a step


@pytest.fixture(scope="module")
def rigged():
    """A float32 tiny Llama, its greedy continuation (no EOS) and heads that foresee it."""
    model = make_model("llama")
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    ref = run_method(model, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=N_REF, stop_on_eos=False)).tokens
    heads = OracleHeads(model, PROMPT + ref + [0] * 8)
    return model, ref, heads


def configure(model, *, eos: int | None, context: int | None) -> None:
    """Make ``eos`` the model's EOS id and cap its context at ``context`` tokens (None: 512); decoders read
    both afresh."""
    model.generation_config.eos_token_id = eos
    model.config.max_position_embeddings = context or 512


def expected(ref: list[int], *, budget: int, eos_at: int | None, room: int) -> tuple[list[int], str]:
    """Plain greedy's answer: the first of (EOS, budget, context) to be reached decides."""
    n = min(budget, room)
    if eos_at is not None and eos_at < n:
        return ref[: eos_at + 1], "eos"
    return ref[:n], "length" if budget <= room else "context"


DECODERS = [  # (method, lookup branch length): typical acceptance at T=0 is greedy matching
    ("plain", 0),
    ("medusa-greedy", 0),
    ("medusa-greedy", 4),
    ("medusa-typical", 0),
    ("medusa-typical", 4),
]


def first_occurrences(ref: list[int]) -> list[int]:
    """Positions whose token appears there for the first time (an EOS id stops at its first use)."""
    return [j for j, t in enumerate(ref) if ref.index(t) == j]


def test_the_grid_really_takes_multi_token_steps(rigged):
    model, ref, heads = rigged
    configure(model, eos=None, context=None)
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=heads,
        tree=TREE,
        config=DecodeConfig(max_new_tokens=N_REF, stop_on_eos=False),
    )
    assert res.tokens == ref
    assert max(s.accept_length for s in res.steps) >= 3  # steps of 4+ tokens: a cut inside one is exercised


@pytest.mark.parametrize("method, lookup", DECODERS, ids=[f"{m}-lookup{k}" for m, k in DECODERS])
def test_every_decoder_stops_where_plain_greedy_stops(rigged, method, lookup):
    """Budgets 1-14 x EOS at 0-8 tokens in (or none) x context room 3, 6, 10 tokens (or the full 512).

    Near the context a Medusa step falls back to a root-only step (its tree must fit), so it is the
    budget and EOS that cut multi-token steps here; the context rows check the fallback stops right."""
    model, ref, heads = rigged
    eos_positions = [None] + [j for j in first_occurrences(ref) if j <= 8]
    assert len(eos_positions) >= 5
    try:
        for eos_at, room in itertools.product(eos_positions, [None, 3, 6, 10]):
            configure(
                model, eos=None if eos_at is None else ref[eos_at], context=None if room is None else len(PROMPT) + room
            )
            for budget in BUDGETS:
                want, reason = expected(ref, budget=budget, eos_at=eos_at, room=room or 10**6)
                cfg = DecodeConfig(max_new_tokens=budget, lookup=lookup)
                res = run_method(model, PROMPT, method=method, heads=heads, tree=TREE, config=cfg)
                where = f"budget={budget} eos_at={eos_at} room={room}"
                assert res.tokens == want, where
                assert res.finish_reason == reason, where
                for s in res.steps[1:]:  # the records agree with the cut
                    assert s.accept_length + 1 == len(s.tokens) and 0 <= s.lookup_accepted <= s.accept_length, where
                    assert s.lookup_accepted in (0, s.accept_length), where  # a lookup path is all lookup tokens
    finally:
        configure(model, eos=None, context=None)


def test_sampled_typical_never_overshoots_the_budget_eos_or_context(rigged):
    """Typical acceptance at T > 0 writes its own text, but it stops by the same rules."""
    model, ref, heads = rigged
    tokens_seen = set()
    try:
        for eos_at, room, seed in itertools.product([None, 2, 5], [None, 4, 9], range(3)):
            eos = None if eos_at is None else ref[eos_at]
            configure(model, eos=eos, context=None if room is None else len(PROMPT) + room)
            for budget in (1, 3, 7, 12):
                cfg = DecodeConfig(max_new_tokens=budget, temperature=1.0, seed=seed, sample_root=True, lookup=4)
                res = run_method(model, PROMPT, method="medusa-typical", heads=heads, tree=TREE, config=cfg)
                toks = res.tokens
                tokens_seen.update(toks)
                where = f"budget={budget} eos={eos} room={room} seed={seed}"
                assert 1 <= len(toks) <= min(budget, room or budget), where
                if eos is not None and eos in toks:
                    assert toks.index(eos) == len(toks) - 1 and res.finish_reason == "eos", where
                else:
                    assert res.finish_reason == ("length" if len(toks) == budget else "context"), where
    finally:
        configure(model, eos=None, context=None)
    assert len(tokens_seen) > 5  # sampling really ran (not a single repeated token)


def test_a_step_whose_eos_lies_past_the_budget_stops_at_the_budget(rigged):
    """The case the issue found: the budget ends inside a step whose EOS comes one token later."""
    model, ref, heads = rigged
    eos_at = next(j for j in first_occurrences(ref) if j >= 3)
    try:
        configure(model, eos=ref[eos_at], context=None)
        res = run_method(
            model, PROMPT, method="medusa-greedy", heads=heads, tree=TREE, config=DecodeConfig(max_new_tokens=eos_at)
        )
        assert res.tokens == ref[:eos_at] and res.finish_reason == "length"
        assert res.steps[-1].accept_length + 1 == len(res.steps[-1].tokens)  # the cut step's record counts what it kept
    finally:
        configure(model, eos=None, context=None)


def test_the_playground_badge_stays_green_when_eos_follows_the_budget():
    """The issue's report through the playground: EOS right after the budget. Every method must
    write exactly the budget, and the greedy check must say equal (it said 'differs from token 48 on')."""
    pg = tiny_playground(max_new_tokens=40)
    settings = Settings(max_new_tokens=40, tree="mc_sim_7b_63", lookup=4)
    ref = pg.compare(TEXT, settings)["methods"]["plain"]["token_ids"]
    budget = next(
        j for j, t in enumerate(ref) if ref.index(t) == j and j >= 12
    )  # EOS will be the token right after the budget
    pg.model.generation_config.eos_token_id = ref[budget]
    try:
        out = pg.compare(TEXT, replace(settings, max_new_tokens=budget))
    finally:
        pg.model.generation_config.eos_token_id = None
    for m in ("plain", "medusa-greedy", "medusa-typical"):
        assert out["methods"][m]["tokens"] <= budget, m
    assert out["methods"]["medusa-greedy"]["token_ids"] == out["methods"]["plain"]["token_ids"] == ref[:budget]
    assert out["methods"]["medusa-greedy"]["finish_reason"] == "length"
    assert (
        out["greedy_match"]["equal"] and max(row["tokens/step"] for row in out["summary"]) > 2
    )  # multi-token steps happened
