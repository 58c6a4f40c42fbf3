"""The EAGLE drafter: the dynamic tree by hand, and the Medusa guarantees on its trees (tiny models, float32)."""

import pytest
import torch
from conftest import make_model
from eagle_helpers import ARCHS, N_NEW, PROMPT, TREE, eagle_setups, plain, sampling

from medusa_lib import DecodeConfig, DecodeError
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.dynamic_tree import (
    Candidates,
    DynamicTreeConfig,
    DynamicTreeError,
    as_medusa_tree,
    expand_level,
    select_tree,
)
from medusa_lib.core.eagle import EagleError, new_eagle_head
from medusa_lib.core.eagle_io import load_eagle


# ------------------------------------------------------------------ the dynamic tree, by hand
def hand_candidates() -> Candidates:
    """top-k 2, depth 2: level 1 = tokens 10 (log q -0.1), 11 (-1.0); level 2 = two children of each."""
    return Candidates(
        tokens=torch.tensor([10, 11, 20, 21, 22, 23]),
        scores=torch.tensor([-0.1, -1.0, -0.3, -2.0, -1.2, -3.0]),
        parents=torch.tensor([-1, -1, 0, 0, 1, 1]),
        depths=torch.tensor([1, 1, 2, 2, 2, 2]),
    )


def test_expand_level_keeps_the_k_children_with_the_best_cumulative_log_probability():
    logp = torch.tensor([[-0.2, -1.9, -5.0], [-0.2, -2.0, -9.0]])
    columns, values, chosen, rows = expand_level(torch.tensor([-0.1, -1.0]), logp, 2)
    assert columns.tolist() == [0, 1, 0, 1]
    assert values.tolist() == pytest.approx([-0.3, -2.0, -1.2, -3.0])
    assert chosen.tolist() == [0, 2] and rows.tolist() == [0, 1]  # -0.3 under the first node, -1.2 under the second


def test_select_tree_keeps_the_best_nodes_and_builds_mask_positions_and_paths():
    tree = select_tree(torch.tensor(7), hand_candidates(), num_nodes=3, depth=2)  # keeps -0.1, -0.3, -1.0
    assert tree.tokens.tolist() == [7, 10, 11, 20]
    assert tree.parents.tolist() == [0, 0, 0, 1]
    assert tree.attn_mask.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert tree.position_ids.tolist() == [0, 1, 1, 2]
    assert tree.retrieve_indices.tolist() == [[0, -1, -1], [0, 1, -1], [0, 2, -1], [0, 1, 3]]
    tree = select_tree(torch.tensor(7), hand_candidates(), num_nodes=4, depth=2)  # ... and -1.2 (token 22 under 11)
    assert tree.tokens.tolist() == [7, 10, 11, 20, 22]
    assert tree.parents.tolist() == [0, 0, 0, 1, 2]
    assert tree.attn_mask[4].tolist() == [1, 0, 1, 0, 1]
    assert tree.retrieve_indices[4].tolist() == [0, 2, 4]
    medusa = as_medusa_tree(tree, top_k=2)
    assert medusa.choices == ((0,), (1,), (0, 0), (1, 0)) and medusa.children == ((1, 2), (3,), (4,), (), ())


def test_a_parent_always_ranks_above_its_child_even_when_the_child_adds_log_probability_zero():
    cand = Candidates(
        torch.tensor([10, 11, 20, 21]),
        torch.tensor([-0.5, -2.0, -0.5, -3.0]),
        torch.tensor([-1, -1, 0, 0]),
        torch.tensor([1, 1, 2, 2]),
    )
    assert select_tree(torch.tensor(7), cand, num_nodes=1, depth=2).tokens.tolist() == [7, 10]
    assert select_tree(torch.tensor(7), cand, num_nodes=2, depth=2).tokens.tolist() == [7, 10, 20]


def test_bad_dynamic_trees_are_refused_with_one_sentence():
    with pytest.raises(DynamicTreeError, match="keeps between 1 and 6 nodes"):
        DynamicTreeConfig(top_k=2, depth=2, num_nodes=7).check()
    with pytest.raises(DynamicTreeError, match="top-k must be between 1 and 32"):
        DynamicTreeConfig(top_k=0).check()


@pytest.fixture(scope="module")
def setups():
    return eagle_setups()


# ------------------------------------------------------------------ exactness
@pytest.mark.parametrize("lookup", [0, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_eagle_greedy_equals_plain_greedy_and_model_generate(setups, arch, lookup):
    model, trained, random = setups[arch]
    ref = model.generate(
        torch.tensor([PROMPT]), max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(PROMPT) :].tolist()
    assert plain(model, N_NEW) == ref
    for head in (random, trained):
        res = run_method(
            model,
            PROMPT,
            method="medusa-greedy",
            eagle=head,
            config=DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False, lookup=lookup),
        )
        assert res.tokens == ref and res.finish_reason == "length"
    assert res.tokens_per_step > 2.0  # the drafter foresees the model: several tokens a step
    for s in res.steps[1:]:
        assert s.drafter == "eagle" and s.tree.num_nodes == TREE.num_nodes + 1 + (s.tree.lookup or 0)
        assert len(s.accepted_nodes) == s.accept_length + 1
        assert [s.tree_token_ids[j] for j in s.accepted_nodes[1:]] == list(s.tokens[: s.accept_length])


@pytest.mark.parametrize("arch", ARCHS)
def test_eagle_exact_sampling_equals_plain_sampling_with_the_same_seed(setups, arch):
    model, trained, random = setups[arch]
    for head, seed, temperature, top_p, lookup in [
        (trained, 0, 0.9, 1.0, 0),
        (trained, 5, 0.9, 1.0, 3),
        (trained, 2, 1.3, 0.9, 0),
        (trained, 3, 0.3, 1.0, 0),
        (random, 4, 0.9, 1.0, 0),
    ]:
        ref = run_method(model, PROMPT, method="plain", config=sampling(seed, N_NEW, temperature, top_p)).tokens
        res = run_method(
            model, PROMPT, method="medusa-sample", eagle=head, config=sampling(seed, N_NEW, temperature, top_p, lookup)
        )
        assert res.tokens == ref, (seed, temperature, top_p, lookup)
        if temperature == 0.3:  # near the greedy text the drafter was trained on: the walk descends into the tree
            assert sum(s.accept_length for s in res.steps) >= 3


@pytest.mark.parametrize("arch", ARCHS)
def test_eagle_typical_acceptance_runs_on_the_dynamic_tree(setups, arch):
    model, trained, _ = setups[arch]
    greedy = run_method(
        model,
        PROMPT,
        method="medusa-typical",
        eagle=trained,
        config=DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False, temperature=0.0),
    )
    assert greedy.tokens == plain(model, N_NEW)  # T -> 0: the rule is greedy matching
    cfg = DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False, temperature=0.8, sample_root=True, seed=7, lookup=3)
    a = run_method(model, PROMPT, method="medusa-typical", eagle=trained, config=cfg)
    assert (
        a.tokens == run_method(model, PROMPT, method="medusa-typical", eagle=trained, config=cfg).tokens
        and len(a.tokens) == N_NEW
    )
    assert a.tokens_per_step > 1.2


def test_budget_and_context_cut_exactly_as_plain_decoding(setups):
    model, trained, _ = setups["llama"]
    ref = plain(model, N_NEW)
    for n in (1, 5, 13):
        res = run_method(
            model,
            PROMPT,
            method="medusa-greedy",
            eagle=trained,
            config=DecodeConfig(max_new_tokens=n, stop_on_eos=False),
        )
        assert res.tokens == ref[:n] and res.finish_reason == "length"
    model.config.max_position_embeddings = 30  # the context ends 23 tokens after the prompt
    try:
        res = run_method(
            model,
            PROMPT,
            method="medusa-greedy",
            eagle=trained,
            config=DecodeConfig(max_new_tokens=200, stop_on_eos=False, lookup=3),
        )
        assert res.tokens == ref[:23] and res.finish_reason == "context"
    finally:
        model.config.max_position_embeddings = 512
    eos = ref[9]
    model.generation_config.eos_token_id = eos
    try:
        res = run_method(
            model, PROMPT, method="medusa-greedy", eagle=trained, config=DecodeConfig(max_new_tokens=N_NEW)
        )
        assert res.tokens == ref[: ref.index(eos) + 1] and res.finish_reason == "eos"
    finally:
        model.generation_config.eos_token_id = None


def test_saved_heads_load_back_and_draft_the_same(setups, tmp_path):
    model, trained, _ = setups["qwen2"]
    trained.save(tmp_path / "eagle")
    loaded = load_eagle(tmp_path / "eagle", model=model)
    cfg = DecodeConfig(max_new_tokens=N_NEW, stop_on_eos=False)
    a = run_method(model, PROMPT, method="medusa-greedy", eagle=trained, config=cfg)
    b = run_method(model, PROMPT, method="medusa-greedy", eagle=loaded, config=cfg)
    assert [s.tree_token_ids for s in a.steps[1:]] == [s.tree_token_ids for s in b.steps[1:]]
    with pytest.raises(EagleError, match="has a qwen2 layer but the model is a llama"):
        load_eagle(tmp_path / "eagle", model=setups["llama"][0])
    with pytest.raises(EagleError, match="No EAGLE head at"):
        load_eagle(tmp_path, model=model)


def test_models_without_rotary_layers_are_refused():
    with pytest.raises(EagleError, match="needs a decoder with rotary position embeddings"):
        new_eagle_head(make_model("gpt2"))


def test_plain_ignores_the_drafter_and_medusa_still_needs_heads(setups):
    model, trained, _ = setups["llama"]
    assert make_decoder(model, method="plain", eagle=trained).drafter is None
    with pytest.raises(DecodeError, match="needs Medusa heads and a tree"):
        make_decoder(model, method="medusa-greedy")


def test_the_draft_loop_reads_nothing_back_to_the_host(setups):
    """EAGLE's depth loop and EAGLE-2's selection stay on the device (fixed shapes, device-side
    top-k), so a captured step can take them later: no host read inside ``EagleRun.draft``."""
    from fused_helpers import HOST_READS

    from medusa_lib.core.eagle_run import EagleRun
    from medusa_lib.pipeline.profile_step import OpCounter

    model, head, _ = setups["llama"]
    cfg = DecodeConfig(max_new_tokens=12, stop_on_eos=False)
    run_method(
        model, PROMPT, method="medusa-greedy", eagle=head, tree=TREE, config=cfg
    )  # one-off set-up (the CPU projection's packing check) before watching
    log, draft = OpCounter(), EagleRun.draft

    def watched(self, root):
        log.inside = True
        try:
            return draft(self, root)
        finally:
            log.inside = False

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EagleRun, "draft", watched)
        with log:
            run_method(model, PROMPT, method="medusa-greedy", eagle=head, tree=TREE, config=cfg)
    inside = {name for (where, name) in log.counts if where == "inside"}
    assert "topk" in inside and not (inside & (HOST_READS | {"boolean-index"})), sorted(
        inside & (HOST_READS | {"boolean-index"})
    )
