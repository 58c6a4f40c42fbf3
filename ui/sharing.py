"""Identical requests computed once, on the server: the page's Run and ``/compare`` take their runs here.

A request names a ``SharedRun`` by its whole request (``medusa_lib.present.shared``): one running now is
joined, one finished recently is answered from its records, and otherwise a new run is handed to the device.
At the queue's door (``serve.guard_queue``) a request that will be joined or answered from records takes no
place: ``door`` says so before gradio queues it. After start-up the page's examples, at the page's starting
values, are recorded in the background while no run needs the device (``record_in_background``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from functools import partial
from typing import Any, Callable, Sequence

from medusa_lib.core.messages import InputError, must_be_switch
from medusa_lib.core.model import model_name
from medusa_lib.present import Playground, PlaygroundError, RunStopped, Settings, deadline, sample_of_mode
from medusa_lib.present.settings import Request
from medusa_lib.present.shared import GIVES_WAY, SharedRun, SharedRuns

from .live import DeviceTurn

log = logging.getLogger("medusa_playground")
# seconds the device must have been idle before a background recording starts, and between two tries
IDLE_SECONDS = 1.0
# a background recording that gave way to users is tried again this many times
RECORD_TRIES = 20


def run_live_of(value) -> bool:
    """The Run live switch: true runs the request afresh even where an identical one is running or recorded."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise PlaygroundError(must_be_switch("The Run live switch (run_live)", value))
    return value


class Sharing:
    """The server's shared runs: the registry, the device its runs go to, the bound on one run's wall time."""

    def __init__(
        self,
        playground: Playground,
        device: DeviceTurn,
        *,
        max_run_seconds: float | None,
        runs: SharedRuns | None = None,
    ):
        self.pg, self.device, self.max_run_seconds = playground, device, max_run_seconds
        self.runs = runs or SharedRuns()
        # the routes a shared run may answer: a BlockFunction -> how its handler reads the inputs it is sent, as
        # (prompt, settings, run live) (Handlers.page_request, compare_request; ui.build_demo sets them)
        self.routes: dict[Any, Callable[[list], tuple[str, Settings, bool]]] = {}
        # told of every run that ended, after the registry (serve.measured_estimates)
        self.on_end: list[Callable[[SharedRun], None]] = []
        # what renders a run's page frames on the device's thread (run_frames.PageFrames), from its settings
        self.render_for: Callable[[Settings], Any] | None = None

    def rendering(self, settings: Settings) -> dict:
        """``produce``'s rendering arguments: a run's page frames, made once for every page that watches it."""
        if self.render_for is None:
            return {}
        frames = self.render_for(settings)
        return {"render": frames.on_event, "render_final": frames.final}

    def ended(self, run: SharedRun) -> None:
        self.runs.ended(run)
        for listener in self.on_end:
            listener(run)

    def identity(self) -> str:
        """What else decides a run: the model, the heads, the device and the engine this server loaded."""
        return f"{model_name(self.pg.model)} | {self.pg.heads_note} | {self.pg.device} | {self.pg.engine}"

    def key(self, prompt, settings: Settings) -> str:
        """The request's key, with the playground's own choices named: no numerics or drafter means the default
        one, so a request naming the default shares with one that leaves it out."""
        settings = replace(
            settings,
            numerics=settings.numerics if settings.numerics is not None else self.pg.default_numerics,
            drafter=self.pg.drafters.resolve(settings.drafter),
        )
        return self.runs.key(self.identity(), prompt, settings)

    def check(self, prompt, settings: Settings) -> None:
        """The checks ``Playground.prepare`` starts with, before a request is keyed or shared: one sentence for a bad
        value (so a key is made of text, numbers and switches only)."""
        self.pg.check_prompt(prompt)
        settings.check(max_new_tokens_limit=self.pg.max_new_tokens_limit)
        self.pg.check_numerics(settings.numerics)
        self.pg.drafters.resolve(settings.drafter)

    def take(
        self, prompt: str, settings: Settings, *, live: bool = False, since: float | None = None, page: bool = False
    ):
        """The run this request watches and how it got it (``SharedRuns.take``; ``page``: a page watches, which
        shows its frames); a new one goes to the device, bounded in wall time from ``since`` (the call's start)."""
        self.check(prompt, settings)
        run, how = self.runs.take(self.key(prompt, settings), prompt, settings, live=live, page=page)
        if how == "new":
            self.produce(run, stop=deadline(self.max_run_seconds, start=since), on_end=self.ended)
        return run, how

    def produce(
        self,
        run: SharedRun,
        *,
        stop,
        on_end: Callable[[SharedRun], None],
        device_waiting: Callable[[], int] | None = None,
    ) -> None:
        """Hand ``run`` to the device (``SharedRun.produce``), with its page frames rendered there (``rendering``)."""
        self.device.submit(
            partial(
                run.produce,
                self.pg,
                stop=stop,
                on_end=on_end,
                device_waiting=device_waiting,
                **self.rendering(run.settings),
            )
        )

    # ---------------------------------------------------------------- the queue's door
    def read(self, fn, data) -> tuple[str, Settings, bool] | None:
        """A call of a route this reads (``routes``) as (prompt, settings, run live), checked as ``take`` checks
        it (a bad value raises its sentence); None for any other call."""
        read = self.routes.get(fn)
        if read is None or not isinstance(data, list):
            return None
        prompt, settings, live = read(data)
        self.check(prompt, settings)
        return prompt, settings, live

    def door(self, fn, data) -> bool:
        """True when this call will be joined to a running run or answered from a recorded one, so it needs no
        place in the device's queue. Anything it cannot read takes the ordinary way (and its sentence there)."""
        try:
            got = self.read(fn, data)
            return got is not None and not got[2] and self.runs.holds(self.key(got[0], got[1]))
        except Exception:
            return False

    def sentence(self, fn, data) -> str | None:
        """The sentence this call's own handler answers it with before any run (a bad value), else None."""
        try:
            self.read(fn, data)
        except InputError as e:
            return str(e)
        except Exception:  # noqa: BLE001
            return None
        return None

    # ---------------------------------------------------------------- examples, recorded after start-up
    def record_in_background(
        self, prompts: Sequence[str], start: Request, *, say: Callable[[str], None] | None = None
    ) -> threading.Thread:
        """Record each prompt's comparison at the page's starting values (``start``), one after another, each
        only once the device has been idle a moment; a recording gives way to any user's run (and is tried
        again later). ``say`` hears one line when all are done. Returns the daemon thread doing it; it never
        delays the page."""
        thread = threading.Thread(
            target=self._record, args=(list(prompts), start, say), name="medusa-examples", daemon=True
        )
        thread.start()
        return thread

    def _record(self, prompts: list[str], start: Request, say: Callable[[str], None] | None) -> None:
        t0 = time.perf_counter()
        settings = self.pg.settings_of({**vars(start), "sample": sample_of_mode("greedy")})
        for prompt in prompts:
            for _ in range(RECORD_TRIES):
                self.device.wait_idle(IDLE_SECONDS)
                key = self.key(prompt, settings)
                # a user asked for it meanwhile: their run records it
                if self.runs.holds(key):
                    break
                run, _ = self.runs.take(key, prompt, settings, background=True)
                done = threading.Event()

                def ended(r: SharedRun, done=done) -> None:
                    self.ended(r)
                    done.set()

                self.produce(run, stop=deadline(self.max_run_seconds), on_end=ended, device_waiting=self.device.waiting)
                done.wait()
                if run.outcome is not None:
                    break
                if not (isinstance(run.error, RunStopped) and str(run.error) == GIVES_WAY):
                    log.warning("recording an example failed: %s", run.error)
                    break
        if say is not None:
            held = sum(self.runs.holds(self.key(p, settings)) for p in prompts)
            say(
                f"Examples: {held} of {len(prompts)} recorded in the background ({time.perf_counter() - t0:.0f} s "
                "after the page opened); a request identical to one is answered from its records."
            )
