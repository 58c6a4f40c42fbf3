"""The tree lab's library (core/lab.py): the cost, gain and speed-up curves, the editor, per-head acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import OracleHeads, make_model

from medusa_lib.core.compose import make_decoder
from medusa_lib.core.config import DecodeConfig
from medusa_lib.core.lab import (
    CostCurve,
    gain_curve,
    head_acceptance,
    monotone,
    recorded_costs,
    speedup_curve,
    step_costs,
)
from medusa_lib.core.steps import Step
from medusa_lib.core.tree import TreeError, build_tree, greedy_choices, validate_choices, with_lookup
from medusa_lib.core.tree.edit import add_best_node, leaves, remove_leaf

ROOT = Path(__file__).resolve().parents[1]
RECORD = json.loads((ROOT / "assets" / "heads" / "smollm2-135m-instruct" / "config.json").read_text())["calibration"]
ACC = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.05], [0.4, 0.1, 0.1]]  # acc[k][r]: head k+1, rank r


def test_step_costs_on_the_tiny_model_measure_every_size_against_a_plain_step():
    seen = []
    rows = step_costs(
        make_model("llama"), (2, 4, 8), prefix=16, repeats=1, progress=lambda done, total: seen.append((done, total))
    )
    assert [r["tokens"] for r in rows] == [1, 2, 4, 8]  # the plain step first, always
    assert rows[0]["vs_one_token"] == 1.0 and all(r["body_ms"] > 0 and r["lm_head_ms"] >= 0 for r in rows)
    assert seen == [(k, 12) for k in range(1, 13)]  # 4 sizes x 3 rounds (2 warm-up), one call a forward
    curve = CostCurve.from_rows(rows)
    assert curve.sizes == (1, 2, 4, 8) and curve.source == "measured"
    assert all(a <= b for a, b in zip(curve.fitted, curve.fitted[1:]))  # cost never falls with size
    assert curve.fitted[0] == curve.at(1) == 1.0  # a plain step is the unit
    dip = CostCurve.of({1: 1.0, 2: 0.9, 3: 1.2}, source="measured")
    assert dip.fitted == (1.0, 1.0, 1.2) and dip.measured == (1.0, 0.9, 1.2)


def test_sizes_whose_products_run_through_mkl_are_fitted_apart_and_keep_their_dip():
    # An AVX2 CPU: oneDNN makes 3 rows cost ~1.8 rows' time, MKL streams 2 and 4 rows at about one's.
    points = {1: 1.0, 2: 1.06, 3: 1.62, 4: 1.10, 5: 1.70, 8: 1.95}
    one_kernel = CostCurve.of(points, source="measured")
    assert one_kernel.fitted == pytest.approx((1.0, 1.06, 1.36, 1.36, 1.70, 1.95)) and one_kernel.mkl_rows == ()
    split = CostCurve.of(points, source="measured", mkl_rows=(4, 2, 6, 1))
    assert split.mkl_rows == (2, 4)  # only measured sizes past the plain step
    assert split.fitted == pytest.approx((1.0, 1.06, 1.62, 1.10, 1.70, 1.95))
    assert split.at(4) < split.at(3) and split.at(3.5) == pytest.approx(1.36)
    # Each kernel's sizes are still non-decreasing among themselves, and never below a plain step.
    noisy = CostCurve.of({1: 1.0, 2: 1.2, 3: 1.7, 4: 1.1, 5: 1.6}, source="measured", mkl_rows=(2, 4))
    assert noisy.fitted == pytest.approx((1.0, 1.15, 1.65, 1.15, 1.65))
    assert CostCurve.from_rows(
        [{"tokens": 1, "vs_one_token": 1.0}, {"tokens": 4, "vs_one_token": 0.9}], mkl_rows=(4,)
    ).fitted == (1.0, 1.0)


def test_monotone_is_the_least_squares_non_decreasing_fit():
    assert monotone([1.0, 1.4, 1.2, 2.0]) == pytest.approx([1.0, 1.3, 1.3, 2.0])
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]


def test_recorded_costs_are_time_per_step_over_plain_at_the_tokens_verified():
    costs = recorded_costs(RECORD)
    lookup = RECORD["lookup"]
    assert costs[1] == 1.0
    for fig in RECORD["trees"].values():
        assert costs[fig["nodes"] + lookup] == pytest.approx(fig["measured_tokens_per_step"] / fig["speedup"])
    assert recorded_costs(None) == {} and recorded_costs({"trees": {}}) == {}
    curve = CostCurve.of(costs, source="calibration")
    assert curve.at(1) == 1.0 and all(a <= b for a, b in zip(curve.fitted, curve.fitted[1:]))
    assert curve.at(200) >= curve.at(100) >= curve.fitted[-1]  # extrapolated with the last slope


def test_gain_curve_is_the_expected_tokens_per_step_of_the_greedy_tree_of_each_size():
    sizes = range(1, 21)
    gain = gain_curve(ACC, sizes)
    assert len(gain.expected) == 20 and gain.expected[0] == 1.0
    for s, g in zip(sizes, gain.expected):
        if s > 1:
            assert g == pytest.approx(greedy_choices(ACC, s - 1)[1], rel=1e-12)
    assert all(a <= b for a, b in zip(gain.expected, gain.expected[1:]))
    assert gain.simulated == {} and gain.lookup_gain is None  # no calibration record


def test_the_shipped_record_gives_the_simulated_figures_with_and_without_lookup():
    gain = gain_curve(RECORD["accuracy"], record=RECORD)
    assert len(gain.expected) == 64
    for fig in RECORD["trees"].values():
        if fig["nodes"] <= 64:
            assert gain.simulated[fig["nodes"]] == fig["heads_only_simulated_tokens_per_step"]
            assert gain.with_lookup[fig["nodes"]] == fig["simulated_tokens_per_step"]
            assert gain.lookup_gain_at(fig["nodes"]) == pytest.approx(
                fig["simulated_tokens_per_step"] - fig["heads_only_simulated_tokens_per_step"]
            )


def test_the_optimum_is_the_argmax_of_gain_over_cost():
    gain = gain_curve(ACC, range(1, 31))
    cost = CostCurve.of({1: 1.0, 10: 1.5, 30: 3.0}, source="measured")
    curve = speedup_curve(gain, cost)
    assert curve.speedup == pytest.approx([g / cost.at(s) for s, g in zip(gain.sizes, gain.expected)])
    assert curve.optimum == gain.sizes[max(range(30), key=lambda i: curve.speedup[i])]
    flat = speedup_curve(
        gain, CostCurve.of({1: 1.0, 64: 1.0}, source="measured")
    )  # a GPU that verifies 64 tokens for free
    assert flat.optimum == 30  # then the biggest tree wins


def test_adding_the_best_node_grows_the_greedy_tree():
    choices: list[list[int]] = []
    for n in range(1, 25):
        choices = add_best_node(choices, ACC, num_heads=3)
        assert validate_choices(choices, num_heads=3) == choices
        assert build_tree(choices).choices == build_tree(greedy_choices(ACC, n)[0]).choices


def test_the_best_node_respects_the_heads_depth_and_says_when_the_tree_is_full():
    assert max(map(len, add_best_node([[0], [0, 0]], ACC, num_heads=2))) <= 2
    full = [[r] for r in range(3)]  # one head, three ranks: nothing left to add
    with pytest.raises(TreeError, match="already in the tree"):
        add_best_node(full, [ACC[0]], num_heads=1)


def test_removing_the_last_greedy_node_gives_the_smaller_greedy_tree():
    for n in range(2, 20):
        bigger, smaller = greedy_choices(ACC, n)[0], greedy_choices(ACC, n - 1)[0]
        last = bigger[-1]
        assert last in leaves(bigger)
        assert build_tree(remove_leaf(bigger, last)).choices == build_tree(smaller).choices


def test_leaves_and_remove_leaf_refuse_what_would_break_the_tree():
    tree = [[0], [1], [0, 0], [0, 1]]
    assert leaves(tree) == [[1], [0, 0], [0, 1]]
    assert remove_leaf(tree, [0, 1]) == [[0], [1], [0, 0]]
    with pytest.raises(TreeError, match=r"Node \[0\] has children"):
        remove_leaf(tree, [0])
    with pytest.raises(TreeError, match="is not in the tree"):
        remove_leaf(tree, [2])
    with pytest.raises(TreeError, match="at least one node"):
        remove_leaf([[0]], [0])


def _step(index, tree, best_path, accept_length):
    return Step(
        index=index,
        tokens=tuple(range(accept_length + 1)),
        seconds=0.0,
        accept_length=accept_length,
        tree=tree,
        best_path=best_path,
    )


def test_head_acceptance_counts_a_hand_checked_run():
    # nodes 1: [0], 2: [1], 3: [0, 0], 4: [0, 1]; paths [0,1,4], [0,1,3], [0,2];
    # with lookup-2: nodes 5, 6 and path [0,5,6]
    tree = with_lookup(build_tree([[0], [1], [0, 0], [0, 1]]), 2)
    assert tree.retrieve_indices.tolist() == [[0, 1, 4], [0, 1, 3], [0, 2, -1], [0, 5, 6]]
    steps = [
        Step(index=0, tokens=(7,), seconds=0.0),  # the prefill: no tree
        _step(1, tree, 1, 2),  # [0] then [0, 0] accepted
        _step(2, tree, 2, 1),  # [1] accepted: head 2's nodes hang from [0], not reached
        _step(3, tree, 0, 0),  # nothing accepted: head 1's nodes reached, head 2's not
        _step(4, tree, 3, 2),  # the lookup branch's two nodes accepted
    ]
    acc = head_acceptance(steps, depth=3, ranks=3)
    assert acc.steps == 4
    assert acc.proposed == ((4, 4, 0), (4, 4, 0), (0, 0, 0))
    assert acc.reached == ((4, 4, 0), (1, 1, 0), (0, 0, 0))
    assert acc.accepted == ((1, 1, 0), (1, 0, 0), (0, 0, 0))
    assert acc.lookup_reached == (4, 1, 0) and acc.lookup_accepted == (1, 1, 0)
    assert acc.rates()[0] == [0.25, 0.25, None] and acc.rates()[1] == [1.0, 0.0, None]


def test_head_acceptance_of_a_real_run_adds_up_to_its_accepted_candidates():
    torch.manual_seed(0)
    model = make_model("llama")
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    ids = [1, 10, 11, 12, 13]
    seq = ids + make_decoder(model, method="plain", config=DecodeConfig(max_new_tokens=40)).run(ids).tokens
    heads = OracleHeads(model, seq, num_heads=3)
    tree = build_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], num_heads=3)
    steps = list(
        make_decoder(
            model, method="medusa-greedy", heads=heads, tree=tree, config=DecodeConfig(max_new_tokens=30, lookup=2)
        ).steps(ids)
    )
    acc = head_acceptance(steps, depth=3)
    assert acc.steps == len(steps) - 1
    assert sum(map(sum, acc.accepted)) + sum(acc.lookup_accepted) == sum(s.accept_length for s in steps)
    assert sum(map(sum, acc.accepted)) > 0  # the oracle heads earn their nodes
    assert all(
        a <= n <= p for pa, na, aa in zip(acc.proposed, acc.reached, acc.accepted) for p, n, a in zip(pa, na, aa)
    )
