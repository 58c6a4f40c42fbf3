"""The race replay: the three recorded runs played together, each step appearing at its measured time (a mixin of
``Handlers``: it takes its turn on the device like a run, so its frames never cost CPU while a run is timed)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Iterator

import gradio as gr

from medusa_lib.present import DRAFTED_BY, DRAFTER_NAMES, RunStopped, visible_steps

from .figures import timeline_figure
from .live import COLUMN
from .outputs import REPLAY_OUTPUTS, pack, reference_of
from .render import column_html

REPLAY_FPS = 12


class RaceReplay:
    """The replay's event (it reads the handlers' ``pg``, ``live``, ``device``, ``api_stop`` and ``refuse``)."""

    def replay(self, records: dict | None, speed: str, request: gr.Request = None) -> Iterator[tuple]:
        """Replay the recorded runs together, each step appearing at its measured time."""
        # here, on gradio's thread
        stop = self.api_stop(what="replay", advice="pick a faster replay speed")
        yield from self.live.track(request, REPLAY_OUTPUTS, self.device.stream(self._replay(records, speed, stop)))

    def _replay(
        self, records: dict | None, speed: str, stop: Callable[[], str | None] | None = None
    ) -> Iterator[tuple]:
        out = lambda **kw: pack(REPLAY_OUTPUTS, **kw)  # noqa: E731
        if not records or len(records) < 3:
            gr.Warning("Run the three methods first: the race replay uses their recorded step times.")
            yield out(status="**Nothing to replay yet:** press Run first.")
            return
        try:
            factor = float(str(speed).rstrip("x") or 1)
            total = max(r.elapsed for r in records.values())
            start, t = time.perf_counter(), 0.0
            while True:
                cols = {}
                for m, rec in records.items():
                    k = visible_steps(rec, t)
                    part = replace(rec, views=rec.views[:k], done=k == len(rec.views))
                    cols[COLUMN[m]] = column_html(
                        m, part, state="done" if part.done else "replay", reference=reference_of(records, m)
                    )
                # The status is written on the first and the last frame only: a frame still in flight
                # when Stop is pressed must not overwrite Stop's message (the timeline shows the clock).
                status = {}
                if t == 0 or t >= total:
                    drafter = next((r.drafter for r in records.values() if r.drafter in DRAFTER_NAMES), None)
                    by = (
                        f" (Medusa columns drafted by {DRAFTED_BY[drafter]})"
                        if drafter and len(self.pg.drafters.available) > 1
                        else ""
                    )
                    status["status"] = f"Race replay at {speed}: {total:.2f} s of recorded runs{by}" + (
                        " (done)." if t >= total else f", shown in {total / factor:.1f} s."
                    )
                yield out(timeline=timeline_figure(records, upto=min(t, total), x_max=total * 1.02), **status, **cols)
                if t >= total:
                    break
                if stop is not None and (why := stop()):
                    raise RunStopped(why)
                time.sleep(1 / REPLAY_FPS)
                t = (time.perf_counter() - start) * factor
        except Exception as e:
            # a bug: one sentence, the replay stops
            yield out(status=self.refuse(e))
