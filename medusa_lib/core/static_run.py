"""A run on the static engine: the whole-step programs a ``StaticKV`` keeps, made ready before a run, and the
host loop that runs them.

``programs`` gives a decoder's two programs (its tree step and the root-only step, ``fused.Program``),
built once per StaticKV and shared by every run that computes the same thing; ``evict`` keeps their
number bounded. ``ready`` captures (or compiles) them, and records the prefill in chunks, before a
run starts, never inside one. ``fused_steps`` is the run: the prefill, then one program run and one
read of its result row per step, yielding the same ``Step`` records as the dynamic decoder.
docs/engine.md.
"""

from __future__ import annotations

import time
from types import MappingProxyType
from typing import Iterator

import torch

from .fused import META, WIDTH, FusedState, Program
from .messages import cause
from .prefill import Prefill
from .rules import REASONS
from .steps import Step, sync, tree_step
from .tree.masks import TreeBuffers


def programs(decoder, kv) -> tuple[Program | None, Program]:
    """(the tree step, the root-only step) of ``decoder`` on ``kv``, built once per StaticKV and
    reused by every run that computes the same thing (same rule, tree and drafter)."""
    # the one K/V store and length tensor the programs use
    kv.bind()
    if kv.state is None:
        kv.state = FusedState(kv, vocab=decoder.lm_head.weight.shape[0])
    rule = decoder.rule

    def get(bufs: TreeBuffers | None, drafter) -> tuple[tuple, Program]:
        # (rule, nucleus, sample_root, tree, what the drafter's program holds)
        tree = bufs.cpu.choices if bufs is not None else ("new tree", drafter.num_nodes, drafter.depth)
        key = (*rule, tree, drafter.key) if drafter else (*rule, tree, ())
        if key not in kv.programs:
            kv.programs[key] = Program(kv, kv.state, bufs, rule=rule, drafter=drafter)
        # most recently used last
        kv.programs.move_to_end(key)
        return key, kv.programs[key]

    root_key, root = get(decoder.root_tree, None)
    tree_key, tree = None, None
    if decoder.static_draft is not None:
        tree_key, tree = get(decoder.static_draft.buffers, decoder.static_draft)
    evict(kv, keep=(root_key, tree_key))
    return tree, root


# whole-step programs one StaticKV keeps (the page's presets, modes and rules; custom trees)
MAX_PROGRAMS = 48


def evict(kv, *, keep: tuple) -> None:
    """Forget the least recently used programs beyond MAX_PROGRAMS, never those of the run at hand:
    a program holds its decoder's heads, tree and buffers (and a graph executable; the graphs'
    scratch memory is one pool they share, kept while any of them lives), so a server whose users
    try many custom trees (or load new heads) does not grow without bound. An evicted program is
    built and captured again if a later run needs it."""
    for key in [k for k in kv.programs if k not in keep][: max(0, len(kv.programs) - MAX_PROGRAMS)]:
        del kv.programs[key]
    if not any(p.graph is not None for p in kv.programs.values()):
        # no graph left to share it with: the next capture starts a new pool
        kv.forget_pool()


# as the runs replay it: a capture outside inference mode would record other tensors
@torch.inference_mode()
def ready(decoder, kv, *, graphs=None, say=None) -> str | None:
    """Capture (or compile) the decoder's programs on a capturing ``kv`` before its run starts;
    raises when a capture fails (the run then takes the dynamic cache, ``Decoder.steps``). ``say``
    hears a line before each program (a compile can take a minute) and after it. Returns the
    sentence of a program that fell back to eager kernels (``Program.note``), else why the prefill
    runs eagerly (``kv.prefill_note``), or None."""
    if kv.capture == "none":
        return None
    progs = [p for p in programs(decoder, kv) if p is not None]
    record_prefill(kv, graphs=graphs, say=say)
    for prog in progs:
        capture_program(prog, kv, f"the {prog.num_nodes}-token {decoder.method} step", graphs=graphs, say=say)
    return next((p.note for p in progs if p.note), kv.prefill_note)


def capture_program(prog: Program, kv, what: str, *, graphs=None, say=None) -> None:
    """Capture (or compile) one program not captured yet, saying ``what`` it is before and its seconds after;
    raises when its capture fails (``Program.capture``)."""
    if prog.captured:
        return
    if say:
        say(f"{'Compiling' if kv.capture == 'compile' else 'Capturing'} {what}...")
    seconds = prog.capture(graphs=graphs)
    kv.capture_seconds += seconds
    if say:
        say(f"  {what}: {seconds:.1f} s")


def record_prefill(kv, *, graphs=None, say=None) -> None:
    """Record ``kv``'s prefill in chunks once, on CUDA (or with ``graphs``); should it fail, prompts run
    eagerly (``kv.prefill_note``, said once) and the steps are still recorded."""
    if kv.prefill is not None or kv.prefill_note is not None or (graphs is None and kv.device.type != "cuda"):
        return
    prefill = Prefill(kv)
    try:
        kv.capture_seconds += prefill.record(graphs=graphs)
        kv.prefill = prefill
    except Exception as e:  # noqa: BLE001
        # said once, not tried again
        kv.prefill_note = f"Recording the prefill failed ({cause(e, 120)}), so prompts run eagerly."
        if say:
            say(kv.prefill_note)


def fused_steps(decoder, ids: torch.Tensor, kv) -> Iterator[Step]:
    """A run on the static engine: the decoder's prefill (``Decoder.prefill``: recorded chunks where
    recorded), then per step one program run (one graph replay on CUDA) and one read of its result
    row. Yields the same Step records as the dynamic path (``steps.tree_step``; the phases of a step
    are not separated: {"step": seconds})."""
    d, cfg, dev = decoder, decoder.config, decoder.device
    tree, root_prog = programs(d, kv)
    state, limit = kv.state, d.info.context_limit
    # plain decoding's steps keep no tree, as the dynamic decoder's
    detail = cfg.record_detail and d.drafter is not None
    n = ids.shape[1]
    t0 = sync(dev)
    kv.start()
    features, root = d.prefill(ids, kv)
    new, reason = d.finish([int(root)], 0, n)
    state.start(ids[0], root=root, config=cfg, eos=tuple(d.info.eos_token_ids or ()), context=limit)
    if tree is not None and reason is None:
        tree.open(features, ids[0], root)
    captured = kv.capture != "none" and all(p.captured for p in (tree, root_prog) if p is not None)
    yield d.prefill_step(new, reason, t0, kv, engine=f"static, {kv.capture}" if captured else "static")
    seq_len, index = n + len(new), 1
    reach = tree.depth if tree is not None else 0
    # near the context limit: root-only steps
    while reason is None:
        prog = tree if tree is not None and seq_len + reach + 1 <= limit else root_prog
        L = prog.num_nodes
        t0 = time.perf_counter()
        prog.run()
        # a new tree every step: its parents too, which the record needs
        row = state.read(META + 2 * WIDTH + (2 * L if prog.parents is not None else L if detail else 0))
        seconds = time.perf_counter() - t0
        count, accepted, code, mark, best = row[:META]
        new, reason = row[META : META + count], REASONS[code]
        yield tree_step(
            index,
            new,
            seconds,
            MappingProxyType({"step": seconds}),
            tree=prog.record_tree(row),
            tree_tokens=torch.tensor(row[META + 2 * WIDTH : META + 2 * WIDTH + L]) if detail else None,
            nodes=row[META + WIDTH : META + WIDTH + accepted + 1],
            accepted=accepted,
            best=best,
            credit=prog.credit(mark) if prog.credit is not None else None,
            drafter=d.drafter_name,
            reason=reason,
            detail=detail,
        )
        seq_len, index = seq_len + len(new), index + 1
