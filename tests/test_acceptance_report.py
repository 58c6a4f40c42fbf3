"""Acceptance as serving engines report it (core/spec_metrics.py): exact numbers on hand-made steps, the
bench's table and JSON, real runs' step records, and what the Tree lab's presenter returns."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import PROMPT, make_model, tiny_playground

from medusa_lib.core.compose import run_method
from medusa_lib.core.config import DecodeConfig
from medusa_lib.core.drafters import LookupDrafter
from medusa_lib.core.spec_metrics import Acceptance, acceptance, format_rates, step_acceptance, step_lists
from medusa_lib.core.steps import Step
from medusa_lib.pipeline.bench_report import acceptance_by_method, acceptance_table, method_acceptance, report

# Six full steps: the third drafted nothing (a lookup step without a match); the others drafted 3 deep.
ACCEPTED = [0, 2, 0, 3, 1, 2]
DEPTHS = [3, 3, 0, 3, 3, 3]
DRAFTED = [3, 3, 0, 3, 3, 3]


def test_the_definitions_are_vllms_on_hand_made_steps():
    a = acceptance(ACCEPTED, DEPTHS, DRAFTED)
    # drafts: 5 (the root-only step is no draft); accepted 0 + 2 + 3 + 1 + 2 = 8 over them
    assert (a.steps, a.drafts, a.accepted, a.drafted, a.accepted_at) == (6, 5, 8, 15, (4, 3, 1))
    assert a.mean_acceptance_length == 1 + 8 / 5 == 2.6
    assert a.rates == (4 / 5, 3 / 5, 1 / 5)  # #{a >= i} / drafts
    assert a.given_previous == (4 / 5, 3 / 4, 1 / 3)  # #{a >= i} / #{a >= i - 1}
    assert a.mean_acceptance_length == pytest.approx(1 + sum(a.rates))  # 1 + the sum of the per-position rates
    assert a.draft_acceptance_rate == 8 / 15 and a.drafted_share == 5 / 6 and a.depth == 3
    assert a.as_dict() == {
        "steps": 6,
        "drafts": 5,
        "accepted_tokens": 8,
        "draft_tokens": 15,
        "accepted_tokens_per_position": [4, 3, 1],
        "mean_acceptance_length": 2.6,
        "acceptance_rate_per_position": [0.8, 0.6, 0.2],
        "acceptance_rate_given_previous": [0.8, 0.75, 0.3333],
        "draft_acceptance_rate": 0.5333,
    }


def test_what_vllms_counters_would_hold_for_the_same_drafts():
    # vLLM's SpecDecodingStats.observe_draft(num_draft_tokens, num_accepted_tokens) per draft
    num_drafts, num_draft_tokens, num_accepted, per_pos = 0, 0, 0, [0, 0, 0]
    for acc, depth, drafted in zip(ACCEPTED, DEPTHS, DRAFTED):
        if drafted:  # vLLM's scheduler observes only the requests that drafted
            num_drafts, num_draft_tokens, num_accepted = num_drafts + 1, num_draft_tokens + drafted, num_accepted + acc
            for i in range(acc):
                per_pos[i] += 1
    a = acceptance(ACCEPTED, DEPTHS, DRAFTED)
    assert a.mean_acceptance_length == 1 + num_accepted / num_drafts  # "Mean acceptance length"
    assert list(a.rates) == [n / num_drafts for n in per_pos]  # "Per-position acceptance rate"
    assert a.draft_acceptance_rate == num_accepted / num_draft_tokens  # "Avg Draft acceptance rate"


def test_without_draft_depths_every_step_is_a_draft_as_sglang_counts():
    a = acceptance([0, 2, 0, 3])
    assert (a.drafts, a.accepted, a.drafted, a.accepted_at) == (4, 5, None, (2, 2, 1))
    assert a.mean_acceptance_length == 2.25 and a.draft_acceptance_rate is None
    assert acceptance([1, 0], depth=4).rates == (0.5, 0.0, 0.0, 0.0)  # positions never accepted still show
    assert acceptance([3], [3], depth=1).depth == 3  # never fewer positions than a draft reached


def test_no_draft_reports_no_rate_and_bad_lists_are_refused():
    a = acceptance([0, 0], [0, 0], [0, 0])
    assert a.drafts == 0 and a.mean_acceptance_length is None and a.rates == () and a.given_previous == ()
    assert acceptance([2, 0], [2, 2]).given_previous == (0.5, 1.0)
    assert acceptance([0, 0], [2, 2]).given_previous == (0.0, None)  # no draft reached position 1
    assert format_rates((0.5, None, 1 / 3)) == "0.50 / - / 0.33"
    with pytest.raises(ValueError, match="one number per step"):
        acceptance([1, 2], [2])
    with pytest.raises(ValueError, match="between 0 and its draft's depth"):
        acceptance([1], [0])  # a step without a draft accepts no drafted token


def test_only_full_decode_steps_count():
    def step(i, n, *, depth=2, reason=None):
        return Step(i, tuple(range(n + 1)), 0.1, accept_length=n, finish_reason=reason, draft_depth=depth)

    steps = [step(0, 0, depth=0), step(1, 2), step(2, 0, depth=0), step(3, 1), step(4, 0, reason="length")]
    assert step_lists(steps) == {"accept_lengths": [2, 0, 1], "draft_depths": [2, 0, 2], "draft_tokens": [0, 0, 0]}
    a = step_acceptance(steps)
    assert (a.steps, a.drafts, a.accepted, a.accepted_at) == (3, 2, 3, (2, 1)) and a.mean_acceptance_length == 2.5


# ------------------------------------------------------------------ the bench
def record(method, accepted=None, depths=None, drafted=None, *, new_tokens, steps, id="p1", positions=None):
    r = {
        "method": method,
        "id": id,
        "category": "c",
        "output_token_ids": list(range(new_tokens)),
        "new_tokens": new_tokens,
        "steps": steps,
        "prefill_seconds": 0.1,
        "decode_seconds": 1.0,
    }
    if accepted is not None:
        r["accept_lengths"] = accepted
    if depths is not None:
        r |= {"draft_depths": depths, "draft_tokens": drafted}
    if positions is not None:
        r["draft_positions"] = positions
    return r


RECORDS = [
    record("baseline", [0] * 8, [0] * 8, [0] * 8, new_tokens=10, steps=9),
    record("hf-prompt-lookup", new_tokens=10, steps=4),
    # the prefill's token, 6 full steps (14 tokens) and a last step of 1: 16 tokens in 7 steps
    # a drafter that can reach position 4 though no draft went past 3: position 4 is reported (0.00), as vLLM's
    record("lookup-greedy", ACCEPTED, DEPTHS, DRAFTED, new_tokens=16, steps=7, positions=4),
    # two prompts: their steps add up
    record("medusa-greedy", [1, 0], [2, 2], [4, 4], new_tokens=5, steps=3),
    record("medusa-greedy", [2], [2], [4], new_tokens=4, steps=2, id="p2"),
]
METHODS = ["baseline", "hf-prompt-lookup", "lookup-greedy", "medusa-greedy"]


def test_the_bench_table_reports_every_drafter_and_keeps_tokens_per_step():
    lines = acceptance_table(RECORDS, METHODS)
    assert lines[1].startswith("acceptance as vLLM reports it, over the full decode steps that drafted")
    header = ["method", "tok/step", "drafted", "mean", "acc", "len", "acc/drafted", "@1", "@2", "@3", "@4"]
    assert lines[2].split() == header
    rows = [line.split() for line in lines[3:]]
    assert rows == [
        ["lookup-greedy", "2.29", "0.83", "2.60", "0.53", "0.80", "0.60", "0.20", "0.00"],
        ["given", "the", "one", "before", "0.80", "0.75", "0.33", "0.00"],
        ["medusa-greedy", "1.80", "1.00", "2.00", "0.25", "0.67", "0.33", "-", "-"],  # depth 2: no third position
        ["given", "the", "one", "before", "0.67", "0.50", "-", "-"],
    ]
    assert all(len(line) <= 120 for line in lines)
    assert "\n".join(lines) in report(RECORDS, METHODS)  # the bench prints it among its tables


def test_the_bench_json_holds_the_counts_and_rates_per_drafter():
    out = acceptance_by_method(RECORDS, METHODS)
    assert list(out) == ["lookup-greedy", "medusa-greedy"]  # plain decoding and model.generate record none
    assert out["lookup-greedy"] == acceptance(ACCEPTED, DEPTHS, DRAFTED, depth=4).as_dict()
    assert out["lookup-greedy"]["acceptance_rate_per_position"] == [0.8, 0.6, 0.2, 0.0]
    assert out["medusa-greedy"] == {
        "steps": 3,
        "drafts": 3,
        "accepted_tokens": 3,
        "draft_tokens": 12,
        "accepted_tokens_per_position": [2, 1],
        "mean_acceptance_length": 2.0,
        "acceptance_rate_per_position": [0.6667, 0.3333],
        "acceptance_rate_given_previous": [0.6667, 0.5],
        "draft_acceptance_rate": 0.25,
    }
    # a JSON written before the depths were recorded: every full step counts as a draft
    old = [record("eagle-greedy", [0, 2, 0, 3], new_tokens=9, steps=5)]
    assert method_acceptance(old, "eagle-greedy") == Acceptance(4, 4, 5, None, (2, 2, 1))


# ------------------------------------------------------------------ real runs: what the steps record
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_lookup_run_records_which_steps_drafted(cache):
    loop = [1, 17, 33, 250, 99, 4, 61, 17, 33, 250, 99, 4, 61, 17, 33]
    cfg = DecodeConfig(max_new_tokens=32, stop_on_eos=False, cache=cache)
    run = run_method(make_model("llama"), loop, method="medusa-greedy", config=cfg, drafter=LookupDrafter(4))
    full = [s for s in run.steps[1:] if s.finish_reason is None]
    a = step_acceptance(run.steps)
    assert a.steps == len(full) and a.depth <= 4 and a.drafts > 0
    assert sum(len(s.tokens) for s in full) == a.steps + sum(s.accept_length for s in full)
    assert all(s.draft_tokens == s.draft_depth for s in full)  # a chain: one token per position
    if cache == "dynamic":  # no match: a root-only step, no draft (as vLLM's n-gram proposer drafts nothing)
        assert all(s.accept_length == 0 for s in full if s.draft_depth == 0)
        assert a.drafts == sum(s.draft_depth > 0 for s in full)
    else:  # a static step verifies its whole chain, past a short match too: every step drafts
        assert a.drafts == a.steps and {s.draft_depth for s in full} == {4}
    assert a.accepted == sum(s.accept_length for s in full if s.draft_depth > 0)


# ------------------------------------------------------------------ the Tree lab
@pytest.fixture(scope="module")
def pg():
    return tiny_playground()


def test_the_lab_measure_returns_the_medusa_runs_acceptance(pg):
    from medusa_lib.present.lab_measure import acceptance_text, measure_tree
    from medusa_lib.present.settings import Request

    m = measure_tree(
        pg, PROMPT, Request(custom_tree="[[0], [0, 0], [0, 0, 0]]", max_new_tokens=16, lookup_branch=False)
    )
    a, lists = m.acceptance, step_lists(m.medusa.result.steps)
    assert a == acceptance(**lists) and a.depth == 3 and a.drafts == a.steps > 0  # a Medusa chain drafts every step
    assert a.mean_acceptance_length == 1 + sum(lists["accept_lengths"]) / a.drafts
    assert acceptance_text(a) == (
        f"mean acceptance length {a.mean_acceptance_length:.2f} (every step drafted), acceptance rate at draft "
        f"position 1..3: {format_rates(a.rates)} (given the one before: {format_rates(a.given_previous)})"
    )
    hand = acceptance(ACCEPTED, DEPTHS, DRAFTED)
    assert acceptance_text(hand) == (
        "mean acceptance length 2.60 (5 of 6 full steps drafted), acceptance rate at draft position 1..3: "
        "0.80 / 0.60 / 0.20 (given the one before: 0.80 / 0.75 / 0.33)"
    )
    assert acceptance_text(hand, short=True) == "mean acceptance length 2.60, per position 0.80 / 0.60 / 0.20"
    assert acceptance_text(None) == "no step drafted, so no acceptance to report"


def test_the_lab_page_says_the_acceptance_beside_tokens_per_step(pg):
    from ui.lab import MEASURE_OUTPUTS, LabHandlers

    # as the Measure button sends its inputs, in MEASURE_INPUTS' order
    out = dict(
        zip(MEASURE_OUTPUTS, LabHandlers(pg).measure_event(None, "[[0], [0, 0]]", PROMPT, 12, True, False, None))
    )
    assert "tokens/step" in out["lab_status"]
    assert re.search(
        r"Acceptance as vLLM reports it: mean acceptance length \d\.\d\d \(every step drafted\), "
        r"acceptance rate at draft position 1\.\.2: \d\.\d\d / \d\.\d\d",
        out["lab_status"],
    )


def test_eagles_node_budgets_carry_their_acceptance():
    from medusa_lib.core.dynamic_tree import DynamicTreeConfig
    from medusa_lib.core.eagle import new_eagle_head
    from medusa_lib.present import Playground, eagle_budgets

    base = tiny_playground(oracle=False)
    torch.manual_seed(0)
    head = new_eagle_head(base.model, tree=DynamicTreeConfig(top_k=2, depth=3, num_nodes=6)).eval()
    pg = Playground(
        base.model, base.tokenizer, base.heads, heads_note="test heads", drafters={"eagle": {"float32": head}}
    )
    points = eagle_budgets(pg, PROMPT, max_new_tokens=8, budgets=(2, 6))
    for p in points:
        a = p.acceptance
        assert a.drafts == a.steps > 0 and 1 <= a.depth <= 3  # EAGLE drafts every step
        assert a.mean_acceptance_length == 1 + a.accepted / a.drafts
