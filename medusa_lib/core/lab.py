"""The tree lab: why a tree is fast on this device (Medusa paper, arXiv 2401.10774, Sec. 3.3.1 and App. C).

    speed-up(tree) = gain / cost
    gain = tokens per step: 1 + sum over nodes of the product of head accuracies on the node's path
           (``tree.expected_tokens_per_step``; the paper's "acceleration rate")
    cost = time of one verify step of L tokens over the time of a plain step of 1 token
           (the paper's "overhead"), measured here by :func:`step_costs`

Both halves, for tree sizes L = 1 .. 64 (tokens verified per step, root included; L = 1 is a plain
step): the cost curve of this device (:func:`step_costs`, shared with ``bench --forward-costs``, or the
figures of a calibration made on this kind of device, :func:`recorded_costs`), the gain curve of the
greedy trees of the heads' accuracies (:func:`gain_curve`), the predicted speed-up and its optimum
(:func:`speedup_curve`), and what each head got right in a run (:func:`head_acceptance`). The lab's
tree editor works on choices with ``tree.edit``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from .kv import StaticKV, new_cache
from .model import body_and_lm_head, input_device
from .steps import sync
from .tree.design import chain_choices, greedy_choices, path_probability
from .tree.masks import TreeBuffers, additive_mask, prefix_mask
from .tree.shape import LOOKUP_RANK, TOPK, build_tree, root_only_tree

# the lab's largest tree: tokens verified per step, root included
MAX_SIZE = 64
SIZES = tuple(range(1, MAX_SIZE + 1))


# ------------------------------------------------------------------ cost: one verify step of L tokens
@torch.inference_mode()
def step_costs(
    model,
    sizes: Sequence[int] = SIZES,
    *,
    prefix: int = 256,
    repeats: int = 5,
    progress: Callable[[int, int], None] | None = None,
    static_kv: StaticKV | None = None,
) -> list[dict]:
    """Median ms of one body forward of L new tokens after a cached ``prefix`` (causal 4D float mask,
    explicit positions, as in a tree step) and of the lm_head over those L rows, per size L; a plain
    step (L = 1) is always among them. ``vs_one_token`` = (body + lm_head) / that of L = 1. The sizes
    are timed round after round (2 warm-up rounds, then ``repeats``), every forward after the same
    prefix (one cache, cropped back after each), so a drift of a shared machine (warming up after
    a load, another job) moves every size alike instead of the one timed first, the unit.
    ``progress(done, total)`` is called after each forward (total: sizes x rounds). With
    ``static_kv`` (the captured engine a GPU server decodes with) each size is timed as that engine
    runs it: a fixed-shape forward over the static cache, replayed as a CUDA graph (recorded first
    where missing); body_ms then holds the whole step's forward, lm_head included."""
    if static_kv is not None and static_kv.claim():
        try:
            return _static_costs(
                static_kv,
                [1] + [int(L) for L in sizes if int(L) != 1],
                prefix=prefix,
                repeats=repeats,
                progress=progress,
            )
        finally:
            static_kv.release()
    body, lm_head = body_and_lm_head(model)
    device = input_device(model)
    dtype = next(model.parameters()).dtype
    sizes = [1] + [int(L) for L in sizes if int(L) != 1]
    g = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(3, vocab, (1, prefix), generator=g).to(device)
    # size -> (new tokens, mask, positions)
    steps = {}
    for L in sizes:
        causal = additive_mask(torch.ones(L, L, dtype=torch.bool).tril(), dtype)
        mask = prefix_mask(causal, prefix, torch.arange(prefix + L)).to(device)
        pos = torch.arange(prefix, prefix + L, device=device)[None]
        steps[L] = (torch.randint(3, vocab, (1, L), generator=g).to(device), mask, pos)
    cache = new_cache()
    body(input_ids=ids, past_key_values=cache, use_cache=True)
    times: dict[int, tuple[list[float], list[float]]] = {L: ([], []) for L in sizes}
    # the first two are warm-up
    rounds = repeats + 2
    for rep in range(rounds):
        for i, L in enumerate(sizes):
            new, mask, pos = steps[L]
            t0 = sync(device)
            h = body(
                input_ids=new, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
            ).last_hidden_state[0]
            t1 = sync(device)
            lm_head(h)
            t2 = sync(device)
            # back to the prefix: every forward verifies after the same context
            cache.crop(-L)
            if rep >= 2:
                times[L][0].append(1000 * (t1 - t0))
                times[L][1].append(1000 * (t2 - t1))
            if progress is not None:
                progress(rep * len(sizes) + i + 1, rounds * len(sizes))
    rows = [
        {"tokens": L, "body_ms": statistics.median(b), "lm_head_ms": statistics.median(h)}
        for L, (b, h) in times.items()
    ]
    base = rows[0]["body_ms"] + rows[0]["lm_head_ms"]
    for r in rows:
        r["vs_one_token"] = (r["body_ms"] + r["lm_head_ms"]) / base
    return rows


def _static_costs(kv: StaticKV, sizes: list[int], *, prefix: int, repeats: int, progress) -> list[dict]:
    device, vocab = kv.device, kv.lm_head.weight.shape[0]
    where = {"device": device, "out_device": kv.lm_head.weight.device, "dtype": kv.dtype}
    g = torch.Generator().manual_seed(0)
    prefix = min(prefix, kv.max_len - max(sizes))
    rows = []
    for i, L in enumerate(sizes):
        bufs = TreeBuffers.build(
            build_tree(chain_choices(L - 1), num_heads=L - 1) if L > 1 else root_only_tree(), **where
        )
        if kv.capture != "none" and L not in kv.captured:
            kv.warm_up([bufs])
        kv.start()
        kv.body(
            input_ids=torch.randint(3, vocab, (1, prefix), generator=g).to(device),
            past_key_values=kv.cache,
            use_cache=True,
        )
        new = torch.randint(3, vocab, (L,), generator=g).to(device)
        ms = []
        # the first two are warm-up
        for rep in range(repeats + 2):
            t0 = sync(device)
            kv.forward(new, bufs, prefix)
            t1 = sync(device)
            if rep >= 2:
                ms.append(1000 * (t1 - t0))
        rows.append({"tokens": L, "body_ms": statistics.median(ms), "lm_head_ms": 0.0, "engine": kv.engine([L])})
        if progress is not None:
            progress(i + 1, len(sizes))
    kv.start()
    base = rows[0]["body_ms"]
    for r in rows:
        r["vs_one_token"] = r["body_ms"] / base
    return rows


def recorded_costs(record: dict | None) -> dict[int, float]:
    """Step cost relative to a plain step, by tokens verified per step, from a calibration record's
    measured trees: cost = measured tokens/step / measured speed-up over plain (time per step over
    plain's), at L = the tree's nodes + the lookup branch it was measured with. {} when the record
    holds no measured trees."""
    out = {1: 1.0} if record else {}
    lookup = int((record or {}).get("lookup") or 0)
    for fig in ((record or {}).get("trees") or {}).values():
        tps, speedup, nodes = fig.get("measured_tokens_per_step"), fig.get("speedup"), fig.get("nodes")
        if tps and speedup and nodes:
            out[int(nodes) + lookup] = float(tps) / float(speedup)
    return dict(sorted(out.items())) if len(out) > 1 else {}


def monotone(values: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence (least squares; pool adjacent violators): on one kernel a
    step of more tokens never costs less, so a dip among its sizes is noise of the shared device."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1), (m2, w2) = blocks.pop(-2), blocks.pop(-1)
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return [m for m, w in blocks for _ in range(int(w))]


@dataclass(frozen=True)
class CostCurve:
    """Step cost relative to a plain step against tokens verified per step.

    sizes, measured  the points measured (or read from a calibration record), sizes ascending
    fitted           ``measured`` made non-decreasing (:func:`monotone`) within each kernel, never below
                     the smallest size's
    source           "measured" (on this machine), "calibration" (a record of this device kind) or "start-up"
                     (whole steps of the shipped trees timed when the server started, present/fit.py)
    mkl_rows         the sizes whose products ran another kernel (``packing.few_row_kernels``: MKL's
                     few-row products): fitted apart from the rest, so a size that kernel makes cheaper
                     than a smaller one keeps its dip (on an AVX2 CPU a 4-token step can cost less than
                     a 3-token one)
    """

    sizes: tuple[int, ...]
    measured: tuple[float, ...]
    fitted: tuple[float, ...]
    source: str
    device: str = ""
    mkl_rows: tuple[int, ...] = ()
    # the device kind a calibration's curve was measured on ("cuda", "cpu"), when known
    kind: str = ""

    @classmethod
    def of(
        cls, points: dict[int, float], *, source: str, device: str = "", mkl_rows: Iterable[int] = ()
    ) -> "CostCurve":
        sizes = sorted(points)
        values = [points[s] for s in sizes]
        mkl = tuple(sorted({int(r) for r in mkl_rows} & set(sizes[1:])))
        fitted = dict(zip(sizes, values))
        for group in ([s for s in sizes[1:] if s not in mkl], list(mkl)):
            fitted.update(zip(group, monotone([points[s] for s in group])))
        # The smallest step (a plain one) stays the unit.
        fit = [values[0]] + [max(fitted[s], values[0]) for s in sizes[1:]]
        return cls(tuple(sizes), tuple(values), tuple(fit), source, device, mkl)

    @classmethod
    def from_rows(cls, rows: Iterable[dict], *, device: str = "", mkl_rows: Iterable[int] = ()) -> "CostCurve":
        """From :func:`step_costs`' rows; ``mkl_rows``: the row counts the timed model routed to MKL."""
        points = {int(r["tokens"]): float(r["vs_one_token"]) for r in rows}
        return cls.of(points, source="measured", device=device, mkl_rows=mkl_rows)

    def at(self, size: float) -> float:
        """The fitted cost at any size: linear between points, the end slope beyond the last one."""
        xs, ys = self.sizes, self.fitted
        if len(xs) > 1 and size > xs[-1]:
            return ys[-1] + (size - xs[-1]) * max(ys[-1] - ys[-2], 0.0) / (xs[-1] - xs[-2])
        return float(np.interp(size, xs, ys))


# ------------------------------------------------------------------ gain: tokens per step of a tree
@dataclass(frozen=True)
class GainCurve:
    """Tokens per step of the greedy tree of each size (size = nodes + the root).

    expected        from the accuracies (``greedy_choices``), one per size
    simulated       size -> calibration's simulated tokens/step, heads only
    with_lookup     size -> calibration's simulated tokens/step with the lookup branch
    lookup_gain     per size, what the branch adds: the simulated gain with it minus without, linear
                    between calibrated sizes and flat beyond them (None without simulated figures)
    """

    sizes: tuple[int, ...]
    expected: tuple[float, ...]
    simulated: dict[int, float]
    with_lookup: dict[int, float]
    lookup_gain: tuple[float, ...] | None

    def lookup_gain_at(self, size: int) -> float:
        return 0.0 if self.lookup_gain is None else float(np.interp(size, self.sizes, self.lookup_gain))


def gain_curve(
    accuracy: Sequence[Sequence[float]], sizes: Sequence[int] = SIZES, *, record: dict | None = None
) -> GainCurve:
    """Expected tokens/step of the greedy tree of each size (a tree of L tokens has L - 1 nodes;
    L = 1 gains 1), plus a calibration record's simulated figures with and without the lookup branch."""
    sizes = tuple(int(s) for s in sizes)
    # Greedy is incremental: its first n nodes are the n-node tree.
    chosen, _ = greedy_choices(accuracy, max(max(sizes) - 1, 1))
    running = [1.0]
    for c in chosen:
        running.append(running[-1] + path_probability(c, accuracy))
    expected = tuple(running[min(s - 1, len(running) - 1)] for s in sizes)
    simulated, lookup = {}, {}
    for fig in ((record or {}).get("trees") or {}).values():
        if fig.get("nodes") and fig.get("heads_only_simulated_tokens_per_step"):
            simulated[int(fig["nodes"])] = float(fig["heads_only_simulated_tokens_per_step"])
            if (record or {}).get("lookup") and fig.get("simulated_tokens_per_step"):
                lookup[int(fig["nodes"])] = float(fig["simulated_tokens_per_step"])
    lookup_gain = None
    if lookup:
        xs = sorted(lookup)
        lookup_gain = tuple(float(np.interp(s, xs, [lookup[x] - simulated[x] for x in xs])) for s in sizes)
    return GainCurve(sizes, expected, dict(sorted(simulated.items())), dict(sorted(lookup.items())), lookup_gain)


@dataclass(frozen=True)
class SpeedupCurve:
    """Predicted speed-up over plain of the greedy tree of each size: gain / cost.

    ``lookup``: tokens of the lookup branch verified with every tree (0: heads only); its gain is
    the calibration's simulated one and it adds ``lookup`` tokens to the cost."""

    sizes: tuple[int, ...]
    speedup: tuple[float, ...]
    lookup: int = 0

    @property
    def optimum(self) -> int:
        """The size with the largest predicted speed-up (the smallest such size on a tie)."""
        return self.sizes[int(np.argmax(self.speedup))]


def predicted_speedup(gain: float, size: int, cost: CostCurve, *, lookup: int = 0) -> float:
    """gain / cost of one step that verifies ``size`` tree tokens plus ``lookup`` branch tokens."""
    return gain / cost.at(size + lookup)


def speedup_curve(gain: GainCurve, cost: CostCurve, *, lookup: int = 0) -> SpeedupCurve:
    extra = [gain.lookup_gain_at(s) if lookup else 0.0 for s in gain.sizes]
    return SpeedupCurve(
        gain.sizes,
        tuple(predicted_speedup(g + e, s, cost, lookup=lookup) for s, g, e in zip(gain.sizes, gain.expected, extra)),
        lookup,
    )


# ------------------------------------------------------------------ what each head got right
@dataclass(frozen=True)
class HeadAcceptance:
    """Per depth k (head k) and rank r, over the Medusa steps of a run:

    proposed  [D][R]  nodes of head k's rank r verified
    reached   [D][R]  of those, the ones whose parent was on the accepted path (the node could be accepted)
    accepted  [D][R]  of those, the ones on the accepted path
    lookup_reached, lookup_accepted  [D]  the same for the lookup branch's node of depth k (rank -1)
    steps     Medusa steps counted

    accepted / reached estimates the calibrated acc[k][r]: P(head k's rank-r token is right given a right branch)."""

    proposed: tuple[tuple[int, ...], ...]
    reached: tuple[tuple[int, ...], ...]
    accepted: tuple[tuple[int, ...], ...]
    lookup_reached: tuple[int, ...]
    lookup_accepted: tuple[int, ...]
    steps: int

    def rates(self) -> list[list[float | None]]:
        """accepted / reached per [k][r]; None where no such node was reached."""
        return [[a / n if n else None for a, n in zip(ar, nr)] for ar, nr in zip(self.accepted, self.reached)]


def head_acceptance(steps: Iterable, *, depth: int, ranks: int = TOPK) -> HeadAcceptance:
    """Count, over Step records (``decoding.Step`` with ``tree``, ``accepted_nodes``), which node of
    which head and rank was proposed, reachable and accepted; lookup-branch nodes are counted apart."""
    grid = lambda: [[0] * ranks for _ in range(depth)]  # noqa: E731
    proposed, reached, accepted = grid(), grid(), grid()
    lk_reached, lk_accepted = [0] * depth, [0] * depth
    n = 0
    for step in steps:
        tree = step.tree
        if tree is None or step.index == 0:
            continue
        n += 1
        on_path = set(step.accepted_nodes)
        for j in range(1, tree.num_nodes):
            c = tree.choices[j - 1]
            k, r = len(c) - 1, c[-1]
            if k >= depth:
                continue
            hit, near = j in on_path, tree.parents[j] in on_path
            if r == LOOKUP_RANK:
                lk_reached[k] += near
                lk_accepted[k] += hit
            elif r < ranks:
                proposed[k][r] += 1
                reached[k][r] += near
                accepted[k][r] += hit
    as_tuple = lambda g: tuple(map(tuple, g))  # noqa: E731
    return HeadAcceptance(
        as_tuple(proposed), as_tuple(reached), as_tuple(accepted), tuple(lk_reached), tuple(lk_accepted), n
    )
