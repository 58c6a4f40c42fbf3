"""The prefill in recorded chunks (core/prefill.py), held on the CPU: the chunk maths give generate's
tokens at every prompt length (whole chunks, padded chunks, a chunk too long for the cache's room), and
the capture records every size, checks its replay and is used by the runs after it."""

import pytest
import torch
from fused_helpers import TREE, FakeCuda

from medusa_lib import DecodeConfig
from medusa_lib.core import static_run
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.kv import StaticKV
from medusa_lib.core.prefill import LADDER, Prefill


def prompt(n: int) -> list[int]:
    return [1 + (7 * i) % 250 for i in range(n)]


def run_static(model, heads, ids, kv, method="medusa-greedy", n=16):
    cfg = DecodeConfig(max_new_tokens=n, stop_on_eos=False, cache="static", lookup=3)
    return make_decoder(
        model,
        method=method,
        heads=heads if method != "plain" else None,
        tree=TREE if method != "plain" else None,
        config=cfg,
        static_kv=kv,
    ).run(ids)


@torch.inference_mode()
@pytest.mark.parametrize("length", [1, 15, 16, 17, 64, 70, 300])
def test_a_chunked_prefill_gives_generates_tokens_at_every_prompt_length(llama, heads, length):
    """Whole chunks of the longest size, then the shortest size that holds the rest, padded (eagerly
    here: the chunk maths alone); the first token and every prompt row's hidden state (what a drafter with
    a state of its own reads) match the one-shot prefill."""
    ids = prompt(length)
    ref = run_method(llama, ids, method="plain", config=DecodeConfig(max_new_tokens=16, stop_on_eos=False)).tokens
    kv = StaticKV(llama, max_len=length + 16 + 32)
    kv.bind()
    kv.prefill = Prefill(kv)
    res = run_static(llama, heads, ids, kv)
    assert res.tokens == ref
    kv.start()
    features, logits = kv.prefill.run(torch.tensor([ids]))
    one_shot = kv.body(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0]
    torch.testing.assert_close(features, one_shot, rtol=1e-5, atol=1e-5)
    assert int(logits.argmax()) == int(kv.lm_head(one_shot[-1]).argmax())


@torch.inference_mode()
def test_the_chunks_a_prompt_takes_and_one_whose_padding_would_not_fit(llama, monkeypatch):
    """40 tokens in a 64-slot cache: one 64-token chunk, padded; with 16-token chunks only: 16, 16, then
    8 padded to 16; where no padded size fits the room left, the rest runs at its own length. Each way
    gives the one-shot prefill's hidden states."""
    ids = torch.tensor([prompt(40)])
    kv = StaticKV(llama, max_len=64)
    kv.bind()
    pf = Prefill(kv)
    one_shot = kv.body(input_ids=ids, use_cache=False).last_hidden_state[0]
    lengths, real = [], Prefill.chunk
    monkeypatch.setattr(Prefill, "chunk", lambda self, c: (lengths.append(c.shape[1]), real(self, c))[1])

    def chunks() -> list[int]:
        lengths.clear()
        kv.start()
        torch.testing.assert_close(pf.run(ids)[0], one_shot, rtol=1e-5, atol=1e-5)
        return list(lengths)

    assert sorted(pf.ids) == [c for c in LADDER if c <= 64] and chunks() == [64]
    pf.ids.pop(64)
    assert chunks() == [16, 16, 16]
    # room for the prompt alone: no padding fits after 32 tokens
    monkeypatch.setattr(kv, "max_len", 40)
    assert chunks() == [16, 16, 8]


@torch.inference_mode()
def test_the_recorded_prefill_is_checked_against_the_eager_one_and_used_by_every_run_after(llama, heads):
    ids = prompt(70)
    ref = run_method(llama, ids, method="plain", config=DecodeConfig(max_new_tokens=16, stop_on_eos=False)).tokens
    kv = StaticKV(llama, max_len=160)
    kv.bind()
    kv.capture = "cuda-graph"  # as on a GPU; the stand-in records instead
    stale = Prefill(kv)
    with pytest.raises(RuntimeError, match="^the replayed 16-token prefill differs from the eager one$"):
        stale.record(graphs=FakeCuda(replay=lambda: None))
    pf = Prefill(kv)
    fake = FakeCuda(replay=lambda: pf.chunk(pf.ids[pf.recording]) if pf.recording else None)
    assert pf.record(graphs=fake) >= 0 and sorted(pf.graphs) == [16, 64]  # 256 does not fit 160 slots
    assert fake.modes == ["thread_local", "thread_local"] and int(kv.lens.sum()) == 0
    replays = []
    for size, g in pf.graphs.items():
        g.replay = lambda size=size: (replays.append(size), pf.chunk(pf.ids[size]))
    kv.prefill = pf
    dec = make_decoder(
        llama,
        method="plain",
        config=DecodeConfig(max_new_tokens=16, stop_on_eos=False, cache="static"),
        static_kv=kv,
    )
    for p in static_run.programs(dec, kv):
        if p is not None:
            p.capture(graphs=FakeCuda(replay=p.step))
    assert dec.run(ids).tokens == ref and replays == [64, 16]  # 64 whole, then 6 padded to 16
