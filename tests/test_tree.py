"""Tree buffers: the worked example, every reference preset, builders and validation."""

import json
from pathlib import Path

import pytest
import torch

from medusa_lib import (
    TreeError,
    build_tree,
    cartesian_choices,
    chain_choices,
    expected_tokens_per_step,
    get_tree,
    greedy_choices,
    parse_choices,
    preset_names,
)
from medusa_lib.core.tree import (
    PRESETS_FILE,
    TreeBuffers,
    root_only_tree,
    tree_attention_bias,
    validate_choices,
    with_lookup,
)

REFERENCE_PRESETS = (
    Path(__file__).resolve().parent / "data" / "medusa_trees.json"
)  # a copy of the reference's presets (FasterDecoding/Medusa medusa_choices.py)


def reference_buffers(medusa_choices, topk=10):
    """A direct transcription of the reference ``generate_medusa_buffers`` (FasterDecoding/Medusa,
    medusa/model/utils.py), used as the oracle; the only change is that padding stays -1."""
    sorted_medusa_choices = sorted(medusa_choices, key=lambda x: (len(x), x))
    medusa_len = len(sorted_medusa_choices) + 1
    depth_counts = []
    prev_depth = 0
    for path in sorted_medusa_choices:
        depth = len(path)
        if depth != prev_depth:
            depth_counts.append(0)
        depth_counts[depth - 1] += 1
        prev_depth = depth
    medusa_attn_mask = torch.eye(medusa_len, medusa_len)
    medusa_attn_mask[:, 0] = 1
    start = 0
    for i in range(len(depth_counts)):
        for j in range(depth_counts[i]):
            cur = sorted_medusa_choices[start + j]
            if len(cur) == 1:
                continue
            ancestor_idx = []
            for c in range(len(cur) - 1):
                ancestor_idx.append(sorted_medusa_choices.index(cur[: c + 1]) + 1)
            medusa_attn_mask[j + start + 1, ancestor_idx] = 1
        start += depth_counts[i]
    medusa_tree_indices = torch.zeros(medusa_len, dtype=torch.long)
    medusa_tree_indices[0] = 0
    start = 0
    for i in range(len(depth_counts)):
        for j in range(depth_counts[i]):
            cur = sorted_medusa_choices[start + j]
            medusa_tree_indices[start + j + 1] = cur[-1] + topk * i + 1
        start += depth_counts[i]
    medusa_position_ids = torch.zeros(medusa_len, dtype=torch.long)
    start = 0
    for i in range(len(depth_counts)):
        medusa_position_ids[start + 1 : start + depth_counts[i] + 1] = i + 1
        start += depth_counts[i]
    retrieve_indices_nest = []
    retrieve_paths = []
    for i in range(len(sorted_medusa_choices)):
        cur = sorted_medusa_choices[-i - 1]
        retrieve_indice = []
        if cur in retrieve_paths:
            continue
        for c in range(len(cur)):
            retrieve_indice.append(sorted_medusa_choices.index(cur[: c + 1]))
            retrieve_paths.append(cur[: c + 1])
        retrieve_indices_nest.append(retrieve_indice)
    max_length = max(len(x) for x in retrieve_indices_nest)
    retrieve_indices = (
        torch.tensor([p + [-2] * (max_length - len(p)) for p in retrieve_indices_nest], dtype=torch.long) + 1
    )
    retrieve_indices = torch.cat(
        [torch.zeros((retrieve_indices.shape[0], 1), dtype=torch.long), retrieve_indices], dim=1
    )
    return medusa_attn_mask.long(), medusa_tree_indices, medusa_position_ids, retrieve_indices


WORKED = [[0], [0, 0], [0, 1], [0, 2], [1], [1, 0], [1, 1], [1, 2]]


def test_worked_example_from_medusa_md():
    t = build_tree(WORKED)
    assert t.tree_indices.tolist() == [0, 1, 2, 11, 12, 13, 11, 12, 13]
    assert t.position_ids.tolist() == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    assert t.retrieve_indices.tolist() == [[0, 2, 8], [0, 2, 7], [0, 2, 6], [0, 1, 5], [0, 1, 4], [0, 1, 3]]
    rows = ["".join(str(v) for v in row) for row in t.attn_mask.tolist()]
    assert rows == "100000000 110000000 101000000 110100000 110010000 110001000 101000100 101000010 101000001".split()
    assert t.num_nodes == 9 and t.depth == 2
    assert t.parents == (-1, 0, 0, 1, 1, 1, 2, 2, 2)


def test_shipped_presets_are_the_reference_file():
    assert json.loads(PRESETS_FILE.read_text()) == json.loads(REFERENCE_PRESETS.read_text())


@pytest.mark.parametrize("name", json.loads(PRESETS_FILE.read_text()).keys())
def test_every_reference_preset_matches_reference_buffers(name):
    choices = json.loads(PRESETS_FILE.read_text())[name]
    t = get_tree(name, num_heads=4)
    mask, tree_indices, position_ids, retrieve = reference_buffers(choices)
    assert torch.equal(t.attn_mask, mask)
    assert torch.equal(t.tree_indices, tree_indices)
    assert torch.equal(t.position_ids, position_ids)
    assert torch.equal(t.retrieve_indices, retrieve)
    assert t.num_nodes == len(choices) + 1 == 64
    # Every path row is root-first, strictly deeper step by step, padded only at the end.
    for row in t.retrieve_indices.tolist():
        real = [j for j in row if j >= 0]
        assert row[: len(real)] == real and real[0] == 0
        assert [t.position_ids[j].item() for j in real] == list(range(len(real)))


def test_every_preset_name_builds():
    for name in preset_names():
        t = get_tree(name)
        assert t.num_nodes >= 2 and t.retrieve_indices[:, 0].eq(0).all()


def test_chain_and_cartesian_builders():
    assert chain_choices(3) == [[0], [0, 0], [0, 0, 0]]
    chain = build_tree(chain_choices(4))
    assert chain.retrieve_indices.tolist() == [[0, 1, 2, 3, 4]]
    assert chain.num_nodes == 5
    full = cartesian_choices([2, 3])
    assert len(full) == 2 + 6 and sorted(full) == sorted(WORKED)
    capped = cartesian_choices([4, 3, 2], max_nodes=16)
    assert len(capped) == 16
    build_tree(capped)  # closed under prefixes: validation would raise otherwise
    assert [0] in capped and [0, 0] in capped and [0, 0, 0] in capped


@pytest.mark.parametrize(
    "choices, message",
    [
        ([], "The tree is empty"),
        ([[0], [1, 0]], "Tree node [1, 0] has no parent: add [1] to the tree."),
        ([[0], [0]], "Tree node [0] appears twice"),
        ([[0], [10]], "uses rank 10, but ranks must be between 0 and 9"),
        ([[0], [-1]], "uses rank -1"),
        ([[0], []], "is not a non-empty list"),
        ([[0], [0.5]], "whole-number ranks"),
    ],
)
def test_invalid_trees_have_one_clear_sentence(choices, message):
    with pytest.raises(TreeError) as e:
        build_tree(choices)
    assert message in str(e.value)
    assert str(e.value).count(". ") == 0  # one sentence


def test_tree_deeper_than_heads_is_refused():
    with pytest.raises(TreeError, match="3 levels deep but the heads only predict 2 tokens ahead"):
        build_tree(chain_choices(3), num_heads=2)
    with pytest.raises(TreeError, match="4 levels deep"):
        get_tree("mc_sim_7b_63", num_heads=3)


def test_parse_choices_text():
    assert parse_choices("[[0], [0, 0], [1]]") == [[0], [0, 0], [1]]
    with pytest.raises(TreeError, match="not valid JSON"):
        parse_choices("[[0], [0, 0")
    with pytest.raises(TreeError, match="JSON list of nodes"):
        parse_choices('{"a": 1}')
    with pytest.raises(TreeError, match="Unknown tree preset"):
        get_tree("nope")


def test_greedy_tree_construction_and_expectation():
    acc = [[0.6, 0.2, 0.1], [0.4, 0.1, 0.05]]
    choices, expected = greedy_choices(acc, 4)
    # Products: [0]=.6, [0,0]=.24, [1]=.2, [2]=.1, [0,1]=.06 -> the top 4 in order
    assert choices == [[0], [0, 0], [1], [2]]
    assert expected == pytest.approx(1 + 0.6 + 0.24 + 0.2 + 0.1)
    assert expected_tokens_per_step(choices, acc) == pytest.approx(expected)
    validate_choices(choices, num_heads=2)
    big, _ = greedy_choices(acc, 64)
    assert max(len(c) for c in big) <= 2 and len(big) == 3 + 9  # all nodes that exist


def test_levels_group_each_depth_by_parent_for_level_by_level_drafting():
    t = build_tree([[0], [1], [2], [0, 0], [0, 1], [2, 3], [0, 0, 5], [2, 3, 0], [2, 3, 1]])
    pos = {c: j + 1 for j, c in enumerate(t.choices)}
    assert len(t.levels) == t.depth == 3
    one, two, three = t.levels
    assert (
        one.ancestors.shape == (1, 0)
        and one.nodes.tolist() == [1, 2, 3]
        and one.rows.tolist() == [0, 0, 0]
        and one.ranks.tolist() == [0, 1, 2]
        and one.topk == 3
    )
    # depth 2: parents [0] and [2] (in tree order); [2, 3] is rank 3 under the second
    assert two.ancestors.tolist() == [[pos[(0,)]], [pos[(2,)]]]
    assert (
        two.nodes.tolist() == [pos[(0, 0)], pos[(0, 1)], pos[(2, 3)]]
        and two.rows.tolist() == [0, 0, 1]
        and two.ranks.tolist() == [0, 1, 3]
        and two.topk == 4
    )
    # depth 3: each parent's whole branch below the root, parent last
    assert three.ancestors.tolist() == [[pos[(0,)], pos[(0, 0)]], [pos[(2,)], pos[(2, 3)]]]
    assert (
        three.nodes.tolist() == [pos[(0, 0, 5)], pos[(2, 3, 0)], pos[(2, 3, 1)]]
        and three.rows.tolist() == [0, 1, 1]
        and three.ranks.tolist() == [5, 0, 1]
    )
    # every node appears once, on the device of the tree's buffers
    assert sorted(n for lv in t.levels for n in lv.nodes.tolist()) == list(range(1, t.num_nodes))
    moved = t.to("meta")
    assert all(lv.nodes.device.type == "meta" for lv in moved.levels) and moved.levels[2].ranks.shape == (3,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_attention_bias_is_zero_where_a_node_may_attend_and_dtype_min_elsewhere(dtype):
    tree = with_lookup(get_tree("mc_sim_7b_63"), 3)
    bias = tree_attention_bias(tree, dtype)
    assert bias.dtype == dtype and bias.shape == tree.attn_mask.shape
    assert torch.equal(bias == 0, tree.attn_mask == 1) and bool(
        (bias[tree.attn_mask == 0] == torch.finfo(dtype).min).all()
    )


def test_tree_buffers_hold_one_tree_where_each_phase_reads_it():
    from dataclasses import FrozenInstanceError

    tree = get_tree("mc_sim_7b_63")
    bufs = TreeBuffers.build(tree, device="cpu", out_device="cpu", dtype=torch.bfloat16)
    for copy in (bufs.tree, bufs.out, bufs.cpu):  # one tree, three device copies
        assert copy is not tree and copy.choices == tree.choices and copy.retrieve_indices.device.type == "cpu"
        assert torch.equal(copy.retrieve_indices, tree.retrieve_indices) and torch.equal(
            copy.position_ids, tree.position_ids
        )
    assert bufs.num_nodes == tree.num_nodes == 64 and bufs.depth == tree.depth == 4
    assert torch.equal(bufs.bias, tree_attention_bias(tree, torch.bfloat16))
    with pytest.raises(FrozenInstanceError):
        bufs.bias = None
    root = TreeBuffers.build(root_only_tree(), device="cpu", out_device="cpu", dtype=torch.float32)
    assert root.num_nodes == 1 and root.depth == 0 and root.bias.tolist() == [[0.0]]
