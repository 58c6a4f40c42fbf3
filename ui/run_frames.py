"""What the page shows of one run, rendered once, on the device's thread, for every page session watching it.

A run's page updates (its columns, the timeline, the status, and once the Medusa column ends the inspector) are
made between two decode steps, outside the steps' timings, as the run goes (``PageFrames.on_event``), and its last
frame once it has ended (``final``). Watchers forward them: ten sessions watching a run, or a hundred answered from
its record, cost one rendering (building a frame's figures is what costs; gradio's serialising them, per session,
takes about a millisecond each). The inspector is rendered for the page's first choice; a session that picked the
other one renders its own.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd

from medusa_lib.present import DRAFTED_BY, DRAFTER_NAMES, LABELS, Event, Settings, untimed_note
from medusa_lib.present.report import Outcome

from .figures import timeline_figure
from .live import COLUMN
from .outputs import INSPECT_CHOICES, INSPECT_OUTPUTS, empty_summary, method_of, reference_of, summary_frame
from .render import badge_html, column_html, sampling_html

# the inspector's choice the frames carry (the page's first)
FIRST_CHOICE = INSPECT_CHOICES[0]
INSPECTOR = ("insp_step", *INSPECT_OUTPUTS)


class PageFrames:
    """One run's page updates, made as its events come (``on_event``) and at its end (``final``)."""

    def __init__(self, handlers, settings: Settings, *, every: float):
        # handlers: the page's Handlers (the playground, the inspector's rendering)
        self.h, self.settings, self.every = handlers, settings, every
        self.records: dict = {}
        self.last = 0.0
        # an update has been made: the next ones carry what changed, the first carries everything
        self.started = False

    def on_event(self, ev: Event, *, shown: bool = True) -> dict | None:
        """The update after ``ev``, or None: nobody shows it (``shown`` false: a run only ``/compare`` callers
        watch), or a step within ``every`` seconds of the last update (each update costs time the run waits; a
        start or an end always makes one). The first update carries every column so far (a page that joins a
        run ``/compare`` started catches up in it)."""
        self.records[ev.method] = ev.record
        now = time.perf_counter()
        if not shown or (ev.kind == "step" and now - self.last < self.every and self.started):
            return None
        self.last = now
        views, records = self.settings.views, self.records
        upd: dict[str, Any] = {}
        first = not self.started
        if first:
            self.started = True
            upd.update(
                {COLUMN[v]: column_html(v, None) for v in views},
                badge=badge_html(None),
                summary=empty_summary(),
                sampling=sampling_html(None),
                session=None,
            )
            for m, r in records.items():
                if m != ev.method:
                    upd[COLUMN[m]] = column_html(m, r, state="done", reference=reference_of(records, m))
                    if m == method_of(FIRST_CHOICE, records):
                        upd.update(self.inspector(dict(records), FIRST_CHOICE))
        if ev.kind == "start" or first:
            by = f", drafted by {DRAFTED_BY[ev.record.drafter]}" if ev.record.drafter in DRAFTER_NAMES else ""
            upd["status"] = (
                f"Running **{LABELS[ev.method]}**{by} ({views.index(ev.method) + 1} of 3; "
                "the three run one after another for fair timing)&hellip;"
            )
        # plain runs first: it has finished by then
        upd[COLUMN[ev.method]] = column_html(
            ev.method,
            ev.record,
            state="done" if ev.record.done else "running",
            reference=reference_of(records, ev.method),
        )
        upd["timeline"] = timeline_figure(records)
        if ev.kind == "end" and ev.method == method_of(FIRST_CHOICE, records):
            upd.update(self.inspector(dict(records), FIRST_CHOICE))
        return upd

    def inspector(self, records: dict, label: str) -> dict:
        return self.h.inspector_update(records, label)

    def final(self, outcome: Outcome, label: str = FIRST_CHOICE) -> dict:
        """The last frame: every column, the badge, the summary, the sampling panel, the inspector on ``label``'s
        run, and the status (which a session answered by a shared run extends with its note)."""
        records, settings = dict(outcome.records), outcome.settings
        views = settings.views
        plain, medusa = records[views[0]], records[views[1]]
        note = untimed_note(records)
        t, seed = settings.temperature, settings.seed
        done = (
            f"Sampled at T = {t:g}, seed {seed}; speedups are against plain sampling. "
            if settings.sample
            else (f"Greedy mode: Medusa typical sampled at T = {t:g}, seed {seed}; speedups are against plain greedy. ")
            if t > 0
            else ""
        )
        # the server offers a choice: say which ran
        if medusa.drafter in DRAFTER_NAMES and len(self.h.pg.drafters.available) > 1:
            done = f"Medusa columns drafted by {DRAFTED_BY[medusa.drafter]}. " + done
        return {
            "status": "Done. "
            + done
            + (note if note else "Press **Race replay** to watch the three runs side by side at their measured speed."),
            **{
                COLUMN[m]: column_html(m, r, state="done", reference=reference_of(records, m))
                for m, r in records.items()
            },
            "timeline": timeline_figure(records),
            "badge": badge_html(outcome.check, plain=plain, medusa=medusa, tokenizer=self.h.pg.tokenizer),
            "summary": summary_frame(records),
            "sampling": sampling_html(outcome.fidelity, temperature=float(t)),
            "session": records,
            **self.inspector(records, label),
        }


def for_watcher(update: dict, *, label: str, joined: str = "") -> dict:
    """A shared update as one session gets it: without the inspector when it picked another run than the frames
    carry, with ``joined`` (its note) in the status, and a session state of its own (a copy of the records' dict)."""
    upd = {k: v for k, v in update.items() if label == FIRST_CHOICE or k not in INSPECTOR}
    if joined and "status" in upd:
        upd["status"] = upd["status"].replace("&hellip;", f"{joined}&hellip;")
    if isinstance(upd.get("session"), dict):
        upd["session"] = dict(upd["session"])
    if isinstance(upd.get("summary"), pd.DataFrame):
        upd["summary"] = upd["summary"].copy()
    return upd
