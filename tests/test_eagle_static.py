"""The EAGLE draft inside the static engine's step (core/eagle_static.py, fused.Program with a new tree every
step): the same trees, tokens and records as the dynamic run, exact against plain decoding, one program
that reads nothing back, traced as one graph, captured and checked, compiled by Inductor (tiny models,
float32, on the CPU)."""

import random

import pytest
import torch
from eagle_helpers import ARCHS, N_NEW, PROMPT, TREE, eagle_setups, plain, sampling
from fused_helpers import HOST_READS, READ_BOUND, FakeCuda, step_ops

from medusa_lib import DecodeConfig
from medusa_lib.core import static_run
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.eagle import new_eagle_head
from medusa_lib.core.kv import StaticKV
from medusa_lib.core.prefill import Prefill
from medusa_lib.core.tree import children_tensor
from medusa_lib.core.tree.parents import ancestry, children_of, tree_of_parents

METHODS = {
    "medusa-greedy": {},
    "medusa-sample": dict(temperature=0.9, seed=5),
    "medusa-typical": dict(temperature=0.9, seed=5),
}


@pytest.fixture(scope="module")
def setups():
    return eagle_setups()


def config(cache: str, method: str = "medusa-greedy", *, lookup: int = 0, n: int = N_NEW) -> DecodeConfig:
    return DecodeConfig(
        max_new_tokens=n, stop_on_eos=False, cache=cache, lookup=lookup, record_detail=True, **METHODS[method]
    )


def records(res, *, trees: bool = True) -> list[tuple]:
    """What each step did (and, with ``trees``, the tree it verified, its tokens and the winning row)."""
    out = []
    for s in res.steps:
        row = (s.tokens, s.accept_length, s.lookup_accepted, s.finish_reason)
        if trees:
            row += (s.draft_tokens, s.draft_depth, s.tree and s.tree.parents, s.tree_token_ids, s.best_path)
        out.append(row)
    return out


def static_decoder(model, head, method="medusa-greedy", *, lookup=0, kv=None, n=N_NEW):
    return make_decoder(
        model, method=method, eagle=head, config=config("static", method, lookup=lookup, n=n), static_kv=kv
    )


# ------------------------------------------------------------------ the tree from its parents
def random_parents(rng: random.Random, n: int, depth: int) -> tuple[int, ...]:
    """A random tree of n nodes besides the root, at most ``depth`` levels, parents before children."""
    level, parents = [0], [0]
    for j in range(1, n + 1):
        p = rng.choice([k for k in range(j) if level[k] < depth])
        parents.append(p), level.append(level[p] + 1)
    return tuple(parents)


def test_the_device_tree_from_parents_is_the_host_tree_of_the_records():
    """What a captured step builds from the parents (mask, positions, one path per node, children) is the
    tree its records hold (``tree_of_parents``, plain Python), for random trees, a lookup chain included."""
    rng = random.Random(0)
    for _ in range(40):
        depth, n, lookup = rng.randint(1, 5), rng.randint(1, 20), rng.choice([0, 0, 3])
        parents = random_parents(rng, n, depth)
        if lookup:
            # a chain under the root, each node under the one before
            parents += (0, *range(len(parents), len(parents) + lookup - 1))
            depth = max(depth, lookup)
        seen, position_ids, retrieve = ancestry(torch.tensor(parents), depth)
        host = tree_of_parents(parents, width=depth + 1, top_k=2, lookup=lookup)
        assert torch.equal(seen.long(), host.attn_mask) and torch.equal(position_ids, host.position_ids)
        assert torch.equal(retrieve, host.retrieve_indices) and host.lookup == lookup
        kids = children_of(torch.tensor(parents))
        want = children_tensor(host.children)
        assert torch.equal(kids[:, : want.shape[1]], want) and bool((kids[:, want.shape[1] :] == -1).all())


# ------------------------------------------------------------------ exactness and the same trees
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_captured_step_drafts_the_dynamic_runs_trees_and_keeps_exactness(setups, arch, method):
    """Every step verifies the tree the dynamic run drafts (parents, tokens, winning row), accepts what it
    accepts, and greedy equals plain greedy, exact sampling plain sampling with the seed."""
    model, trained, _ = setups[arch]
    dynamic = run_method(model, PROMPT, method=method, eagle=trained, config=config("dynamic", method))
    static = run_method(model, PROMPT, method=method, eagle=trained, config=config("static", method))
    assert static.engine == "static" and dynamic.engine == "dynamic"
    assert records(static) == records(dynamic)
    assert all(s.tree.name == "eagle-dynamic" and s.tree.num_nodes == TREE.num_nodes + 1 for s in static.steps[1:])
    if method == "medusa-greedy":
        # long paths accepted: the trees do the work
        assert static.tokens == plain(model, N_NEW) and static.tokens_per_step > 2
    if method == "medusa-sample":
        want = run_method(model, PROMPT, method="plain", config=sampling(5, N_NEW)).tokens
        assert static.tokens == want


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ARCHS)
def test_beside_the_lookup_branch_both_engines_read_the_chain_one_way(setups, arch, method):
    """The branch's chain sits after the EAGLE tree in the one program (its nodes past the match dead):
    tokens, accept lengths and lookup tokens are the dynamic run's, and greedy is still plain greedy."""
    model, trained, _ = setups[arch]
    prompt = PROMPT + PROMPT  # a repeat: the chain finds matches
    dynamic = run_method(model, prompt, method=method, eagle=trained, config=config("dynamic", method, lookup=3))
    static = run_method(model, prompt, method=method, eagle=trained, config=config("static", method, lookup=3))
    assert records(static, trees=False) == records(dynamic, trees=False)
    assert all(s.tree.lookup == 3 and s.tree.num_nodes == TREE.num_nodes + 4 for s in static.steps[1:])
    if method == "medusa-greedy":
        assert static.tokens == plain(model, N_NEW, prompt=prompt)


@torch.inference_mode()
def test_the_recorded_prefill_hands_the_draft_every_prompt_row(setups):
    """On a GPU the prompt runs in recorded chunks (the stand-in records here): the draft's cache still gets
    every prompt row's features, so the trees are the dynamic run's."""
    model, trained, _ = setups["llama"]
    prompt = PROMPT * 4
    kv = StaticKV(model, max_len=128)
    kv.bind()
    pf = Prefill(kv)
    pf.record(graphs=FakeCuda(replay=lambda: pf.chunk(pf.ids[pf.recording]) if pf.recording else None))
    for size, graph in pf.graphs.items():
        graph.replay = lambda size=size: pf.chunk(pf.ids[size])
    kv.prefill = pf
    dec = static_decoder(model, trained, kv=kv)
    dynamic = run_method(model, prompt, method="medusa-greedy", eagle=trained, config=config("dynamic"))
    assert records(dec.run(prompt)) == records(dynamic)


def test_an_eagle3_head_runs_on_the_dynamic_cache_and_says_so(setups):
    """An EAGLE-3 head reads other layers' inputs through hooks, which a captured step would not run."""
    model = setups["llama"][0]
    head = new_eagle_head(model, tree=TREE, fuse_layers=(0, 1)).eval()
    dec = make_decoder(model, method="medusa-greedy", eagle=head, config=config("static"))
    assert dec.note == (
        "An EAGLE-3 head (it reads the inputs of several layers) runs with the dynamic cache only; "
        "this run uses the dynamic cache."
    )
    res = dec.run(PROMPT)
    assert res.engine == "dynamic" and res.tokens == plain(model, N_NEW)


# ------------------------------------------------------------------ one program, no host read
@pytest.mark.parametrize("method,lookup", [("medusa-greedy", 0), ("medusa-sample", 3), ("medusa-typical", 3)])
def test_a_step_reads_nothing_back_and_the_loop_reads_once_per_step(setups, method, lookup):
    """The whole draft (the accepted path into the head's cache, every level, the tree's selection) runs
    inside the step: no host read there, and one read of the result row per step outside."""
    model, trained, _ = setups["qwen2"]
    inside, outside, steps = step_ops(static_decoder(model, trained, method, lookup=lookup).steps(PROMPT))
    assert inside and not (inside & (HOST_READS | {"boolean-index"}))
    assert sum(outside.values()) <= READ_BOUND * steps, sorted(outside)
    assert outside["resolve_conj"] == steps


@pytest.mark.parametrize("method,lookup", [("medusa-greedy", 0), ("medusa-sample", 3)])
def test_dynamo_traces_the_whole_eagle_step_as_one_graph(setups, method, lookup):
    import torch._dynamo

    model, trained, _ = setups["llama"]
    kv = StaticKV(model, max_len=96)
    dec = static_decoder(model, trained, method, lookup=lookup, kv=kv, n=8)
    dec.run(PROMPT)
    tree, _ = static_run.programs(dec, kv)
    torch._dynamo.reset()
    with torch.inference_mode():
        explanation = torch._dynamo.explain(tree.step)()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@torch.inference_mode()
def test_the_program_is_captured_checked_and_shared_by_later_decoders(setups):
    """A recording whose replay leaves another state (the tree's parents included) is refused; a good one is
    kept, and a later decoder of the same head and tree reuses the program (its draft cache too)."""
    model, trained, _ = setups["llama"]
    kv = StaticKV(model, max_len=96)
    kv.capture = "cuda-graph"  # as on a GPU; the stand-in records instead
    dec = static_decoder(model, trained, kv=kv)
    tree, root = static_run.programs(dec, kv)
    with pytest.raises(RuntimeError, match="differs from the step's"):
        tree.capture(graphs=FakeCuda(replay=lambda: None))
    for p in (tree, root):
        p.capture(graphs=FakeCuda(replay=p.step))
    assert tree.graph is not None and tree.parents is not None
    ref = plain(model, N_NEW)
    first = dec.run(PROMPT)
    again = static_decoder(model, trained, kv=kv)
    assert static_run.programs(again, kv)[0] is tree and len(kv.programs) == 2
    second = again.run(PROMPT)
    assert first.tokens == second.tokens == ref and first.engine == "static, cuda-graph"
    assert records(first) == records(second)


def test_each_program_drafts_with_its_own_state_whatever_cache_a_run_gets(setups):
    """A decoder without a shared cache gets a static cache of its own size every run: each of those
    programs gets its own draft state, so a long prompt after a short one still drafts the dynamic run's
    trees (one state across caches would put verified pairs in the draft slots, or past the cache)."""
    model, trained, _ = setups["qwen2"]
    dec = static_decoder(model, trained)
    for length in (4, 70, 120):
        prompt = (PROMPT * 20)[:length]
        dynamic = run_method(model, prompt, method="medusa-greedy", eagle=trained, config=config("dynamic"))
        assert records(dec.run(prompt)) == records(dynamic)


@pytest.mark.slow
@torch.inference_mode()
@pytest.mark.parametrize("lookup", [0, 3])
def test_inductors_compiled_eagle_step_gives_the_eager_steps_tokens(setups, lookup):
    """The GPU default held on the CPU: the step, draft included, compiled by Inductor (one graph, no
    recompile across runs) gives plain greedy's tokens and the eager step's accept lengths."""
    import torch._dynamo

    model, trained, _ = setups["llama"]
    kv = StaticKV(model, max_len=96, capture="compile")
    dec = static_decoder(model, trained, lookup=lookup, kv=kv)
    for p in static_run.programs(dec, kv):
        p.capture()
    eager = run_method(model, PROMPT, method="medusa-greedy", eagle=trained, config=config("static", lookup=lookup))
    torch._dynamo.config.error_on_recompile = True
    try:
        runs = [dec.run(PROMPT) for _ in range(2)]
    finally:
        torch._dynamo.config.error_on_recompile = False
    for res in runs:
        assert res.engine == "static, compile" and res.tokens == plain(model, N_NEW)
        assert [s.accept_length for s in res.steps] == [s.accept_length for s in eager.steps]
