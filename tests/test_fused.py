"""The whole-step program of the static engine (core/fused.py): its structure, held on the CPU.

Exactness with the static cache (greedy == model.generate, exact sampling == plain sampling, every
preset, lookup on and off, the budget and context cuts) runs in the test_decoding*.py files and
test_static.py, where every exactness test takes both caches. Here: a step reads nothing back to the
host and the loop reads once per step (a dispatch-mode counter), dynamo traces a step as one graph
with no break, the device lookup branch equals the host one, the keyed sampling noise, the lab's and
the profile tool's measures, and the bounded cache of programs. The capture's bookkeeping, device
placement and failure path are in test_fused_capture.py."""

from dataclasses import replace

import pytest
import torch
from fused_helpers import HOST_READS, PROMPT, READ_BOUND, TREE, decoder, step_ops

from medusa_lib import DecodeConfig, build_tree, cartesian_choices
from medusa_lib.core import static_run
from medusa_lib.core.acceptance import race_noise, sample_token
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.kv import StaticKV
from medusa_lib.core.lookup import lookup_chain, ngram_proposal


@pytest.mark.parametrize(
    "method,lookup,temperature",
    [
        ("medusa-greedy", 3, 0.0),
        ("medusa-greedy", 0, 0.0),
        ("medusa-sample", 3, 0.9),
        ("medusa-typical", 3, 0.9),
        ("plain", 0, 0.9),
    ],
)
def test_a_step_reads_nothing_back_and_the_loop_reads_once_per_step(llama, heads, method, lookup, temperature):
    dec = decoder(llama, heads, method, lookup=lookup, temperature=temperature)
    inside, outside, steps = step_ops(dec.steps(PROMPT))
    assert inside and not (inside & (HOST_READS | {"boolean-index"})), sorted(inside & (HOST_READS | {"boolean-index"}))
    assert sum(outside.values()) <= READ_BOUND * steps, (sum(outside.values()) / steps, sorted(outside))
    # one read (.tolist() of the result row) per step
    assert outside["resolve_conj"] == steps
    # on CUDA: one device-to-host copy per step
    assert outside["_to_copy"] + outside["copy_"] <= steps


@pytest.mark.parametrize(
    "method,lookup,temperature,top_p",
    [
        ("medusa-greedy", 3, 0.0, 1.0),
        ("medusa-sample", 0, 0.9, 0.8),
        ("medusa-typical", 3, 0.9, 1.0),
        ("plain", 0, 0.0, 1.0),
    ],
)
def test_dynamo_traces_a_whole_step_as_one_graph(llama, heads, method, lookup, temperature, top_p):
    import torch._dynamo

    dec = decoder(llama, heads, method, lookup=lookup, temperature=temperature, top_p=top_p, n=8)
    kv = StaticKV(llama, max_len=64)
    dec.static_kv = kv
    assert kv.claim()
    kv.release()
    dec.run(PROMPT)  # a real state to trace from
    tree, root = static_run.programs(dec, kv)
    prog = tree or root
    torch._dynamo.reset()
    with torch.inference_mode():  # as a run calls it (Decoder.steps)
        explanation = torch._dynamo.explain(prog.step)()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_heads_with_a_proposal_vocabulary_trace_as_one_graph_too(llama):
    """The shipped heads project onto 8,192 proposal tokens through a projection built once: it is
    built before the step is traced, which then only reads it (no data-pointer check, no new
    Parameter inside the graph), and a program keeps the projection it was traced with."""
    import torch._dynamo

    from medusa_lib.core.heads import HeadsConfig, MedusaHeads

    torch.manual_seed(3)
    heads = MedusaHeads(
        HeadsConfig(
            hidden_size=llama.config.hidden_size,
            vocab_size=llama.get_output_embeddings().weight.shape[0],
            num_heads=3,
            shared_lm_head=True,
            num_proposal_tokens=64,
        )
    ).eval()
    dec = decoder(llama, heads, lookup=0, n=8)
    kv = StaticKV(llama, max_len=64)
    dec.static_kv = kv
    dec.run(PROMPT)
    tree, _ = static_run.programs(dec, kv)
    assert heads.proposal_projection(llama.lm_head) in next(k for k, p in kv.programs.items() if p is tree)[-1]
    torch._dynamo.reset()
    with torch.inference_mode():
        explanation = torch._dynamo.explain(tree.step)()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_the_device_lookup_chain_holds_the_host_match_and_no_more():
    """``lookup.lookup_chain`` (a captured step's fixed chain) holds what ``ngram_proposal`` (the
    dynamic decoder's chain) holds, in a buffer longer than the history; its other nodes are dead."""
    g = torch.Generator().manual_seed(0)
    buffer = torch.full((80,), 7)
    for trial in range(200):
        n = int(torch.randint(2, 60, (1,), generator=g))
        # small alphabets: many matches
        history = torch.randint(0, 4 if trial % 2 else 12, (n,), generator=g)
        buffer.fill_(7)
        buffer[:n] = history
        chain, matched = lookup_chain(buffer, torch.tensor([n]), 4)
        want = ngram_proposal(history, length=4).tolist()
        assert int(matched) == len(want) and chain[: len(want)].tolist() == want, (history.tolist(), want)


@pytest.mark.parametrize("method, temperature", [("medusa-typical", 0.8), ("medusa-sample", 0.8), ("medusa-greedy", 0)])
def test_both_engines_read_the_lookup_branch_one_way(llama, heads, method, temperature):
    """The captured step verifies a fixed chain with the nodes past the match dead; the dynamic
    decoder verifies the match alone: the same tokens, accepted paths and lookup tokens every step,
    typical acceptance included."""
    loop = [5, 6, 7, 8, 9] * 4
    runs = {
        cache: make_decoder(
            llama,
            method=method,
            heads=heads,
            tree=TREE,
            config=DecodeConfig(
                max_new_tokens=40, temperature=temperature, seed=1, lookup=3, cache=cache, stop_on_eos=False,
                sample_root=method == "medusa-typical",
            ),
        ).run(loop)
        for cache in ("dynamic", "static")
    }  # fmt: skip
    rows = {c: [(s.tokens, s.accept_length, s.lookup_accepted) for s in r.steps] for c, r in runs.items()}
    assert rows["dynamic"] == rows["static"]
    # every captured step verified the whole chain
    assert all(s.tree.lookup == 3 for s in runs["static"].steps[1:])


def test_sampling_noise_is_a_function_of_seed_and_position():
    a = race_noise(3, torch.arange(4000), 64)
    assert torch.equal(a, race_noise(3, torch.arange(4000), 64)) and not torch.equal(a[0], race_noise(4, 0, 64))
    # Exp(1)
    assert (a > 0).all() and abs(float(a.mean()) - 1) < 0.01 and abs(float((a > 1).float().mean()) - 0.3679) < 0.005
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    counts = torch.bincount(
        torch.stack([sample_token(p.log(), temperature=1.0, top_p=1.0, seed=9, position=i) for i in range(20000)]),
        minlength=4,
    )
    assert ((counts / 20000 - p).abs() <= 5 * (p * (1 - p) / 20000).sqrt() + 1e-3).all(), counts
    logits = torch.randn(100)
    assert int(sample_token(logits, temperature=0.7, top_p=1.0, seed=1, position=12)) == int(
        sample_token(logits, temperature=0.7, top_p=1.0, seed=1, position=12)
    )


def test_the_static_engine_samples_what_plain_sampling_draws(llama, heads):
    ref = run_method(
        llama,
        PROMPT,
        method="plain",
        config=DecodeConfig(max_new_tokens=30, stop_on_eos=False, temperature=0.9, seed=5),
    ).tokens
    for method in ("plain", "medusa-sample"):
        for lookup in (0, 3):
            assert (
                decoder(llama, heads, method, lookup=lookup if method != "plain" else 0, temperature=0.9, n=30)
                .run(PROMPT)
                .tokens
                == ref
            )


def test_the_labs_measured_costs_time_the_engine_that_serves(llama):
    from medusa_lib.core.lab import step_costs

    kv = StaticKV(llama, max_len=128)
    rows = step_costs(llama, sizes=[1, 4, 9], prefix=40, repeats=1, static_kv=kv)
    assert [r["tokens"] for r in rows] == [1, 4, 9] and {r["engine"] for r in rows} == {"static"}
    assert rows[0]["vs_one_token"] == 1.0 and all(r["body_ms"] > 0 for r in rows)
    assert kv.claim()  # given back
    # busy: the dynamic forward is timed instead
    held = step_costs(llama, sizes=[1, 2], prefix=8, repeats=1, static_kv=kv)
    kv.release()
    assert "engine" not in held[0]


def test_the_profile_tool_counts_what_a_step_costs_the_host(llama, heads):
    from medusa_lib.pipeline.profile_step import dispatch_profile

    dec = decoder(llama, heads, lookup=3, n=20)
    row = dispatch_profile(dec, PROMPT, skip=2)
    assert row["steps"] >= 3 and row["host reads inside the step"] == []
    assert 0 < row["aten ops outside the step, per step"] <= READ_BOUND


def test_the_shared_cache_keeps_a_bounded_number_of_programs_least_recently_used_out(llama, heads, monkeypatch):
    """Many custom trees on one server: the oldest programs (and the heads and trees they hold, on a
    GPU their graphs) are let go beyond MAX_PROGRAMS, never the run's own; a run that needs an evicted
    program builds it again and still gives generate's tokens."""
    monkeypatch.setattr(static_run, "MAX_PROGRAMS", 3)
    kv = StaticKV(llama, max_len=128)
    trees = [build_tree(cartesian_choices(shape)) for shape in ([2], [3], [2, 2], [3, 2])]
    cfg = DecodeConfig(max_new_tokens=12, stop_on_eos=False, cache="static")
    reference = run_method(llama, PROMPT, method="plain", config=replace(cfg, cache="dynamic")).tokens
    for tree in trees + trees[:1]:
        dec = make_decoder(llama, method="medusa-greedy", heads=heads, tree=tree, config=cfg, static_kv=kv)
        assert dec.run(PROMPT).tokens == reference
        own = {k[3] for k in kv.programs}
        # this run's tree and root-only programs stay
        assert len(kv.programs) <= 3 and tree.choices in own and () in own
    assert [k[3] for k in kv.programs] == [trees[3].choices, (), trees[0].choices]  # least recently used first
