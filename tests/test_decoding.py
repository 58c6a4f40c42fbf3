"""Decoders: tree attention maths, exact greedy equivalence, cache compaction, the decoder's tree buffers and
step records, root- and path-conditioned heads. Exact sampling is in test_decoding_sampling.py, the acceptance
rules in test_decoding_acceptance.py, stopping and refusals in test_decoding_limits.py."""

import pytest
import torch
from conftest import OracleHeads, make_model, random_heads
from decoding_helpers import ARCHS, CACHES, N_NEW, PROMPT, TREES, model_for, plain_tokens

from medusa_lib import DecodeConfig, build_tree, chain_choices
from medusa_lib.core.caches import compact_cache, new_cache
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.tree import tree_attention_bias, with_lookup


# ------------------------------------------------------------------ tree forward maths
# lookup 4: the tree plus a lookup branch of 4 nodes (tree.with_lookup)
@pytest.mark.parametrize("lookup", [0, 4])
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


# ------------------------------------------------------------------ exact greedy
@pytest.mark.parametrize("cache", CACHES)
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
    # [0, 1, x]: only the last slot moves
    first_child_path = next(r for r in tree.retrieve_indices if r[1] == 1 and r[2] > 2)
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


def test_decoder_holds_one_tree_buffers_value_per_tree(models):
    model = models["llama"]
    tree = TREES["cartesian-3x2x2"]
    dec = make_decoder(model, method="medusa-greedy", heads=random_heads(4), tree=tree, config=DecodeConfig(lookup=3))
    # the drafter's shape: the heads' tree with the lookup chain of 3 beside it
    assert (
        dec.tree.num_nodes == tree.num_nodes + 3
        and dec.tree.cpu.tree_indices.device.type == "cpu"
        and dec.tree.bias.dtype == next(model.parameters()).dtype
    )
    # the branch holds the tree with a chain of every length (a match may be shorter)
    trees = dec.drafter.trees
    assert dec.root_tree.num_nodes == 1 and sorted(trees) == [1, 2, 3] and trees[3] is dec.tree
    assert all(b.cpu.lookup == c and b.num_nodes == tree.num_nodes + c for c, b in trees.items())
    assert (
        make_decoder(model, method="medusa-greedy", heads=random_heads(4), tree=tree).tree.num_nodes == tree.num_nodes
    )
    assert make_decoder(model).tree is None


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
    dec = make_decoder(
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
        # after the last (cut) step, a draft nobody verifies
        assert nodes == tree.num_nodes and (root == emitted[-1] or step.finish_reason)
    for step, (_, _, tokens) in zip(res.steps[1:], drafts):
        assert step.tree_token_ids == tokens.tolist()
