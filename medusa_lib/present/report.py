"""A finished comparison as one value (``Outcome``), and the ``/compare`` JSON made from it.

The three records, the exactness check and the sampling panel's rows are what the page's last frame and the
API's answer are made of, whether the run was measured for this call or shared with an identical request
(``shared.py``): both routes read the same ``Outcome``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .numerics import dtype_name
from .page import LABELS, GreedyCheck, summary_rows
from .records import RunRecord
from .settings import Settings


@dataclass(frozen=True)
class Outcome:
    """A finished comparison: the three records (by view, in run order) and what was checked on them."""

    prompt: str
    settings: Settings
    records: Mapping[str, RunRecord]
    # Medusa greedy against plain greedy (or exact sampling against plain sampling)
    check: GreedyCheck
    # the sampling panel's rows ([] in the greedy mode)
    fidelity: list
    # what drafted the Medusa columns, the tree as its label says it, the numerics that ran
    drafter: str
    tree: str
    numerics: str


def outcome_of(pg, prompt: str, settings: Settings, records: Mapping[str, RunRecord]) -> Outcome:
    """The checks of three finished records (one more forward may run: on the device's thread)."""
    plain, medusa, _ = settings.views
    drafter = pg.drafters.resolve(settings.drafter)
    model, heads = pg.pair(settings)
    tree = pg.drafters.make(
        drafter,
        numerics=dtype_name(model),
        heads=heads,
        tree=lambda: pg.resolve_tree(settings),
        lookup=pg.defaults.lookup,
    ).tree_label()
    return Outcome(
        prompt=prompt,
        settings=settings,
        records=dict(records),
        check=pg.greedy_check(records[plain], records[medusa], settings),
        fidelity=pg.sample_fidelity(dict(records), settings),
        drafter=drafter,
        tree=tree,
        numerics=dtype_name(model),
    )


def compare_json(outcome: Outcome, *, shared: dict | None = None) -> dict:
    """The ``/compare`` answer: texts and statistics per method, the exactness check, the summary rows; with
    ``sampling`` in the sampling mode. ``shared``: how this call got a run it did not start (``SharedRun.shared``),
    or None: the run was measured for this call."""
    s, check, records = outcome.settings, outcome.check, outcome.records
    out = {
        "prompt": outcome.prompt,
        "drafter": outcome.drafter,
        "tree": outcome.tree,
        "numerics": outcome.numerics,
        "methods": {
            m: {"label": LABELS[m], "drafter": r.drafter, "text": r.text, "token_ids": r.tokens, **r.stats()}
            for m, r in records.items()
        },
        "sampling_match" if s.sample else "greedy_match": {
            "equal": check.equal,
            "first_diff": check.first_diff,
            "logit_gap": check.logit_gap,
            "tie": check.tie,
            "message": check.message,
        },
        "summary": summary_rows(dict(records)),
        "shared": shared,
    }
    if s.sample:
        out["sampling"] = {"temperature": float(s.temperature), "seed": int(s.seed), "rows": outcome.fidelity}
    return out
