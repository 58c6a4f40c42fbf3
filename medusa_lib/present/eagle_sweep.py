"""The Tree lab's EAGLE sweep: EAGLE's tokens per step and speed-up over plain decoding for a few node
budgets on this device, on the comparison's prompt.

EAGLE's tree is its own (a dynamic tree, a new shape every step), so the lab sweeps the one knob it has, the
node budget, keeping its top-k and depth; each point carries its run's acceptance as serving engines report it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ..core.compose import make_decoder
from ..core.drafters import EagleDrafter
from ..core.spec_metrics import Acceptance, draft_positions, step_acceptance
from .settings import PlaygroundError

# the Tree lab's sweep of EAGLE's node budget
EAGLE_BUDGETS = (3, 8, 16, 24, 40)


@dataclass(frozen=True)
class BudgetPoint:
    # nodes verified per step besides the root (the lookup branch aside)
    nodes: int
    tokens_per_step: float
    tokens_per_second: float
    # tokens/s over plain greedy's, on the same prompt
    speedup: float | None
    # mean acceptance length, rate per draft position (core/spec_metrics.py)
    acceptance: Acceptance | None = None


def eagle_budgets(
    pg,
    prompt: str,
    *,
    max_new_tokens: int,
    chat_template: bool = True,
    numerics: str | None = None,
    budgets: Sequence[int] = EAGLE_BUDGETS,
    stop=None,
    progress: Callable[[int, int], None] | None = None,
) -> list[BudgetPoint]:
    """EAGLE greedy with each node budget (its top-k and depth kept), against plain greedy, on the
    prompt, one run after another on this device (the Playground's checks, warm-up and timing;
    no lookup branch, so the points show the drafter alone). ``progress(done, total)`` after each run."""
    settings = pg.settings_of(
        dict(
            max_new_tokens=max_new_tokens,
            temperature=0.0,
            chat_template=chat_template,
            lookup_branch=False,
            numerics=numerics,
            drafter="eagle",
        )
    )
    ids, decoders = pg.prepare(prompt, settings)
    plain, eagle = decoders["plain"], decoders["medusa-greedy"]
    base = eagle.drafter.tree
    runs = {0: plain} | {
        n: make_decoder(
            eagle.model,
            method="medusa-greedy",
            drafter=EagleDrafter(eagle.drafter.head, replace(base, num_nodes=min(n, base.num_candidates))),
            config=eagle.config,
        )
        for n in budgets
    }
    pg.warmup(ids, [plain, eagle])
    results, total = {}, len(runs)
    for done, (n, dec) in enumerate(runs.items(), 1):
        events = list(pg.run_method("plain" if n == 0 else "medusa-greedy", dec, ids, stop=stop))
        results[n] = events[-1].record.result
        if progress is not None:
            progress(done, total)
    ref = results.pop(0)
    if any(r.decode_steps == 0 for r in results.values()):
        raise PlaygroundError(
            "The run ended at its prefill, so there is no EAGLE step to measure; "
            "raise Max new tokens and measure again."
        )
    base_tps = ref.tokens_per_second if ref.decode_steps else 0.0
    return [
        BudgetPoint(
            runs[n].drafter.tree.num_nodes,
            r.tokens_per_step,
            r.tokens_per_second,
            r.tokens_per_second / base_tps if base_tps > 0 else None,
            step_acceptance(r.steps, depth=draft_positions(runs[n])),
        )
        for n, r in results.items()
    ]


__all__ = ["BudgetPoint", "EAGLE_BUDGETS", "eagle_budgets"]
