"""Decoders: tree attention maths, exact greedy equivalence, cache compaction, acceptance rules."""

import pytest
import torch
from conftest import OracleHeads, make_model, pairwise, random_heads

from medusa_lib import (
    DecodeConfig,
    DecodeError,
    Decoder,
    ModelError,
    build_tree,
    cartesian_choices,
    chain_choices,
    get_tree,
    run_method,
)
from medusa_lib.core.attention import use_packed_gqa
from medusa_lib.core.decoding import (
    compact_cache,
    greedy_accept,
    greedy_tokens,
    new_cache,
    race_noise,
    sample_token,
    sample_walk,
    sampling_probs,
    typical_accept,
    typical_threshold,
    typical_threshold_of_entropy,
)
from medusa_lib.core.model import model_info
from medusa_lib.core.tree import tree_attention_bias, with_lookup

PROMPT = [1, 17, 33, 250, 99, 4, 61]
N_NEW = 64
TREES = {
    "chain-4": build_tree(chain_choices(4)),
    "cartesian-3x2x2": build_tree(cartesian_choices([3, 2, 2])),
    "mc_sim_7b_63": get_tree("mc_sim_7b_63"),
}
CACHES = ["dynamic", "static"]  # every exactness test runs with both kinds of KV cache (core/kv.py)
ARCHS = [
    "llama",
    "qwen2",
    "gpt2",
    "llama-packed",
]  # llama-packed: GQA through medusa_lib.core.attention (as load_model sets up on CPU)


def model_for(arch: str, attn: str = "sdpa"):
    if arch.endswith("-packed"):
        model = make_model(arch.removesuffix("-packed"), attn=attn)
        assert use_packed_gqa(model) == (attn == "sdpa")
        return model
    return make_model(arch, attn=attn)


@pytest.fixture(scope="module")
def models():
    return {arch: model_for(arch) for arch in ARCHS}


def plain_tokens(model, n=N_NEW, prompt=PROMPT, *, cache="dynamic"):
    return run_method(
        model, prompt, method="plain", config=DecodeConfig(max_new_tokens=n, stop_on_eos=False, cache=cache)
    ).tokens


# ------------------------------------------------------------------ tree forward maths
@pytest.mark.parametrize("lookup", [0, 4])  # 4: the tree plus a lookup branch of 4 nodes (tree.with_lookup)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_logits_equal_per_path_sequential_logits(arch, attn, lookup):
    model = model_for(arch, attn=attn)
    tree = with_lookup(TREES["mc_sim_7b_63"], lookup)
    body, lm_head = model.base_model, model.lm_head
    torch.manual_seed(3)
    tree_tokens = torch.randint(3, 300, (tree.num_nodes,))
    prompt = torch.tensor([PROMPT])
    with torch.no_grad():
        cache = new_cache()
        body(input_ids=prompt, past_key_values=cache, use_cache=True)
        P = prompt.shape[1]
        mask = torch.cat([torch.zeros(tree.num_nodes, P), tree_attention_bias(tree, torch.float32)], dim=1)[None, None]
        tree_logits = lm_head(
            body(
                input_ids=tree_tokens[None],
                attention_mask=mask,
                position_ids=(tree.position_ids + P)[None],
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state[0]
        )
        for row in tree.retrieve_indices.tolist():
            nodes = [j for j in row if j >= 0]
            seq = torch.cat([prompt[0], tree_tokens[nodes]])[None]
            ref = model(input_ids=seq).logits[0, P:]
            assert torch.allclose(tree_logits[nodes], ref, atol=1e-4), (arch, attn, row)


@pytest.mark.parametrize("cache", CACHES)
# ------------------------------------------------------------------ exact greedy
@pytest.mark.parametrize("arch", ARCHS)
def test_plain_greedy_equals_model_generate(cache, models, arch):
    model = models[arch]
    ref = model.generate(
        torch.tensor([PROMPT]), max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(PROMPT) :].tolist()
    assert plain_tokens(model, cache=cache) == ref
    assert len(ref) == N_NEW


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("tree_name", TREES)
@pytest.mark.parametrize("arch", ARCHS)
def test_medusa_greedy_equals_plain_greedy_with_random_heads(cache, models, arch, tree_name):
    model = models[arch]
    heads = random_heads(4, shared=arch != "gpt2")
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=heads,
        tree=TREES[tree_name],
        config=DecodeConfig(cache=cache, max_new_tokens=N_NEW, stop_on_eos=False),
    )
    assert res.tokens == plain_tokens(model, cache=cache)
    assert res.finish_reason == "length"


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("tree_name", TREES)
@pytest.mark.parametrize("arch", ARCHS)
def test_medusa_greedy_equals_plain_greedy_with_rigged_heads(cache, models, arch, tree_name):
    model = models[arch]
    ref = plain_tokens(model, N_NEW + 8, cache=cache)
    heads = OracleHeads(model, PROMPT + ref)
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=heads,
        tree=TREES[tree_name],
        config=DecodeConfig(cache=cache, max_new_tokens=N_NEW, stop_on_eos=False),
    )
    assert res.tokens == ref[:N_NEW]
    # The rigged heads put the true token at rank 0 or 1: the chain follows rank 0 only,
    # the wider trees also reach rank-1 tokens, so they accept longer paths.
    longest = max(s.accept_length for s in res.steps[1:])
    if tree_name == "chain-4":
        assert res.tokens_per_step > 1.2
    elif tree_name == "cartesian-3x2x2":
        assert res.tokens_per_step > 2.5 and longest == 3
    else:
        assert res.tokens_per_step > 3.0 and longest >= 3
    for s in res.steps[1:]:
        assert len(s.tokens) == s.accept_length + 1 or s.finish_reason
        assert s.tree is not None and len(s.accepted_nodes) == s.accept_length + 1
        assert [s.tree_token_ids[j] for j in s.accepted_nodes[1:]] == list(s.tokens[: s.accept_length])


@pytest.mark.parametrize("cache", CACHES)
def test_greedy_equals_generate_for_qwen2_and_gqa_llama_in_one_chain(cache, models):
    # The three ways agree: model.generate == plain == Medusa greedy (63-node tree)
    model = models["llama"]
    gen = model.generate(
        torch.tensor([PROMPT]), max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(PROMPT) :].tolist()
    med = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=random_heads(4),
        tree=TREES["mc_sim_7b_63"],
        config=DecodeConfig(cache=cache, max_new_tokens=N_NEW, stop_on_eos=False),
    ).tokens
    assert gen == med


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
    assert len(set(rows)) == len(rows) == 12  # 4 x 3 pairs need 12 rows at least: the fewest possible
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
        for s in res.steps[1:]:  # the record's path is the walk's: its tokens are the accepted ones
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
    logits[0, 5] = logits[1, 2] = logits[3, 4] = 30.0  # (near) one-hot: 5 at the root, then 2, then 4 at the leaf
    assert sample_walk(logits, tokens, tree.children, **draw) == ([0, 1, 3], 4)  # at a leaf the draw is the bonus
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
    assert probs[3] == 0 and probs[2] == 0 and probs[:2].sum() == pytest.approx(1.0)  # {0, 1} holds >= 0.8 of the mass
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


# ------------------------------------------------------------------ cache compaction
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("accepted", ["moved", "last-moved", "in-place-root", "in-place-first-child"])
def test_cache_after_compaction_equals_a_fresh_cache_of_the_accepted_path(models, arch, accepted):
    model = models[arch]
    tree = TREES["mc_sim_7b_63"]
    torch.manual_seed(5)
    tree_tokens = torch.randint(3, 300, (tree.num_nodes,))
    prompt = torch.tensor([PROMPT])
    P = prompt.shape[1]
    row = tree.retrieve_indices[7]
    # root + 2 accepted that must move; or nodes already in place (only the crop runs)
    first_child_path = next(
        r for r in tree.retrieve_indices if r[1] == 1 and r[2] > 2
    )  # [0, 1, x]: only the last slot moves
    nodes = {
        "moved": row[row >= 0][:3],
        "last-moved": first_child_path[:3],
        "in-place-root": torch.tensor([0]),
        "in-place-first-child": torch.tensor([0, 1]),
    }[accepted]
    n = len(nodes)
    with torch.no_grad():
        cache = new_cache()
        model.base_model(input_ids=prompt, past_key_values=cache, use_cache=True)
        mask = torch.cat([torch.zeros(tree.num_nodes, P), tree_attention_bias(tree, torch.float32)], dim=1)[None, None]
        model.base_model(
            input_ids=tree_tokens[None],
            attention_mask=mask,
            position_ids=(tree.position_ids + P)[None],
            past_key_values=cache,
            use_cache=True,
        )
        assert cache.get_seq_length() == P + tree.num_nodes
        compact_cache(cache, P, nodes, tree.num_nodes)
        assert cache.get_seq_length() == P + n
        fresh = new_cache()
        model.base_model(
            input_ids=torch.cat([prompt[0], tree_tokens[nodes]])[None], past_key_values=fresh, use_cache=True
        )
        for a, b in zip(cache.layers, fresh.layers):
            # Keys carry their (rotary or learned) positions: equal keys mean equal positions.
            assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)


def test_compaction_when_every_node_is_kept_does_not_crop():
    model = make_model("llama")
    tree = build_tree(chain_choices(2))
    with torch.no_grad():
        cache = new_cache()
        model.base_model(input_ids=torch.tensor([PROMPT + [5, 6, 7]]), past_key_values=cache, use_cache=True)
        compact_cache(cache, len(PROMPT), torch.tensor([0, 1, 2]), tree.num_nodes)
    assert cache.get_seq_length() == len(PROMPT) + 3


# ------------------------------------------------------------------ acceptance rules
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_tokens_is_the_argmax_and_ties_go_to_the_first_index(dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 1000).to(dtype)
    x[2, 7] = x[2, 9] = x[2].max() + 1  # a tie
    assert torch.equal(greedy_tokens(x), x.argmax(-1)) and int(greedy_tokens(x)[2]) == 7
    assert int(greedy_tokens(x[3])) == int(x[3].argmax())


def test_padded_slots_are_never_accepted():
    # Two paths: [0, 1, 2] and [0, 3, -1]. The model's argmax everywhere is token 0, and
    # padded slots gather tree position 0 whose token is 0 too: the padding must not pass.
    ri = torch.tensor([[0, 1, 2], [0, 3, -1]])
    tree_tokens = torch.tensor([0, 9, 9, 0])
    logits = torch.full((4, 10), -5.0)
    logits[:, 0] = 5.0
    valid = ri >= 0
    path_tokens = tree_tokens[ri.clamp(min=0)]
    acc, _ = greedy_accept(logits, path_tokens, ri.clamp(min=0), valid)
    assert acc.tolist() == [0, 1]
    acc_t, _ = typical_accept(logits, path_tokens, ri.clamp(min=0), valid, temperature=1.0, epsilon=0.09, delta=0.3)
    assert acc_t.tolist() == [0, 1]


def test_typical_threshold_rule_on_hand_made_distributions():
    V = 100
    uniform = torch.full((V,), 1.0 / V)
    peaked = torch.full((V,), 0.02 / (V - 1))
    peaked[7] = 0.98
    eps, delta = 0.09, 0.3
    # Uniform: H = log V, threshold = min(eps, delta / V) = 0.003 < 1/V = 0.01: any token passes.
    thr_u = typical_threshold(uniform, epsilon=eps, delta=delta)
    assert thr_u.item() == pytest.approx(delta / V, rel=1e-4)
    # Peaked: H ~ 0.13, delta*e^-H ~ 0.26 > eps: the hard threshold epsilon applies.
    thr_p = typical_threshold(peaked, epsilon=eps, delta=delta)
    assert thr_p.item() == pytest.approx(eps)
    logits = torch.log(torch.stack([uniform, peaked, peaked]))
    ri = torch.tensor([[0, 1, 2]])
    for tokens, expected in [([0, 55, 7], 2), ([0, 55, 8], 1), ([0, 55, 55], 1)]:
        path_tokens = torch.tensor([tokens])
        acc, _ = typical_accept(logits, path_tokens, ri, ri >= 0, temperature=1.0, epsilon=eps, delta=delta)
        assert acc.item() == expected, tokens
    # Lower temperature sharpens: at T=0.5 the uniform row stays uniform (still passes).
    acc, _ = typical_accept(logits, torch.tensor([[0, 55, 7]]), ri, ri >= 0, temperature=0.5, epsilon=eps, delta=delta)
    assert acc.item() == 2


def test_typical_ties_go_to_the_higher_log_probability_path():
    probs = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3], [1 / 3, 1 / 3, 1 / 3]])
    logits = probs.log()
    ri = torch.tensor([[0, 1], [0, 2]])
    path_tokens = torch.tensor([[0, 2], [0, 0]])  # path 0 proposes p=.2, path 1 proposes p=.5
    acc, score = typical_accept(logits, path_tokens, ri, ri >= 0, temperature=1.0, epsilon=0.09, delta=0.3)
    assert acc.tolist() == [1, 1] and int(score.argmax()) == 1


def test_one_threshold_formula_for_acceptance_and_the_page():
    import numpy as np

    from medusa_lib.present.page import threshold_curve

    probs = torch.softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3, dim=-1)
    entropy = -(probs * probs.log()).sum(-1)  # the paper's threshold, written out here: min(epsilon, delta * exp(-H))
    assert torch.allclose(
        typical_threshold(probs, epsilon=0.09, delta=0.3),
        torch.clamp(0.3 * torch.exp(-entropy), max=0.09),
        rtol=1e-6,
        atol=0,
    )
    assert torch.allclose(
        typical_threshold_of_entropy(entropy, epsilon=0.09, delta=0.3),
        torch.clamp(0.3 * torch.exp(-entropy), max=0.09),
        rtol=1e-6,
        atol=0,
    )
    h, thr = threshold_curve(epsilon=0.09, delta=0.3, vocab_size=50)
    assert isinstance(thr, np.ndarray) and thr == pytest.approx(np.minimum(0.09, 0.3 * np.exp(-h)), rel=1e-12)


@pytest.mark.parametrize("cache", CACHES)
# ------------------------------------------------------------------ stopping and limits
def test_stops_on_eos_and_reports_it(cache, models):
    model = models["llama"]
    ref = plain_tokens(model, 30, cache=cache)
    eos = ref[12]
    first = ref.index(eos)
    model.generation_config.eos_token_id = eos  # decoders read the EOS ids from the config each time
    try:
        for method, heads in [("plain", None), ("medusa-greedy", OracleHeads(model, PROMPT + ref + [0] * 8))]:
            res = run_method(
                model,
                PROMPT,
                method=method,
                heads=heads,
                tree=TREES["mc_sim_7b_63"],
                config=DecodeConfig(cache=cache, max_new_tokens=30),
            )
            assert res.tokens == ref[: first + 1] and res.finish_reason == "eos"
    finally:
        model.generation_config.eos_token_id = None


@pytest.mark.parametrize("cache", CACHES)
def test_stops_at_the_context_limit_with_the_same_tokens(cache):
    model = make_model("llama", max_position_embeddings=48)
    res_plain = run_method(
        model, PROMPT, method="plain", config=DecodeConfig(cache=cache, max_new_tokens=200, stop_on_eos=False)
    )
    assert len(PROMPT) + len(res_plain.tokens) == 48 and res_plain.finish_reason == "context"
    ref = res_plain.tokens
    heads = OracleHeads(model, PROMPT + ref + [0] * 8)
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=heads,
        tree=TREES["mc_sim_7b_63"],
        config=DecodeConfig(cache=cache, max_new_tokens=200, stop_on_eos=False),
    )
    assert res.tokens == ref and res.finish_reason == "context"


@pytest.mark.parametrize("cache", CACHES)
def test_max_new_tokens_is_exact_even_when_a_step_accepts_more(cache):
    model = make_model("llama")
    ref = plain_tokens(model, 40, cache=cache)
    heads = OracleHeads(model, PROMPT + ref + [0] * 8)
    for n in (1, 2, 5, 13):
        res = run_method(
            model,
            PROMPT,
            method="medusa-greedy",
            heads=heads,
            tree=TREES["mc_sim_7b_63"],
            config=DecodeConfig(cache=cache, max_new_tokens=n, stop_on_eos=False),
        )
        assert res.tokens == ref[:n] and res.finish_reason == "length"


@pytest.mark.parametrize("cache", CACHES)
def test_sliding_window_caps_the_context_with_a_clear_message(cache):
    model = make_model("mistral", sliding_window=32)
    long_prompt = list(range(3, 40))
    with pytest.raises(DecodeError, match="sliding-window attention of 32 tokens"):
        run_method(model, long_prompt, method="plain")
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=random_heads(4),
        tree=TREES["chain-4"],
        config=DecodeConfig(cache=cache, max_new_tokens=100, stop_on_eos=False),
    )
    assert len(PROMPT) + len(res.tokens) == 32 and res.finish_reason == "context"
    assert (
        res.tokens
        == run_method(
            model, PROMPT, method="plain", config=DecodeConfig(cache=cache, max_new_tokens=100, stop_on_eos=False)
        ).tokens
    )


def test_unsupported_attention_is_refused():
    model = make_model("llama")
    model.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ModelError, match="'linear_attention' layers"):
        Decoder(model)
    model2 = make_model("llama")
    model2.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ModelError, match="cannot take a tree mask"):
        Decoder(model2)


def test_model_info_follows_the_config_without_writing_on_the_model(monkeypatch):
    import gc
    import weakref

    import medusa_lib.core.model as M

    forwards = []
    real = M._check_lm_head_is_the_output
    monkeypatch.setattr(M, "_check_lm_head_is_the_output", lambda m: forwards.append(1) or real(m))
    model = make_model("llama")
    assert model_info(model).eos_token_ids == (2,) and model_info(model).context_limit == 512
    model.generation_config.eos_token_id = [5, 6]
    model.config.max_position_embeddings = 64
    assert (
        Decoder(model).info
        == model_info(model)
        == M.ModelInfo(context_limit=64, sliding_window=None, eos_token_ids=(5, 6))
    )
    assert len(forwards) == 1  # the tiny forward of the check runs once per model
    assert "_medusa_model_info" not in vars(model)  # nothing is cached on the model object
    assert model_info(model).context_limit == 64 and len(forwards) == 1
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None  # the cache does not keep a model alive


def test_decoder_holds_one_tree_buffers_value_per_tree(models):
    model = models["llama"]
    tree = TREES["cartesian-3x2x2"]
    dec = Decoder(model, method="medusa-greedy", heads=random_heads(4), tree=tree, config=DecodeConfig(lookup=3))
    assert (
        dec.tree.num_nodes == tree.num_nodes
        and dec.tree.cpu.tree_indices.device.type == "cpu"
        and dec.tree.bias.dtype == next(model.parameters()).dtype
    )
    assert dec.root_tree.num_nodes == 1 and sorted(dec.lookup_trees) == [1, 2, 3]
    assert all(b.cpu.lookup == c and b.num_nodes == tree.num_nodes + c for c, b in dec.lookup_trees.items())
    plain = Decoder(model)
    assert plain.tree is None and plain.lookup_trees == {}


def test_bad_settings_are_refused(models):
    model = models["llama"]
    with pytest.raises(DecodeError, match="Unknown method"):
        Decoder(model, method="beam")
    with pytest.raises(DecodeError, match="needs Medusa heads and a tree"):
        Decoder(model, method="medusa-greedy")
    with pytest.raises(DecodeError, match="tree is 4 levels deep but the heads only predict 2"):
        Decoder(model, method="medusa-greedy", heads=random_heads(2), tree=TREES["chain-4"])
    with pytest.raises(DecodeError, match="max_new_tokens must be between"):
        Decoder(model, config=DecodeConfig(max_new_tokens=0))
    with pytest.raises(DecodeError, match="temperature must be 0"):
        Decoder(model, config=DecodeConfig(temperature=-1))
    with pytest.raises(DecodeError, match="epsilon"):
        Decoder(model, config=DecodeConfig(posterior_threshold=1.5))
    with pytest.raises(DecodeError, match="prompt is empty"):
        run_method(model, [], method="plain")


def test_step_records_and_statistics(models):
    model = models["llama"]
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=random_heads(4),
        tree=TREES["cartesian-3x2x2"],
        config=DecodeConfig(max_new_tokens=16, stop_on_eos=False),
    )
    assert res.steps[0].kind == "prefill" and len(res.steps[0].tokens) == 1
    assert [s.index for s in res.steps] == list(range(len(res.steps)))
    for s in res.steps[1:]:
        assert set(s.phases) == {"propose", "verify", "accept", "commit"}
        assert s.seconds == pytest.approx(sum(s.phases.values()), rel=1e-6, abs=1e-6)
        assert len(s.tree_token_ids) == s.tree.num_nodes == TREES["cartesian-3x2x2"].num_nodes
        assert len(s.candidates) == s.tree.retrieve_indices.shape[0]
        with pytest.raises(Exception):
            s.tokens = ()  # frozen
    assert res.decode_tokens == 15 and res.tokens_per_step == pytest.approx(15 / res.decode_steps)
    lean = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=random_heads(4),
        tree=TREES["cartesian-3x2x2"],
        config=DecodeConfig(max_new_tokens=16, stop_on_eos=False, record_detail=False),
    )
    assert lean.tokens == res.tokens and all(s.tree is None for s in lean.steps)


@pytest.mark.parametrize("cache", CACHES)
def test_two_runs_never_share_state(cache, models):
    model = models["qwen2"]
    dec = Decoder(
        model,
        method="medusa-greedy",
        heads=random_heads(4),
        tree=TREES["chain-4"],
        config=DecodeConfig(cache=cache, max_new_tokens=20, stop_on_eos=False),
    )
    a, b = dec.steps(PROMPT), dec.steps(PROMPT[:4])
    interleaved_a, interleaved_b = [], []
    for sa, sb in zip(a, b):
        interleaved_a += sa.tokens
        interleaved_b += sb.tokens
    interleaved_a += [t for s in a for t in s.tokens]
    interleaved_b += [t for s in b for t in s.tokens]
    assert interleaved_a == dec.run(PROMPT).tokens
    assert interleaved_b == dec.run(PROMPT[:4]).tokens


@pytest.mark.parametrize("method", ["medusa-greedy", "medusa-typical"])
@pytest.mark.parametrize("arch", ARCHS)
def test_root_conditioned_heads_read_each_tree_root_and_greedy_stays_exact(models, arch, method):
    model = models[arch]
    heads = random_heads(4, shared=arch != "gpt2", root=True)
    seen = []
    real = heads.propose
    heads.propose = lambda h, lm_head, **kw: seen.append(kw["root_emb"].clone()) or real(h, lm_head, **kw)
    cfg = (
        DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False, temperature=0.9, sample_root=True, seed=5)
        if method == "medusa-typical"
        else DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False)
    )
    res = run_method(model, PROMPT, method=method, heads=heads, tree=TREES["cartesian-3x2x2"], config=cfg)
    if method == "medusa-greedy":
        assert res.tokens == plain_tokens(model)
    # every proposal read the embedding of the root of the tree it seeds: the last token emitted so
    # far (sampled, for typical acceptance at a temperature)
    emitted = [s.tokens for s in res.steps]
    assert len(seen) == len(res.steps) - 1  # no proposals after the last step
    W = model.get_input_embeddings().weight
    for i, e in enumerate(seen):
        so_far = [t for toks in emitted[: i + 1] for t in toks]
        assert torch.equal(e, W[so_far[-1]])


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("method", ["medusa-greedy", "medusa-typical"])
@pytest.mark.parametrize("arch", ARCHS)
def test_path_conditioned_heads_draft_each_tree_from_its_root_and_greedy_stays_exact(cache, models, arch, method):
    model = models[arch]
    heads = random_heads(4, shared=arch != "gpt2", path=True)
    drafts = []
    real = heads.draft
    heads.draft = lambda h, lm_head, tree, root, embed: (
        drafts.append((int(root), tree.num_nodes, real(h, lm_head, tree, root, embed))) or drafts[-1][2]
    )
    cfg = (
        DecodeConfig(cache=cache, max_new_tokens=N_NEW, stop_on_eos=False, temperature=0.9, sample_root=True, seed=5)
        if method == "medusa-typical"
        else DecodeConfig(cache=cache, max_new_tokens=N_NEW, stop_on_eos=False)
    )
    tree = TREES["cartesian-3x2x2"]
    res = run_method(model, PROMPT, method=method, heads=heads, tree=tree, config=cfg)
    if method == "medusa-greedy":
        assert res.tokens == plain_tokens(model, cache=cache)
    # one draft of the whole tree per step, rooted at the last token emitted so far, and verified as
    # drafted (the static engine's step program drafts the next tree after the last step too)
    assert len(drafts) == len(res.steps) - (cache == "dynamic")
    emitted = []
    for step, (root, nodes, tokens) in zip(res.steps, drafts):
        emitted += step.tokens
        assert nodes == tree.num_nodes and (
            root == emitted[-1] or step.finish_reason
        )  # after the last (cut) step, a draft nobody verifies
    for step, (_, _, tokens) in zip(res.steps[1:], drafts):
        assert step.tree_token_ids == tokens.tolist()


@pytest.mark.parametrize("cache", CACHES)
# ------------------------------------------------------------------ tiny temperatures
@pytest.mark.parametrize("temperature", [5e-324, 1e-46, 1e-45, 1e-40, 1e-30, 1e-8])
def test_tiny_temperatures_tend_to_greedy_and_never_make_nan(cache, models, temperature):
    """softmax(logits / T) overflowed to NaN for T ~ 1e-40 and typical acceptance silently accepted
    nothing (issue #17); a T that rounds to 0 in float32 (1e-46) made 0 / 0 = NaN and every column
    drew token 0. The tempered distribution is now the argmax's one-hot in the limit, and every
    method at such a T writes greedy's tokens."""
    from medusa_lib.core.decoding import tempered_probs

    model = models["llama"]
    logits = torch.tensor([[3.0, -1.0, 2.5, 3.0, -torch.inf], [0.0, 0.0, 0.0, 0.0, 0.0], [-80.0, 90.0, 1.0, 0.0, -5.0]])
    p = tempered_probs(logits, temperature)
    assert torch.isfinite(p).all()
    assert torch.equal(p, torch.tensor([[0.5, 0.0, 0.0, 0.5, 0.0], [0.2] * 5, [0.0, 1.0, 0.0, 0.0, 0.0]]))
    ref = plain_tokens(model, 24, cache=cache)
    heads = OracleHeads(model, PROMPT + ref + [0] * 8)
    cfg = DecodeConfig(cache=cache, max_new_tokens=24, temperature=temperature, sample_root=True, stop_on_eos=False)
    typical = run_method(model, PROMPT, method="medusa-typical", heads=heads, tree=TREES["mc_sim_7b_63"], config=cfg)
    assert typical.tokens == ref and typical.tokens_per_step > 2  # accepts like greedy, does not stall at 1.0
    assert run_method(model, PROMPT, method="plain", config=cfg).tokens == ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1e-30, 1.1754944e-38, 1e-40, 1e-46, 0.0])
def test_tempered_probs_at_a_tiny_temperature_is_the_argmax_in_every_dtype(dtype, temperature):
    """1e-30 is the page's least temperature (Settings.check): it, and anything smaller down to a T
    that float32 rounds to 0, gives the argmax's one-hot from logits of every dtype, never NaN."""
    from medusa_lib.core.decoding import tempered_probs

    logits = torch.tensor([[3.0, -1.0, 2.5, -60000.0], [0.0, 0.0, 1e-3, -1e-3], [-7.0, 8.0, 7.5, 0.0]]).to(dtype)
    want = torch.nn.functional.one_hot(logits.float().argmax(-1), 4).float()
    for t in (temperature, torch.tensor(temperature, dtype=torch.float32)):  # the dynamic and the static step's T
        p = tempered_probs(logits, t)
        assert p.dtype == torch.float32 and torch.equal(p, want), (dtype, temperature, p)


def test_infinite_or_nan_temperature_is_refused():
    for t in (float("inf"), float("nan"), -1.0):
        with pytest.raises(DecodeError, match="temperature must be 0 .greedy. or a finite positive number"):
            DecodeConfig(temperature=t).check()
