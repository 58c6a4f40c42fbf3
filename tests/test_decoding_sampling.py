"""Exact sampling: Medusa sampling draws what plain sampling draws with the same seed, the walk down the tree,
the keyed noise of each draw, typical acceptance, top-p, and tiny or invalid temperatures."""

import pytest
import torch
from conftest import OracleHeads, pairwise, random_heads
from decoding_helpers import ARCHS, CACHES, N_NEW, PROMPT, TREES, plain_tokens

from medusa_lib import DecodeConfig, DecodeError, build_tree
from medusa_lib.core.acceptance import race_noise, sample_token, sample_walk, sampling_probs
from medusa_lib.core.compose import run_method


# ------------------------------------------------------------------ exact sampling
def sampled(model, n, *, temperature, seed, top_p=1.0, cache="dynamic"):
    cfg = DecodeConfig(
        max_new_tokens=n, stop_on_eos=False, temperature=temperature, seed=seed, top_p=top_p, cache=cache
    )
    return cfg, run_method(model, PROMPT, method="plain", config=cfg).tokens


HEAD_KINDS = {"plain": {}, "root": {"root": True}, "path": {"path": True}}


def test_pairwise_rows_hold_every_pair_of_settings_and_fewer_rows_than_the_product():
    axes = [ARCHS, list(TREES), list(HEAD_KINDS), CACHES]
    rows = pairwise(*axes)
    # 4 x 3 pairs need 12 rows at least: the fewest possible
    assert len(set(rows)) == len(rows) == 12
    for a in range(len(axes)):
        for b in range(a + 1, len(axes)):
            assert {(r[a], r[b]) for r in rows} == {(x, y) for x in axes[a] for y in axes[b]}, (a, b)
    assert pairwise([1, 2], ["x"]) == [(1, "x"), (2, "x")]


@pytest.mark.parametrize("arch,tree_name,head_kind,cache", pairwise(ARCHS, list(TREES), list(HEAD_KINDS), CACHES))
def test_medusa_exact_sampling_equals_plain_sampling_with_the_same_seed(cache, models, arch, tree_name, head_kind):
    """The sampling counterpart of Medusa greedy == plain greedy: every emitted token is one draw
    from the same generator, so with the same seed the outputs are identical (float32). Every pair of
    settings (model, tree, head kind, cache) runs at least once (12 rows instead of 72)."""
    model = models[arch]
    heads = random_heads(4, shared=arch != "gpt2", **HEAD_KINDS[head_kind])
    for temperature, seed, top_p in [(0.7, 0, 1.0), (1.0, 1, 1.0), (1.3, 2, 0.9), (0.3, 3, 1.0)]:
        cfg, ref = sampled(model, cache=cache, n=40, temperature=temperature, seed=seed, top_p=top_p)
        res = run_method(model, PROMPT, method="medusa-sample", heads=heads, tree=TREES[tree_name], config=cfg)
        assert res.tokens == ref, (temperature, seed, top_p)


@pytest.mark.parametrize("arch,tree_name,lookup,cache", pairwise(ARCHS, list(TREES), [0, 3], CACHES))
def test_medusa_exact_sampling_with_rigged_heads_takes_several_tokens_a_step(cache, models, arch, tree_name, lookup):
    """Heads that foresee the sampled answer (at rank 0 or 1): long walks, the same tokens (every
    pair of model, tree, lookup branch and cache at least once)."""
    model = models[arch]
    for seed in (0, 5):
        cfg, ref = sampled(model, cache=cache, n=N_NEW + 8, temperature=0.9, seed=seed)
        cfg = DecodeConfig(
            cache=cache, max_new_tokens=N_NEW, stop_on_eos=False, temperature=0.9, seed=seed, lookup=lookup
        )
        res = run_method(
            model,
            PROMPT,
            method="medusa-sample",
            heads=OracleHeads(model, PROMPT + ref),
            tree=TREES[tree_name],
            config=cfg,
        )
        assert res.tokens == ref[:N_NEW]
        assert res.tokens_per_step > {"chain-4": 1.2, "cartesian-3x2x2": 2.5, "mc_sim_7b_63": 3.0}[tree_name]
        # the record's path is the walk's: its tokens are the accepted ones
        for s in res.steps[1:]:
            assert len(s.accepted_nodes) == s.accept_length + 1
            assert [s.tree_token_ids[j] for j in s.accepted_nodes[1:]] == list(s.tokens[: s.accept_length])


@pytest.mark.parametrize("cache", CACHES)
def test_exact_sampling_at_temperature_zero_is_greedy(cache, models):
    model = models["qwen2"]
    cfg = DecodeConfig(cache=cache, max_new_tokens=30, stop_on_eos=False)
    res = run_method(
        model,
        PROMPT,
        method="medusa-sample",
        heads=random_heads(4, shared=True),
        tree=TREES["mc_sim_7b_63"],
        config=cfg,
    )
    assert res.tokens == plain_tokens(model, 30, cache=cache)


def walk_case():
    """A hand-made step: root's children hold tokens 5 and 7, node 1 (token 5) has child 3 (token 2)."""
    tree = build_tree([[0], [1], [0, 0]])
    tokens = [9, 5, 7, 2]
    logits = torch.full((4, 10), -30.0)
    return tree, tokens, logits


def test_the_walk_descends_while_the_draw_is_a_child_and_ends_with_the_first_draw_that_is_not():
    tree, tokens, logits = walk_case()
    assert tree.children == ((1, 2), (3,), (), ())
    draw = dict(temperature=1.0, top_p=1.0, seed=0, position=7)
    # (near) one-hot: 5 at the root, then 2, then 4 at the leaf; at a leaf the draw is the bonus
    logits[0, 5] = logits[1, 2] = logits[3, 4] = 30.0
    assert sample_walk(logits, tokens, tree.children, **draw) == ([0, 1, 3], 4)
    logits[1, 2], logits[1, 8] = -30.0, 30.0  # after 5 the model says 8: no child holds it
    assert sample_walk(logits, tokens, tree.children, **draw) == ([0, 1], 8)
    logits[0, 5], logits[0, 7] = -30.0, 30.0  # 7: the root's second child, a leaf
    logits[2, 1] = 30.0
    assert sample_walk(logits, tokens, tree.children, **draw) == ([0, 2], 1)
    logits[0, 7], logits[0, 6] = -30.0, 30.0  # 6: no child: nothing accepted, 6 is the bonus
    assert sample_walk(logits, tokens, tree.children, **draw) == ([0], 6)


def test_the_walks_tokens_are_distributed_as_the_model_says():
    """20,000 walks over a hand-made step: the first token follows p at the root, the second
    (after descending) follows p at that child: the joint law of plain sampling's two draws."""
    tree, tokens, _ = walk_case()
    torch.manual_seed(0)
    logits = torch.randn(4, 10) * 1.5
    p_root, p_child = (
        sampling_probs(logits[0], temperature=0.8, top_p=1.0),
        sampling_probs(logits[1], temperature=0.8, top_p=1.0),
    )
    n = 20_000
    first, second = torch.zeros(10), torch.zeros(10)
    for i in range(n):  # a walk at every other position: fresh noise each time
        path, bonus = sample_walk(logits, tokens, tree.children, temperature=0.8, top_p=1.0, seed=1, position=2 * i)
        y1 = tokens[path[1]] if len(path) > 1 else bonus
        first[y1] += 1
        if y1 == 5:  # descended to node 1: the next token is drawn there
            second[tokens[path[2]] if len(path) > 2 else bonus] += 1
    for freq, p, count in ((first / n, p_root, n), (second / second.sum(), p_child, second.sum())):
        sigma = (p * (1 - p) / count).sqrt()
        assert ((freq - p).abs() <= 5 * sigma + 1e-3).all(), (freq, p)


def test_sample_token_draws_from_the_nucleus_with_the_noise_of_its_position_whatever_p_is():
    logits = torch.tensor([3.0, 2.0, 1.0, -5.0])
    probs = sampling_probs(logits, temperature=1.0, top_p=0.8)
    # {0, 1} holds >= 0.8 of the mass
    assert probs[3] == 0 and probs[2] == 0 and probs[:2].sum() == pytest.approx(1.0)
    draws = {int(sample_token(logits, temperature=1.0, top_p=0.8, seed=0, position=i)) for i in range(200)}
    assert draws == {0, 1}
    # the noise of a draw depends on (seed, position) only, not on the distribution or on earlier draws
    p, q = torch.softmax(torch.randn(50), -1), torch.softmax(9 * torch.randn(50), -1)
    for pos in range(30):
        e = race_noise(4, pos, 50)
        assert int(sample_token(p.log(), temperature=1.0, top_p=1.0, seed=4, position=pos)) == int((p / e).argmax())
        assert int(sample_token(q.log(), temperature=1.0, top_p=1.0, seed=4, position=pos)) == int((q / e).argmax())


@pytest.mark.parametrize("cache", CACHES)
def test_typical_at_temperature_zero_equals_greedy(cache, models):
    model = models["llama"]
    ref = plain_tokens(model, 40, cache=cache)
    heads = OracleHeads(model, PROMPT + ref + [0] * 8)
    cfg = DecodeConfig(cache=cache, max_new_tokens=40, stop_on_eos=False, temperature=0.0)
    a = run_method(model, PROMPT, method="medusa-typical", heads=heads, tree=TREES["mc_sim_7b_63"], config=cfg)
    b = run_method(model, PROMPT, method="medusa-greedy", heads=heads, tree=TREES["mc_sim_7b_63"], config=cfg)
    assert a.tokens == b.tokens == ref
    assert [s.accept_length for s in a.steps] == [s.accept_length for s in b.steps]


@pytest.mark.parametrize("cache", CACHES)
def test_typical_acceptance_runs_and_sampled_root_is_seeded(cache, models):
    model = models["qwen2"]
    heads = random_heads(4)
    tree = TREES["cartesian-3x2x2"]
    cfg = DecodeConfig(cache=cache, max_new_tokens=30, stop_on_eos=False, temperature=0.8, sample_root=True, seed=7)
    a = run_method(model, PROMPT, method="medusa-typical", heads=heads, tree=tree, config=cfg).tokens
    b = run_method(model, PROMPT, method="medusa-typical", heads=heads, tree=tree, config=cfg).tokens
    c = run_method(
        model,
        PROMPT,
        method="medusa-typical",
        heads=heads,
        tree=tree,
        config=DecodeConfig(
            cache=cache, max_new_tokens=30, stop_on_eos=False, temperature=0.8, sample_root=True, seed=8
        ),
    ).tokens
    assert a == b and len(a) == 30
    assert a != c


def test_plain_sampling_is_seeded_and_respects_top_p(models):
    model = models["llama"]
    cfg = DecodeConfig(max_new_tokens=20, stop_on_eos=False, temperature=1.0, top_p=0.9, seed=3)
    a = run_method(model, PROMPT, method="plain", config=cfg).tokens
    assert a == run_method(model, PROMPT, method="plain", config=cfg).tokens
    # top_p -> 0 keeps only the most likely token: sampling becomes greedy
    tiny = run_method(
        model,
        PROMPT,
        method="plain",
        config=DecodeConfig(max_new_tokens=20, stop_on_eos=False, temperature=1.0, top_p=1e-6),
    ).tokens
    assert tiny == plain_tokens(model, 20)


# ------------------------------------------------------------------ tiny temperatures
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("temperature", [5e-324, 1e-46, 1e-45, 1e-40, 1e-30, 1e-8])
def test_tiny_temperatures_tend_to_greedy_and_never_make_nan(cache, models, temperature):
    """softmax(logits / T) overflowed to NaN for T ~ 1e-40 and typical acceptance silently accepted
    nothing; a T that rounds to 0 in float32 (1e-46) made 0 / 0 = NaN and every column
    drew token 0. The tempered distribution is now the argmax's one-hot in the limit, and every
    method at such a T writes greedy's tokens."""
    from medusa_lib.core.acceptance import tempered_probs

    model = models["llama"]
    logits = torch.tensor([[3.0, -1.0, 2.5, 3.0, -torch.inf], [0.0, 0.0, 0.0, 0.0, 0.0], [-80.0, 90.0, 1.0, 0.0, -5.0]])
    p = tempered_probs(logits, temperature)
    assert torch.isfinite(p).all()
    assert torch.equal(p, torch.tensor([[0.5, 0.0, 0.0, 0.5, 0.0], [0.2] * 5, [0.0, 1.0, 0.0, 0.0, 0.0]]))
    ref = plain_tokens(model, 24, cache=cache)
    heads = OracleHeads(model, PROMPT + ref + [0] * 8)
    cfg = DecodeConfig(cache=cache, max_new_tokens=24, temperature=temperature, sample_root=True, stop_on_eos=False)
    typical = run_method(model, PROMPT, method="medusa-typical", heads=heads, tree=TREES["mc_sim_7b_63"], config=cfg)
    # accepts like greedy, does not stall at 1.0
    assert typical.tokens == ref and typical.tokens_per_step > 2
    assert run_method(model, PROMPT, method="plain", config=cfg).tokens == ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1e-30, 1.1754944e-38, 1e-40, 1e-46, 0.0])
def test_tempered_probs_at_a_tiny_temperature_is_the_argmax_in_every_dtype(dtype, temperature):
    """1e-30 is the page's least temperature (Settings.check): it, and anything smaller down to a T
    that float32 rounds to 0, gives the argmax's one-hot from logits of every dtype, never NaN."""
    from medusa_lib.core.acceptance import tempered_probs

    logits = torch.tensor([[3.0, -1.0, 2.5, -60000.0], [0.0, 0.0, 1e-3, -1e-3], [-7.0, 8.0, 7.5, 0.0]]).to(dtype)
    want = torch.nn.functional.one_hot(logits.float().argmax(-1), 4).float()
    # the dynamic and the static step's T
    for t in (temperature, torch.tensor(temperature, dtype=torch.float32)):
        p = tempered_probs(logits, t)
        assert p.dtype == torch.float32 and torch.equal(p, want), (dtype, temperature, p)


def test_infinite_or_nan_temperature_is_refused():
    for t in (float("inf"), float("nan"), -1.0):
        with pytest.raises(DecodeError, match="temperature must be 0 .greedy. or a finite positive number"):
            DecodeConfig(temperature=t).check()
