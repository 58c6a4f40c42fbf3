"""The whole-step program of the static engine (core/fused.py): its structure, held on the CPU.

Exactness with the static cache (greedy == model.generate, exact sampling == plain sampling, every
preset, lookup on and off, the budget and context cuts) runs in test_decoding.py and test_static.py,
where every exactness test takes both caches. Here: a step reads nothing back to the host and the
loop reads once per step (a dispatch-mode counter), dynamo traces a step as one graph with no
break, the device lookup branch equals the host one, the keyed sampling noise, and the capture's
bookkeeping, device placement and failure path with a stand-in for torch.cuda."""

import contextlib
import os
from collections import Counter
from dataclasses import replace

import pytest
import torch
from conftest import make_model, random_heads

from medusa_lib import DecodeConfig, Decoder, build_tree, cartesian_choices, run_method
from medusa_lib.core import fused
from medusa_lib.core.acceptance import race_noise, sample_token
from medusa_lib.core.kv import StaticKV
from medusa_lib.core.lookup import ngram_proposal
from medusa_lib.pipeline.profile_step import OpCounter

PROMPT = [1, 17, 33, 250, 99, 4, 61, 17, 33, 250]
TREE = build_tree(cartesian_choices([3, 2, 2]))
HOST_READS = {"_local_scalar_dense", "item", "equal", "is_nonzero", "nonzero", "masked_select", "allclose"}
READ_BOUND = 3  # aten ops outside the program per decode step: the read of the result row (slice, .tolist())
HOST_MADE = {
    "lift_fresh",
    "detach_",
}  # CPU tensors the step records make from the row (Step.tree_tokens): host memory, no device op


@pytest.fixture(scope="module")
def llama():
    return make_model("llama")


@pytest.fixture(scope="module")
def heads():
    return random_heads(3, shared=True, path=True)


def decoder(model, heads, method="medusa-greedy", *, lookup=3, temperature=0.0, n=24, kv=None, top_p=1.0):
    cfg = DecodeConfig(
        max_new_tokens=n,
        stop_on_eos=False,
        cache="static",
        lookup=lookup,
        temperature=temperature,
        top_p=top_p,
        seed=5,
        sample_root=True,
    )
    return Decoder(
        model,
        method=method,
        heads=None if method == "plain" else heads,
        tree=None if method == "plain" else TREE,
        config=cfg,
        static_kv=kv,
    )


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
def test_a_step_reads_nothing_back_and_the_loop_reads_once_per_step(
    llama, heads, monkeypatch, method, lookup, temperature
):
    log = OpCounter()  # aten ops by (inside or outside the step, name)
    step = fused.Program.step

    def watched(self):
        log.inside = True
        try:
            step(self)
        finally:
            log.inside = False

    monkeypatch.setattr(fused.Program, "step", watched)
    dec = decoder(llama, heads, method, lookup=lookup, temperature=temperature)
    it = dec.steps(PROMPT)
    next(it)  # the prefill (eager, reads its first token)
    with log:
        steps = list(it)
    inside = {name for (where, name) in log.counts if where == "inside"}
    outside = Counter(
        {name: n for (where, name), n in log.counts.items() if where == "outside" and name not in HOST_MADE}
    )
    assert inside and not (inside & (HOST_READS | {"boolean-index"})), sorted(inside & (HOST_READS | {"boolean-index"}))
    assert sum(outside.values()) <= READ_BOUND * len(steps), (sum(outside.values()) / len(steps), sorted(outside))
    assert outside["resolve_conj"] == len(steps)  # one read (.tolist() of the result row) per step
    assert outside["_to_copy"] + outside["copy_"] <= len(steps)  # on CUDA: one device-to-host copy per step


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
    tree, root = fused.programs(dec, kv)
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
    tree, _ = fused.programs(dec, kv)
    assert heads.proposal_projection(llama.lm_head) in next(k for k, p in kv.programs.items() if p is tree)[5]
    torch._dynamo.reset()
    with torch.inference_mode():
        explanation = torch._dynamo.explain(tree.step)()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def host_chain(history: list[int], c: int, drafted: list[int], top1: list[int], root: int) -> tuple[list[int], int]:
    """The lookup branch as the dynamic path builds it (lookup.ngram_proposal), padded as static steps pad it."""
    chain = ngram_proposal(torch.tensor(history), length=c).tolist()
    out = (chain + [drafted[j] for j in top1[len(chain) :]])[:c]
    out += [out[-1] if out else root] * (c - len(out))
    return out, len(chain)


@torch.inference_mode()  # the state's buffers are a run's (inference tensors)
def test_the_device_lookup_branch_equals_the_host_one(llama, heads):
    dec = decoder(llama, heads, lookup=4, n=8)
    kv = StaticKV(llama, max_len=128)
    dec.static_kv = kv
    dec.run(PROMPT)
    tree, _ = fused.programs(dec, kv)
    g = torch.Generator().manual_seed(0)
    drafted = torch.randint(0, 300, (TREE.num_nodes,), generator=g)
    for trial in range(200):
        n = int(torch.randint(2, 60, (1,), generator=g))
        history = torch.randint(0, 4 if trial % 2 else 12, (n,), generator=g)  # small alphabets: many matches
        kv.state.history.fill_(7)
        kv.state.history[:n] = history
        got, matched = tree._chain(drafted, history[-1:], torch.tensor([n]))
        want = host_chain(history.tolist(), 4, drafted.tolist(), list(dec.top1_nodes), int(history[-1]))
        assert (got.tolist(), int(matched)) == want, (history.tolist(), got.tolist(), want)


def test_sampling_noise_is_a_function_of_seed_and_position():
    a = race_noise(3, torch.arange(4000), 64)
    assert torch.equal(a, race_noise(3, torch.arange(4000), 64)) and not torch.equal(a[0], race_noise(4, 0, 64))
    assert (
        (a > 0).all() and abs(float(a.mean()) - 1) < 0.01 and abs(float((a > 1).float().mean()) - 0.3679) < 0.005
    )  # Exp(1)
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


class FakeCuda:
    """Stands in for torch.cuda in StaticKV.record: records where the capture runs, and "replays"
    by calling ``replay`` (the program's eager step), or fails where told to."""

    def __init__(self, replay=None, fail: str | None = None):
        self.devices, self.streams, self.modes, self.replay, self.fail = [], [], [], replay, fail

    def device(self, dev):
        self.devices.append(torch.device(dev))
        return contextlib.nullcontext()

    def Stream(self, dev):  # noqa: N802
        self.streams.append(torch.device(dev))
        return self

    def current_stream(self, dev):
        return self

    def wait_stream(self, other):
        pass

    def stream(self, s):
        return contextlib.nullcontext()

    def CUDAGraph(self):  # noqa: N802
        outer = self

        class Graph:
            def replay(self):
                if outer.replay:
                    outer.replay()

            def pool(self):
                return None

        return Graph()

    @contextlib.contextmanager
    def graph(self, g, *, pool=None, stream=None, capture_error_mode="global"):
        self.modes.append(capture_error_mode)
        if self.fail:
            raise RuntimeError(self.fail)
        yield


@torch.inference_mode()  # as a run captures (Decoder.steps)
def test_a_capture_is_kept_only_when_it_succeeded_and_its_replay_matches(llama, heads):
    ref = run_method(llama, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=24, stop_on_eos=False)).tokens
    kv = StaticKV(llama, max_len=128)
    dec = decoder(llama, heads, kv=kv)
    dec.run(PROMPT)
    kv.capture = "cuda-graph"  # as on a GPU; the stand-in records instead
    tree, root = fused.programs(dec, kv)
    fake = FakeCuda(fail="operation not permitted when stream is capturing")
    with pytest.raises(RuntimeError, match="not permitted"):
        fused.ready(dec, kv, graphs=fake)
    assert (
        not tree.captured and not root.captured and kv.prefill is None and fake.streams == [kv.device]
    )  # the cache's one side stream, on its device
    assert fake.modes == ["thread_local"] * 2  # the prefill's chunk (prompts then run eagerly), the first step
    stale = FakeCuda(replay=lambda: None)  # a graph that does nothing: its result differs from the eager step's
    with pytest.raises(RuntimeError, match="differs"):
        root.capture(graphs=stale)
    assert not root.captured
    good = {p: FakeCuda(replay=p.step) for p in (tree, root)}
    for p, fake in good.items():
        p.capture(graphs=fake)
        assert (
            p.captured and set(fake.devices) == {kv.device} and fake.streams == [] and fake.modes == ["thread_local"]
        )  # every capture reuses that stream (one pool)
    res = dec.run(PROMPT)  # the "graphs" replay: same tokens, labelled captured
    assert res.tokens == ref and res.engine == "static, cuda-graph"


def test_a_failed_compile_is_not_tried_again(llama, heads, monkeypatch):
    """A compile that fails (minutes, on a real model) fails once: later runs of that program take
    the dynamic cache at once, with the same sentence."""
    calls = []

    def broken(fn, **kw):
        calls.append(kw)
        raise RuntimeError("inductor cannot lower this op")

    monkeypatch.setattr(torch, "compile", broken)
    kv = StaticKV(llama, max_len=128)
    kv.capture = "compile"
    dec = decoder(llama, heads, kv=kv)
    first, second = dec.run(PROMPT), dec.run(PROMPT)
    assert first.engine == second.engine == "dynamic" and len(calls) == 1
    assert (
        dec.note == "Capturing this run's step failed (RuntimeError: inductor cannot lower this op), "
        "so it runs with the dynamic cache."
    )


def test_a_run_whose_capture_fails_runs_on_the_dynamic_cache_and_says_so(llama, heads, monkeypatch):
    ref = run_method(llama, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=24, stop_on_eos=False)).tokens
    kv = StaticKV(llama, max_len=128)
    kv.capture = "cuda-graph"
    real = fused.ready
    monkeypatch.setattr(
        "medusa_lib.core.decoding.ready", lambda d, k: real(d, k, graphs=FakeCuda(fail="out of memory"))
    )
    dec = decoder(llama, heads, kv=kv)
    res = dec.run(PROMPT)
    assert res.tokens == ref and res.engine == "dynamic"
    assert dec.note.startswith("Capturing this run's step failed (RuntimeError: out of memory)")
    assert kv.claim()  # released for the next run
    kv.release()


def test_the_labs_measured_costs_time_the_engine_that_serves(llama):
    from medusa_lib.core.lab import step_costs

    kv = StaticKV(llama, max_len=128)
    rows = step_costs(llama, sizes=[1, 4, 9], prefix=40, repeats=1, static_kv=kv)
    assert [r["tokens"] for r in rows] == [1, 4, 9] and {r["engine"] for r in rows} == {"static"}
    assert rows[0]["vs_one_token"] == 1.0 and all(r["body_ms"] > 0 for r in rows)
    assert kv.claim()  # given back
    held = step_costs(
        llama, sizes=[1, 2], prefix=8, repeats=1, static_kv=kv
    )  # busy: the dynamic forward is timed instead
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
    monkeypatch.setattr(fused, "MAX_PROGRAMS", 3)
    kv = StaticKV(llama, max_len=128)
    trees = [build_tree(cartesian_choices(shape)) for shape in ([2], [3], [2, 2], [3, 2])]
    cfg = DecodeConfig(max_new_tokens=12, stop_on_eos=False, cache="static")
    reference = run_method(llama, PROMPT, method="plain", config=replace(cfg, cache="dynamic")).tokens
    for tree in trees + trees[:1]:
        dec = Decoder(llama, method="medusa-greedy", heads=heads, tree=tree, config=cfg, static_kv=kv)
        assert dec.run(PROMPT).tokens == reference
        own = {k[3] for k in kv.programs}
        assert (
            len(kv.programs) <= 3 and tree.choices in own and () in own
        )  # this run's tree and root-only programs stay
    assert [k[3] for k in kv.programs] == [trees[3].choices, (), trees[0].choices]  # least recently used first


def test_a_compiling_engine_keeps_every_layers_cache_whole(llama):
    """Under capture "compile" the layers' K and V are not views of one store: Inductor copies a whole
    tensor whose view a compiled graph writes, every step (seen in its output code)."""
    compiling, eager = StaticKV(llama, max_len=64, capture="compile"), StaticKV(llama, max_len=64)
    compiling.bind(), eager.bind()
    assert compiling.store is None and all(
        t._base is None for layer in compiling.cache.layers for t in (layer.keys, layer.values)
    )
    assert eager.store is not None and all(layer.keys._base is eager.store for layer in eager.cache.layers)


@torch.inference_mode()
def test_on_a_gpu_a_failed_compile_falls_back_to_a_graph_of_the_eager_step_and_says_so(llama, heads, monkeypatch):
    """capture "compile" on CUDA (the stand-in): a step Inductor cannot compile is recorded eager
    instead, its run keeps generate's tokens on the static engine and carries one sentence, and the
    engine line counts it."""
    ref = run_method(llama, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=24, stop_on_eos=False)).tokens

    def broken(fn, **kw):
        raise RuntimeError("inductor cannot lower this op")

    kv = StaticKV(llama, max_len=128, capture="compile")
    monkeypatch.setattr(torch, "compile", broken)
    dec = decoder(llama, heads, kv=kv)
    tree, root = fused.programs(dec, kv)
    fakes = {p: FakeCuda(replay=p.step) for p in (tree, root)}
    for p, fake in fakes.items():
        p.capture(graphs=fake)
    assert all(p.graph is not None and p.compiled is None for p in (tree, root)) and all(
        f.modes == ["thread_local"] for f in fakes.values()
    )
    assert tree.note == (
        "torch.compile failed on a 25-token step (RuntimeError: inductor cannot lower this op), "
        "so that step replays its eager kernels in one CUDA graph."
    )
    res = dec.run(PROMPT)
    assert res.tokens == ref and res.engine == "static, compile" and dec.note == tree.note
    assert "(2 fell back to eager kernels: see the run notes)" in kv.describe()


@pytest.mark.slow
@torch.inference_mode()
def test_inductors_compiled_step_recorded_in_one_graph_gives_generates_tokens(llama, heads, monkeypatch):
    """The GPU default, held on the CPU: each program compiled by Inductor (no CUDA graphs of its
    own), warmed up, then recorded by the engine (the stand-in replays what was recorded: the
    compiled step); the replay leaves the state the compiled call does, and runs give generate's
    tokens with no recompile."""
    import torch._dynamo

    ref = run_method(llama, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=24, stop_on_eos=False)).tokens
    made, real = [], fused.Program._compile

    def spy(self, stand_in):
        made.append((self, real(self, stand_in)))
        return made[-1][1]

    monkeypatch.setattr(fused.Program, "_compile", spy)
    kv = StaticKV(llama, max_len=128, capture="compile")
    medusa, plain_dec = decoder(llama, heads, kv=kv), decoder(llama, heads, "plain", lookup=0, kv=kv)
    for d in (medusa, plain_dec):
        for p in fused.programs(d, kv):
            if p is not None and not p.captured:
                p.capture(graphs=FakeCuda(replay=lambda p=p: dict(made)[p]()))
    assert len(made) == 2 and all(p.graph is not None and p.note is None for p, _ in made)
    torch._dynamo.config.error_on_recompile = True
    try:
        for d in (medusa, plain_dec, medusa):
            res = d.run(PROMPT)
            assert res.tokens == ref and res.engine == "static, compile"
    finally:
        torch._dynamo.config.error_on_recompile = False
    assert "compiled by Inductor" in kv.describe()


@torch.inference_mode()
def test_each_program_says_when_it_starts_compiling_and_how_long_it_took(llama, heads, monkeypatch):
    """A compile can take a minute a program on a GPU: the start-up log hears each one (the compile is
    the eager step here, so the test takes milliseconds)."""
    kv = StaticKV(llama, max_len=128, capture="compile")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    said = []
    assert fused.ready(decoder(llama, heads, kv=kv), kv, say=said.append) is None
    assert (
        said[0] == "Compiling the 25-token medusa-greedy step..."
        and said[2] == "Compiling the 1-token medusa-greedy step..."
    )
    assert all(line.startswith(("  the 25-token medusa-greedy step: ", "  the 1-token")) for line in said[1::2])
    said.clear()
    fused.ready(decoder(llama, heads, kv=kv), kv, say=said.append)
    assert said == []  # compiled once


def test_a_compiling_engine_keeps_inductors_files_beside_the_models_cache(llama, monkeypatch, tmp_path):
    """Later starts reuse Inductor's on-disk caches, so they live in the project's cache folder (not /tmp,
    emptied at a reboot) unless the user chose a folder."""
    from medusa_lib.core.kv import prepare_engine
    from medusa_lib.core.model import CACHE_DIR

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # so that the teardown restores what was there
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    prepare_engine(llama, cache="static", capture="none", max_len=64)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # only a compiling engine
    prepare_engine(llama, cache="static", capture="compile", max_len=64)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(CACHE_DIR / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    prepare_engine(llama, cache="static", capture="compile", max_len=64)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)


@pytest.mark.slow
@torch.inference_mode()
def test_a_second_start_finds_the_compiled_steps_in_inductors_on_disk_cache(llama, heads, monkeypatch, tmp_path):
    """Two starts of the same engine (dynamo's memory emptied between them): the second one's programs
    come from Inductor's FX graph cache on disk."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    seconds = []
    for start in range(2):
        torch._dynamo.reset()
        counters.clear()
        kv = StaticKV(llama, max_len=128, capture="compile")
        fused.ready(decoder(llama, heads, kv=kv), kv)
        seconds.append(kv.capture_seconds)
        hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
        assert (hits, misses) == ((0, 2) if start == 0 else (2, 0)), (start, hits, misses)
    print(f"compile at the first start {seconds[0]:.1f} s, at the second {seconds[1]:.1f} s")


class FailingOnce(FakeCuda):
    """The stand-in whose first capture fails (a compiled step that cannot be recorded), later ones succeed."""

    def graph(self, g, **kw):
        fail, self.fail = self.fail, None
        if fail:
            self.modes.append(kw.get("capture_error_mode"))
            raise RuntimeError(fail)
        return super().graph(g, **kw)


@torch.inference_mode()
def test_on_a_gpu_a_compiled_step_that_cannot_be_recorded_falls_back_to_a_graph_of_the_eager_step(
    llama, heads, monkeypatch
):
    ref = run_method(llama, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=24, stop_on_eos=False)).tokens
    kv = StaticKV(llama, max_len=128, capture="compile")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: lambda: fn())  # compiles: a function of its own
    dec = decoder(llama, heads, kv=kv)
    tree, root = fused.programs(dec, kv)
    for p in (tree, root):
        p.capture(graphs=FailingOnce(replay=p.step, fail="Cannot copy between CPU and CUDA tensors during capture"))
        assert p.graph is not None and p.failed is not None
    assert tree.note == (
        "Recording the compiled 25-token step failed (RuntimeError: Cannot copy between CPU and CUDA tensors "
        "during capture), so that step replays its eager kernels in one CUDA graph."
    )
    res = dec.run(PROMPT)
    assert res.tokens == ref and res.engine == "static, compile" and dec.note == tree.note
    assert "(2 fell back to eager kernels: see the run notes)" in kv.describe()
