"""The bench's runs: ``model.generate`` and our decoders, timed the same way (``bench.py`` runs them)."""

from __future__ import annotations

from collections import defaultdict

import torch

from ..core.decoding import Decoder
from ..core.lab import step_costs
from ..core.model import input_device
from ..core.spec_metrics import draft_positions, step_lists
from ..core.steps import sync


class ForwardClock:
    """Counts a model's forward calls and stamps the end of the first one (the prefill).

    ``first_only``: unhook after the prefill, so a compiled decode step never sees the hook (a
    timestamp inside it would break the graph); the caller counts the steps instead."""

    def __init__(self, model, device, *, first_only: bool = False):
        self.device, self.calls, self.first_end, self.first_only = device, 0, None, first_only
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.calls += 1
        if self.calls == 1:
            self.first_end = sync(self.device)
            if self.first_only:
                self.handle.remove()

    def close(self):
        self.handle.remove()


def run_hf(
    model, ids: list[int], *, max_new_tokens: int, lookup: bool, eos, static_cache_len: int | None = None
) -> dict:
    """``model.generate`` greedy, timed like our loops. ``lookup``: prompt-lookup decoding.
    ``static_cache_len``: a StaticCache of that many positions, whatever the prompt's length (so the
    decode step transformers compiles on CUDA keeps one shape); its steps are the new tokens after
    the prefill's (one token per forward, as greedy generate makes them)."""
    device = input_device(model)
    clock = ForwardClock(model, device, first_only=static_cache_len is not None)
    try:
        inp = torch.tensor([ids], device=device)
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=eos[0] if eos else None,
            temperature=None,
            top_p=None,
            top_k=None,
        )
        if lookup:
            kwargs["prompt_lookup_num_tokens"] = 10
        if static_cache_len is not None:
            kwargs |= {"cache_implementation": "static", "max_cache_len": static_cache_len}
        t0 = sync(device)
        out = model.generate(inp, attention_mask=torch.ones_like(inp), **kwargs)
        t1 = sync(device)
    finally:
        clock.close()
    new = out[0, len(ids) :].tolist()
    prefill = (clock.first_end or t1) - t0
    steps = max(len(new) - 1, 0) if clock.first_only else max(clock.calls - 1, 0)
    return {
        "output_token_ids": new,
        "new_tokens": len(new),
        "steps": steps,
        "prefill_seconds": prefill,
        "decode_seconds": t1 - t0 - prefill,
    }


class CompiledLoop:
    """What a transformers user gets from one compile line (gpt-fast's recipe): transformers'
    ``StaticCache`` of ``cache_len`` positions and a greedy one-token decode step under
    ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (Inductor's kernels in its own CUDA
    graphs on CUDA; on a CPU the mode has no graphs and runs Inductor's kernels alone). The prefill
    runs eager, as transformers advises. Built once per bench: one cache and one compiled step for
    every prompt, so no prompt recompiles it (the bench's warm-up compiles it, timed apart)."""

    def __init__(self, model, *, cache_len: int):
        from transformers import StaticCache

        self.model, self.device = model, input_device(model)
        self.cache = StaticCache(config=model.config, max_cache_len=cache_len)
        self.step = torch.compile(self._one_token, mode="reduce-overhead", fullgraph=True, dynamic=False)

    def _one_token(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=token, position_ids=position, past_key_values=self.cache, use_cache=True).logits
        return logits[0, -1].argmax()

    @torch.inference_mode()
    def run(self, ids: list[int], *, max_new_tokens: int, eos) -> dict:
        """Greedy decoding of ``ids``, stopping at EOS or the budget as our loops do; timed like them."""
        dev, stop = self.device, set(eos or ())
        self.cache.reset()
        t0 = sync(dev)
        inp = torch.tensor([ids], device=dev)
        logits = self.model(
            input_ids=inp,
            position_ids=torch.arange(len(ids), device=dev)[None],
            past_key_values=self.cache,
            # as generate's prefill: the last position's logits only
            logits_to_keep=1,
        ).logits
        new = [int(logits[0, -1].argmax())]
        t1 = sync(dev)
        while len(new) < max_new_tokens and new[-1] not in stop:
            # the last step's output has been read
            torch.compiler.cudagraph_mark_step_begin()
            token = torch.tensor([[new[-1]]], device=dev)
            position = torch.tensor([[len(ids) + len(new) - 1]], device=dev)
            new.append(int(self.step(token, position)))
        t2 = sync(dev)
        return {
            "output_token_ids": new,
            "new_tokens": len(new),
            "steps": len(new) - 1,
            "prefill_seconds": t1 - t0,
            "decode_seconds": t2 - t1,
        }


# What run_ours records beside the timings, kept in the bench's records (bench.py).
RUN_DETAIL = ("phase_seconds", "lookup_tokens", "accept_lengths", "draft_depths", "draft_tokens", "draft_positions")


def run_ours(decoder: Decoder, ids: list[int]) -> dict:
    res = decoder.run(ids)
    phases = defaultdict(float)
    for s in res.steps[1:]:
        for k, v in s.phases.items():
            phases[k] += v
    return {
        "output_token_ids": res.tokens,
        "new_tokens": len(res.tokens),
        "steps": res.decode_steps,
        "prefill_seconds": res.prefill_seconds,
        "decode_seconds": res.decode_seconds,
        "phase_seconds": dict(phases),
        "lookup_tokens": res.lookup_tokens,
        # Per full step: what the drafter got accepted, and the depth and tokens of its draft (0: no draft).
        **step_lists(res.steps),
        # the deepest position its drafts can reach
        "draft_positions": draft_positions(decoder),
    }


def e2e_rate(run: dict) -> float:
    """End-to-end tokens/s of one run: new tokens / (prefill + decode)."""
    return run["new_tokens"] / (run["prefill_seconds"] + run["decode_seconds"])


def forward_costs(model, *, sizes=(1, 2, 5, 9, 17, 33), prefix: int = 256, repeats: int = 20) -> list[dict]:
    """Median ms of one body forward of L new tokens after a cached prefix and of the lm_head over
    those L rows: the tree lab's ``lab.step_costs``, one function for both."""
    return step_costs(model, sizes, prefix=prefix, repeats=repeats)


def format_forward_costs(rows: list[dict]) -> str:
    lines = [f"{'tokens':>7}{'body ms':>10}{'lm_head ms':>12}{'vs 1 token':>12}"]
    lines += [f"{r['tokens']:>7}{r['body_ms']:>10.1f}{r['lm_head_ms']:>12.1f}{r['vs_one_token']:>11.2f}x" for r in rows]
    return "\n".join(lines)
