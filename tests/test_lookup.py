"""Lookup branch: n-gram proposals, the extended tree buffers, and exact greedy decoding with it."""

import pytest
import torch
from conftest import OracleHeads, make_model, random_heads

from medusa_lib import DecodeConfig, DecodeError, build_tree, chain_choices, get_tree
from medusa_lib.core.attention import use_packed_gqa
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.lookup import ngram_proposal
from medusa_lib.core.tree import LOOKUP_RANK, with_lookup

PROMPT = [1, 17, 33, 250, 99, 4, 61]
N_NEW = 64
ARCHS = [
    "llama",
    "qwen2",
    "gpt2",
    "llama-packed",
]  # llama-packed: GQA through medusa_lib.core.attention (load_model's CPU default)


def model_for(arch: str):
    model = make_model(arch.removesuffix("-packed"))
    if arch.endswith("-packed"):
        assert use_packed_gqa(model)
    return model


def t(*ids):
    return torch.tensor(ids, dtype=torch.long)


# ------------------------------------------------------------------ proposals
def test_proposal_follows_the_most_recent_earlier_occurrence_of_the_longest_suffix():
    # suffix 3-gram [7, 8, 9] occurred at 1 (then 4, 5) and at 6 (then 1, 2, 3): the later one wins
    h = t(0, 7, 8, 9, 4, 5, 7, 8, 9, 1, 2, 3, 7, 8, 9)
    assert ngram_proposal(h, length=3).tolist() == [1, 2, 3]
    assert ngram_proposal(h, length=1).tolist() == [1]
    # a longer match beats a more recent shorter one: [6, 8, 9] matches only as [8, 9] at the end
    h = t(6, 8, 9, 50, 51, 52, 3, 8, 9, 60, 61, 6, 8, 9)
    assert ngram_proposal(h, length=2).tolist() == [50, 51]
    assert ngram_proposal(h, length=2, max_ngram=2).tolist() == [60, 61]


def test_proposal_is_shorter_near_the_end_and_empty_without_a_match():
    h = t(5, 6, 7, 5, 6)  # [5, 6] occurred at 0, followed by 7, 5, 6 (which runs into the suffix itself)
    assert ngram_proposal(h, length=8).tolist() == [7, 5, 6]
    assert ngram_proposal(t(1, 2, 3, 4), length=4).numel() == 0
    assert ngram_proposal(t(1, 2, 9, 2), length=4).numel() == 0  # only a 1-gram repeats: below min_ngram
    assert ngram_proposal(t(1, 2, 9, 2), length=4, min_ngram=1).tolist() == [9, 2]
    assert ngram_proposal(t(3, 3), length=4).numel() == 0  # too short for a 2-gram before the suffix
    assert ngram_proposal(t(5, 6, 7, 5, 6), length=0).numel() == 0
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        ngram_proposal(t(1, 2, 3), length=2, min_ngram=3, max_ngram=2)


# ------------------------------------------------------------------ tree buffers
def test_with_lookup_appends_a_chain_under_the_root_and_leaves_the_tree_as_it_was():
    base = build_tree([[0], [1], [0, 0]])
    ext = with_lookup(base, 3)
    L = base.num_nodes
    assert ext.num_nodes == L + 3 and ext.lookup == 3 and ext.depth == 3 and ext.name.endswith("+lookup-3")
    assert torch.equal(ext.attn_mask[:L, :L], base.attn_mask) and not ext.attn_mask[:L, L:].any()
    assert ext.attn_mask[L:].tolist() == [[1, 0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 1, 1, 0], [1, 0, 0, 0, 1, 1, 1]]
    assert ext.position_ids.tolist() == base.position_ids.tolist() + [1, 2, 3]
    assert ext.parents == base.parents + (0, L, L + 1)
    assert ext.choices[L - 1 :] == ((LOOKUP_RANK,), (LOOKUP_RANK,) * 2, (LOOKUP_RANK,) * 3)
    ri = ext.retrieve_indices
    assert ri.shape == (base.retrieve_indices.shape[0] + 1, 4) and ri[-1].tolist() == [0, L, L + 1, L + 2]
    assert (
        torch.equal(ri[:-1, : base.retrieve_indices.shape[1]], base.retrieve_indices)
        and (ri[:-1, base.retrieve_indices.shape[1] :] == -1).all()
    )
    # the heads still draft only the tree's own nodes
    assert [lv.nodes.tolist() for lv in ext.levels] == [lv.nodes.tolist() for lv in base.levels]
    assert with_lookup(base, 0) is base
    assert ext.to("meta").lookup == 3


# ------------------------------------------------------------------ decoding
@pytest.mark.parametrize("arch", ARCHS)
def test_medusa_greedy_with_lookup_equals_plain_greedy_and_uses_the_branch(arch):
    model = model_for(arch)
    plain = run_method(
        model, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False)
    ).tokens
    heads = random_heads(4, shared=arch != "gpt2")
    res, without = (
        run_method(
            model,
            PROMPT,
            method="medusa-greedy",
            heads=heads,
            tree=build_tree(chain_choices(2)),
            config=DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False, lookup=n),
        )
        for n in (4, 0)
    )
    assert res.tokens == without.tokens == plain
    # A tiny random model soon repeats itself; untrained heads almost never hit, the lookup branch does.
    assert res.lookup_tokens > 0 and without.lookup_tokens == 0
    assert res.decode_steps < without.decode_steps
    for s in res.steps[1:]:
        lookup_nodes = range(s.tree.num_nodes - s.tree.lookup, s.tree.num_nodes)
        on_branch = [j for j in s.accepted_nodes[1:] if j in lookup_nodes]
        assert s.lookup_accepted == len(on_branch) and s.lookup_accepted in (0, s.accept_length)
        assert [s.tree_token_ids[j] for j in s.accepted_nodes[1:]] == list(s.tokens[: s.accept_length])
        # the branch holds what followed the last earlier occurrence of the context's suffix (none: no branch)
        context = torch.tensor(PROMPT + plain[: sum(len(x.tokens) for x in res.steps[: s.index])])
        assert s.tree_token_ids[s.tree.num_nodes - s.tree.lookup :] == ngram_proposal(context, length=4).tolist()


def test_lookup_with_rigged_heads_and_typical_at_temperature_zero_stay_exact():
    model = make_model("llama")
    ref = run_method(
        model, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=N_NEW + 8, stop_on_eos=False)
    ).tokens
    rigged = OracleHeads(model, PROMPT + ref)  # the heads' paths win; the branch's nodes must still be compacted away
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=rigged,
        tree=get_tree("mc_sim_7b_63"),
        config=DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False, lookup=3),
    )
    assert res.tokens == ref[:N_NEW]
    # typical acceptance at T = 0 is greedy matching: with untrained heads the branch wins steps, output unchanged
    res = run_method(
        model,
        PROMPT,
        method="medusa-typical",
        heads=random_heads(4),
        tree=build_tree(chain_choices(2)),
        config=DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False, lookup=3),
    )
    assert res.tokens == ref[:N_NEW] and res.lookup_tokens > 0


@pytest.mark.parametrize(
    "arch", ["llama", "gpt2"]
)  # gpt2: learned positions, a node past the context would fail outright
def test_lookup_respects_the_context_limit_and_max_new_tokens(arch):
    model = make_model(arch, max_position_embeddings=48)
    ref = run_method(model, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=200, stop_on_eos=False)).tokens
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=random_heads(4, shared=arch != "gpt2"),
        tree=build_tree(chain_choices(2)),
        config=DecodeConfig(max_new_tokens=200, stop_on_eos=False, lookup=8),
    )
    assert res.tokens == ref and res.finish_reason == "context"
    deepest = [
        len(PROMPT) + sum(len(x.tokens) for x in res.steps[: s.index]) - 1 + int(s.tree.position_ids.max())
        for s in res.steps[1:]
    ]
    assert (
        max(deepest) == 46
    )  # as for the heads' tree: the deepest node leaves the context's last slot to the bonus token
    for n in (1, 3, 11):
        res = run_method(
            model,
            PROMPT,
            method="medusa-greedy",
            heads=random_heads(4),
            tree=build_tree(chain_choices(1)),
            config=DecodeConfig(max_new_tokens=n, stop_on_eos=False, lookup=8),
        )
        assert res.tokens == ref[:n] and res.finish_reason == "length"


def test_typical_acceptance_with_lookup_is_seeded():
    model = make_model("llama")
    cfg = DecodeConfig(max_new_tokens=32, stop_on_eos=False, temperature=0.8, seed=3, lookup=4)
    a = run_method(
        model, PROMPT, method="medusa-typical", heads=random_heads(4), tree=build_tree(chain_choices(2)), config=cfg
    )
    b = run_method(
        model, PROMPT, method="medusa-typical", heads=random_heads(4), tree=build_tree(chain_choices(2)), config=cfg
    )
    assert a.tokens == b.tokens and len(a.tokens) == 32 and a.lookup_tokens > 0


@pytest.mark.parametrize("bad", [-1, 9, True, 2.5])
def test_bad_lookup_lengths_are_refused(bad):
    with pytest.raises(DecodeError, match="lookup branch's length"):
        make_decoder(make_model("llama"), config=DecodeConfig(lookup=bad))


@pytest.mark.parametrize("bad", [99, -1, "4", True])
def test_heads_config_with_a_bad_lookup_is_refused(tmp_path, bad):
    from medusa_lib import load_heads
    from medusa_lib.core.heads import HeadsError

    random_heads(2).save(tmp_path, lookup=bad)
    with pytest.raises(HeadsError, match="lookup=.*must be a whole number from 0 \\(no lookup branch\\) to 8"):
        load_heads(tmp_path)


def test_heads_config_lookup_is_read_and_used_by_the_playground(tmp_path):
    from conftest import tiny_tokenizer

    from medusa_lib import load_heads
    from medusa_lib.present import Playground

    model = make_model("llama")
    random_heads(4).save(tmp_path / "a", lookup=2)
    random_heads(4).save(tmp_path / "b")
    a, b = load_heads(tmp_path / "a", model=model), load_heads(tmp_path / "b", model=model)
    assert a.lookup == 2 and b.lookup is None
    assert Playground(model, tiny_tokenizer(), a).defaults.lookup == 2
    assert Playground(model, tiny_tokenizer(), b).defaults.lookup == 4  # not calibrated: lookup.DEFAULT_LOOKUP
    random_heads(4).save(
        tmp_path / "c", lookup=0
    )  # calibrated without the branch: off by default, 4 tokens when ticked
    for heads, on, n in [(a, True, 2), (b, True, 4), (load_heads(tmp_path / "c", model=model), False, 4)]:
        pg = Playground(model, tiny_tokenizer(), heads)
        assert pg.defaults.lookup_on == on and pg.defaults.lookup == n
        settings = lambda box: pg.settings_of({"tree": "chain-2", "lookup_branch": box})  # noqa: E731
        assert settings(True).lookup == n and settings(False).lookup == 0
        with pytest.raises(
            ValueError,
            match=r"The lookup branch switch \(lookup_branch\) must be true or false, not a number \(got 0\)\.",
        ):
            settings(0)  # the switch is a bool: 0 is not false


def ends(events) -> dict:
    return {e.method: e.record for e in events if e.kind == "end"}


def test_lookup_branch_shows_in_pieces_tree_and_table():
    from conftest import tiny_playground

    from medusa_lib.present import Settings, path_rows, tree_nodes
    from ui.figures import tree_figure
    from ui.render import tokens_html

    pg = tiny_playground(oracle=False)  # untrained heads: what gets accepted comes from the lookup branch
    prompt = "w5 w6 w7 w8 w5 w6 w7"  # the tiny model's answer to it soon repeats itself
    on = ends(pg.stream(prompt, Settings(max_new_tokens=60, tree="chain-2", lookup=4)))["medusa-greedy"]
    off = ends(pg.stream(prompt, Settings(max_new_tokens=60, tree="chain-2", lookup=0)))["medusa-greedy"]
    assert on.tokens == off.tokens and on.result.decode_steps < off.result.decode_steps
    assert all(v.step.tree.lookup == 0 for v in off.views[1:]) and off.result.lookup_tokens == 0
    won = [v for v in on.views[1:] if v.step.lookup_accepted]
    assert won and on.result.lookup_tokens == sum(v.step.lookup_accepted for v in won)
    v = won[0]
    assert [p.origin for p in v.pieces] == ["lookup"] * v.step.accept_length + ["base"] * (
        len(v.step.tokens) - v.step.accept_length
    )
    nodes = tree_nodes(v, pg.tokenizer)
    L, n = v.step.tree.num_nodes, v.step.tree.lookup
    assert [x["kind"] for x in nodes[:L]] == ["root"] + ["candidate"] * (L - n - 1) + ["lookup"] * n
    assert all(x["rank"] is None for x in nodes[L - n : L]) and [x["parent"] for x in nodes[L - n : L]] == [0] + list(
        range(L - n, L - 1)
    )
    assert {x["node"] for x in nodes if x["kind"] == "lookup" and x["accepted"]} == set(v.step.accepted_nodes[1:])
    fig = tree_figure(nodes, title="t")
    assert {"lookup branch, accepted"} <= {t.name for t in fig.data} and "depth 1" in fig.layout.xaxis.ticktext
    rows = {r["step"]: r for r in path_rows(on, pg.tokenizer)}
    assert rows[v.step.index]["drafted by"] == "lookup branch"
    assert all(r["drafted by"] == "" for r in rows.values() if r["accept length"] == 0)
    html = tokens_html(v.pieces)
    assert f'class="tok lookup l{v.step.index % 2}"' in html and "accepted lookup-branch token" in html
