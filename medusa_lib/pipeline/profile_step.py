"""What one steady-state decode step costs the host: graph launches, copies, syncs, eager ops.

    python -m medusa_lib.pipeline.profile_step --device cuda            # on a GPU: the captured engine
    python -m medusa_lib.pipeline.profile_step --device cpu --cache static

Runs plain decoding and Medusa greedy (the shipped heads, this device's default tree + lookup
branch) on the static engine and counts, per decode step after the first few:

* on CUDA, from ``torch.profiler``: ``cudaGraphLaunch`` (graph replays), device-to-host copies
  (``cudaMemcpyAsync``/``Memcpy DtoH``), stream and device synchronisations, and kernels launched
  outside a graph; and the synchronising calls ``torch.cuda.set_sync_debug_mode`` warns about;
* everywhere, with a dispatch-mode counter: aten ops dispatched outside the step program, and any
  host read inside it (``_local_scalar_dense``, ``nonzero``, ``equal``, boolean indexing).

The targets of the whole-step engine (docs/engine.md): at most 2 graph launches, 1 device-to-host
copy and 1 synchronisation per step, and no host read inside a step.
"""

from __future__ import annotations

import argparse
import warnings
from collections import Counter
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..core import fused
from ..core.chat import chat_prompt_ids
from ..core.compose import make_decoder
from ..core.config import CACHES, CAPTURES, DecodeConfig
from ..core.decoding import Decoder
from ..core.defaults import heads_defaults
from ..core.engine import prepare_engine
from ..core.heads_load import load_heads
from ..core.messages import InputError
from ..core.model import input_device, load_model
from ..core.tree.presets import get_tree
from .cli import add_model_arguments, check_heads_path, check_model_arguments, fail, whole_number

HOST_READS = {"_local_scalar_dense", "item", "equal", "is_nonzero", "nonzero", "masked_select"}
CUDA_EVENTS = {
    "graph launches": ("cudaGraphLaunch",),
    "D2H copies": ("Memcpy DtoH",),
    "syncs": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"),
    "eager kernels": ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"),
}


class OpCounter(TorchDispatchMode):
    """aten ops by whether they ran inside a step program (``fused.Program.step``)."""

    def __init__(self):
        super().__init__()
        self.inside, self.counts = False, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if (
            name == "index"
            and len(args) > 1
            and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
        ):
            name = "boolean-index"
        self.counts[("inside" if self.inside else "outside", name)] += 1
        return func(*args, **(kwargs or {}))


def count_ops(steps, *, skip: int) -> tuple[OpCounter, int]:
    """Take a decoder's ``steps()`` iterator past its prefill and ``skip`` decode steps, then count the aten
    ops of the rest, inside and outside the step program. Returns (the counter, the steps counted)."""
    ops, original = OpCounter(), fused.Program.step

    def watched(self):
        ops.inside = True
        try:
            original(self)
        finally:
            ops.inside = False

    fused.Program.step = watched
    try:
        for _ in range(skip + 1):
            next(steps)
        with ops:
            counted = sum(1 for _ in steps)
    finally:
        fused.Program.step = original
    return ops, counted


def dispatch_profile(decoder: Decoder, ids: list[int], *, skip: int = 3) -> dict:
    """Per decode step after the first ``skip``: aten ops outside the step program, and the host
    reads inside it (a sorted list of op names; empty is the target)."""
    ops, steps = count_ops(decoder.steps(ids), skip=skip)
    outside = sum(
        n for (where, name), n in ops.counts.items() if where == "outside" and name not in ("lift_fresh", "detach_")
    )
    reads = sorted(
        {name for (where, name) in ops.counts if where == "inside" and name in HOST_READS | {"boolean-index"}}
    )
    return {
        "steps": steps,
        "aten ops outside the step, per step": outside / max(steps, 1),
        "host reads inside the step": reads,
    }


def cuda_profile(decoder: Decoder, ids: list[int], *, skip: int = 3) -> dict:
    """Per decode step after the first ``skip``, from the CUDA profiler and the sync debug mode."""
    from torch.profiler import ProfilerActivity, profile

    it = decoder.steps(ids)
    for _ in range(skip + 1):
        next(it)
    torch.cuda.synchronize()
    with (
        warnings.catch_warnings(record=True) as caught,
        profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof,
    ):
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            steps = sum(1 for _ in it)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    names = Counter(e.name for e in prof.events())
    out = {"steps": steps}
    for label, keys in CUDA_EVENTS.items():
        # e.g. "Memcpy DtoH (Device -> Pinned)"
        out[f"{label} per step"] = sum(n for name, n in names.items() if name.startswith(keys)) / max(steps, 1)
    # The result row's one intended sync warns too: 1 is the target.
    out["sync warnings per step"] = sum("synchroniz" in str(w.message) for w in caught) / max(steps, 1)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    ap.add_argument("--heads", default=None, help="heads folder (default: the shipped heads of the default model)")
    ap.add_argument(
        "--cache", default="static", choices=CACHES, help="static (the whole-step engine) or dynamic, for comparison"
    )
    ap.add_argument("--capture", default="auto", choices=["auto", *CAPTURES])
    ap.add_argument("--max-new-tokens", type=whole_number(1), default=64)
    ap.add_argument("--prompt", default="Explain how a bicycle gear works, step by step.")
    args = ap.parse_args(argv)
    # the bench's default heads folder
    from .bench import DEFAULT_HEADS

    if args.heads:
        check_heads_path(args.heads)
    check_model_arguments(args)
    # one sentence each, as every command line says it
    try:
        model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
        heads = load_heads(args.heads or DEFAULT_HEADS, model=model)
    except InputError as e:
        # ModelError, HeadsError
        fail(e)
    dev = input_device(model)
    defaults = heads_defaults(heads, dev, str(next(model.parameters()).dtype))
    tree = get_tree(defaults.tree, num_heads=heads.num_heads, extra=heads.tree_presets)
    ids = chat_prompt_ids(tok, args.prompt)
    try:
        engine = prepare_engine(
            model,
            cache=args.cache,
            capture=args.capture,
            max_len=len(ids) + args.max_new_tokens + tree.num_nodes + defaults.lookup_length,
            say=print,
        )
    except InputError as e:
        # EngineError: a capture this device cannot run
        fail(e)
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, stop_on_eos=False, cache=engine.cache)
    decoders = {
        "plain": make_decoder(model, method="plain", config=cfg, static_kv=engine.static_kv),
        "medusa-greedy": make_decoder(
            model,
            method="medusa-greedy",
            heads=heads,
            tree=tree,
            config=replace(cfg, lookup=defaults.lookup_length),
            static_kv=engine.static_kv,
        ),
    }
    print(
        f"{args.model} on {dev} ({next(model.parameters()).dtype}), {engine.description}, "
        f"tree {defaults.tree} + lookup {defaults.lookup_length}, {args.max_new_tokens} tokens"
    )
    for name, d in decoders.items():
        # warm-up: captures the step programs (not counted)
        res = d.run(ids)
        row = {"engine": res.engine, "tokens/step": round(res.tokens_per_step, 2)}
        if engine.cache == "static":
            row |= dispatch_profile(d, ids)
        if dev.type == "cuda":
            row |= cuda_profile(d, ids)
        print(f"\n{name}")
        for k, v in row.items():
            print(f"  {k:<42} {v if not isinstance(v, float) else round(v, 2)}")


if __name__ == "__main__":
    main()
