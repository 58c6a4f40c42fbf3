"""The Tree lab's runs: Measure (plain, then Medusa with the edited tree, on the comparison's prompt) and
what a run's heads got right.

A Measure run puts the measured point beside the predicted one (``lab.tree_point``) and reports the Medusa
run's acceptance as serving engines do (``core/spec_metrics.py``); per head and rank, what the run's steps
proposed, could accept and accepted feeds the lab's per-head acceptance figure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.lab import HeadAcceptance, head_acceptance
from ..core.spec_metrics import Acceptance, draft_positions, format_rates, step_acceptance
from ..core.tree.shape import TOPK
from .records import RunRecord
from .settings import PlaygroundError, Request
from .tree_editor import editor_tree


@dataclass(frozen=True)
class Measured:
    """A Measure run: Medusa greedy (exact sampling) with the edited tree against plain greedy (sampling) on
    the same prompt; ``acceptance``: the Medusa run's mean acceptance length and rate per draft position."""

    tokens_per_step: float
    # tokens/s over plain's
    speedup: float | None
    # time per step over plain's = tokens/step / speed-up
    cost: float | None
    size: int
    # verified per step, lookup branch included
    tokens: int
    medusa: RunRecord
    plain: RunRecord
    # the Medusa run's, as vLLM reports it (core/spec_metrics.py)
    acceptance: Acceptance | None = None


def measure_tree(pg, prompt: str, request: Request, *, stop=None) -> Measured:
    """Run plain greedy, then Medusa greedy with the edited tree (``request.custom_tree``, the editor's paths
    text), on the prompt (the Playground's checks, warm-up and one-after-another timing); the measured point beside
    the predicted one. The comparison's other settings come by ``Request``'s names (max new tokens, chat template,
    lookup branch, numerics, seed); ``sample`` (the page's sampling mode): plain sampling, then Medusa exact
    sampling, at ``temperature`` from ``seed`` (without it both are greedy, whatever the temperature). The tree is
    the Medusa heads', whatever ``request.drafter`` says. ``stop``: as ``Playground.run``'s, asked between steps."""
    tree = editor_tree(pg, request.custom_tree)
    # the edited tree is the Medusa heads'
    settings = pg.settings_of(
        replace(request, temperature=request.temperature if request.sample else 0.0, drafter=pg.drafters.tree_drafter)
    )
    ids, decoders = pg.prepare(prompt, settings)
    plain_view, medusa_view = settings.views[:2]
    records = {
        ev.method: ev.record
        for ev in pg.run(ids, {v: decoders[v] for v in (plain_view, medusa_view)}, stop=stop)
        if ev.kind == "end"
    }
    plain, medusa = records[plain_view].result, records[medusa_view].result
    if medusa.decode_steps == 0:
        raise PlaygroundError(
            "The run ended at its prefill, so there is no Medusa step to measure; "
            "raise Max new tokens and measure again."
        )
    speedup = (
        medusa.tokens_per_second / plain.tokens_per_second
        if plain.decode_steps and plain.tokens_per_second > 0
        else None
    )
    return Measured(
        medusa.tokens_per_step,
        speedup,
        medusa.tokens_per_step / speedup if speedup else None,
        tree.num_nodes,
        tree.num_nodes + settings.lookup,
        records[medusa_view],
        records[plain_view],
        step_acceptance(medusa.steps, depth=draft_positions(decoders[medusa_view])),
    )


def acceptance_text(a: Acceptance | None, *, short: bool = False) -> str:
    """A run's acceptance in words, as serving engines report it: the mean acceptance length over the
    steps that drafted and the acceptance rate at each draft position (``short``: no conditional rates)."""
    if a is None or not a.drafts:
        return "no step drafted, so no acceptance to report"
    mal = f"mean acceptance length {a.mean_acceptance_length:.2f}"
    if short:
        return f"{mal}, per position {format_rates(a.rates)}"
    drafted = "every step drafted" if a.drafts == a.steps else f"{a.drafts} of {a.steps} full steps drafted"
    return (
        f"{mal} ({drafted}), acceptance rate at draft position 1..{a.depth}: {format_rates(a.rates)} "
        f"(given the one before: {format_rates(a.given_previous)})"
    )


def run_acceptance(record: RunRecord | None, *, depth: int, ranks: int = TOPK) -> HeadAcceptance | None:
    """Per head and rank, what a run's Medusa steps proposed, could accept and accepted (None: no Medusa step)."""
    if record is None or len(record.views) < 2 or all(v.step.tree is None for v in record.views):
        return None
    return head_acceptance((v.step for v in record.views), depth=depth, ranks=ranks)


__all__ = ["Measured", "acceptance_text", "measure_tree", "run_acceptance"]
