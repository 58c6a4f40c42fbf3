"""The capture of the static engine's whole-step programs (core/fused.py), held on the CPU with a stand-in
for torch.cuda: a capture is kept only when it succeeded and its replay matches, a failed capture or compile
falls back and says so, the compiling engine's cache layout and on-disk caches, and what it says while it
compiles."""

import os

import pytest
import torch
from fused_helpers import PROMPT, FakeCuda, decoder

from medusa_lib import DecodeConfig
from medusa_lib.core import fused, static_run
from medusa_lib.core.compose import run_method
from medusa_lib.core.kv import StaticKV


@torch.inference_mode()  # as a run captures (Decoder.steps)
def test_a_capture_is_kept_only_when_it_succeeded_and_its_replay_matches(llama, heads):
    ref = run_method(llama, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=24, stop_on_eos=False)).tokens
    kv = StaticKV(llama, max_len=128)
    dec = decoder(llama, heads, kv=kv)
    dec.run(PROMPT)
    kv.capture = "cuda-graph"  # as on a GPU; the stand-in records instead
    tree, root = static_run.programs(dec, kv)
    fake = FakeCuda(fail="operation not permitted when stream is capturing")
    with pytest.raises(RuntimeError, match="not permitted"):
        static_run.ready(dec, kv, graphs=fake)
    # the cache's one side stream, on its device
    assert not tree.captured and not root.captured and kv.prefill is None and fake.streams == [kv.device]
    # the prefill's chunk (prompts then run eagerly), the first step
    assert fake.modes == ["thread_local"] * 2
    # a graph that does nothing: its result differs from the eager step's
    stale = FakeCuda(replay=lambda: None)
    with pytest.raises(RuntimeError, match="differs"):
        root.capture(graphs=stale)
    assert not root.captured
    good = {p: FakeCuda(replay=p.step) for p in (tree, root)}
    for p, fake in good.items():
        p.capture(graphs=fake)
        # every capture reuses that stream (one pool)
        assert p.captured and set(fake.devices) == {kv.device} and fake.streams == [] and fake.modes == ["thread_local"]
    # the "graphs" replay: same tokens, labelled captured
    res = dec.run(PROMPT)
    assert res.tokens == ref and res.engine == "static, cuda-graph"


def test_a_failed_compile_is_not_tried_again(llama, heads, monkeypatch):
    """A compile that fails (which takes long on a real model) fails once: later runs of that program take
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
    real = static_run.ready
    monkeypatch.setattr(
        "medusa_lib.core.decoding.ready", lambda d, k: real(d, k, graphs=FakeCuda(fail="out of memory"))
    )
    dec = decoder(llama, heads, kv=kv)
    res = dec.run(PROMPT)
    assert res.tokens == ref and res.engine == "dynamic"
    assert dec.note.startswith("Capturing this run's step failed (RuntimeError: out of memory)")
    assert kv.claim()  # released for the next run
    kv.release()


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
    tree, root = static_run.programs(dec, kv)
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
        for p in static_run.programs(d, kv):
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
    """A compile can take long on a GPU, for each program: the start-up log hears each one (the compile is
    the eager step here, so the test is quick)."""
    kv = StaticKV(llama, max_len=128, capture="compile")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    said = []
    assert static_run.ready(decoder(llama, heads, kv=kv), kv, say=said.append) is None
    assert (
        said[0] == "Compiling the 25-token medusa-greedy step..."
        and said[2] == "Compiling the 1-token medusa-greedy step..."
    )
    assert all(line.startswith(("  the 25-token medusa-greedy step: ", "  the 1-token")) for line in said[1::2])
    said.clear()
    static_run.ready(decoder(llama, heads, kv=kv), kv, say=said.append)
    assert said == []  # compiled once


def test_a_compiling_engine_keeps_inductors_files_beside_the_models_cache(llama, monkeypatch, tmp_path):
    """Later starts reuse Inductor's on-disk caches, so they live in the project's cache folder (not /tmp,
    emptied at a reboot) unless the user chose a folder."""
    from medusa_lib.core.engine import prepare_engine
    from medusa_lib.core.model import CACHE_DIR

    # so that the teardown restores what was there
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
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
        static_run.ready(decoder(llama, heads, kv=kv), kv)
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
    # compiles: a function of its own
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: lambda: fn())
    dec = decoder(llama, heads, kv=kv)
    tree, root = static_run.programs(dec, kv)
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
