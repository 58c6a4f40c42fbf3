"""Identical requests computed once (DESIGN.md, "Many visitors, one device").

A run is determined by its whole request: the prompt, every setting, the numerics and the drafter, and the
server's model, heads, device and engine (greedy runs are deterministic, sampled ones too from one seed). So a
request identical to one running now *joins* that run and reads the same records from where it is, and one
identical to a run finished recently is answered from that run's records (``SharedRuns``: at most N results and
M MB, least recently used out first). A shared answer says so and how old it is: its timings are that run's
own measurements, taken while it had the device alone; nothing is re-timed or estimated.

A ``SharedRun`` is made by one producer on the device's thread (``produce``) and read by any number of watchers,
each on its own thread (``follow``). It runs while someone watches it: a watcher that leaves never ends it for
the others, and the last one leaving ends it between two steps. A run recorded in the background (the page's
examples after start-up) has no watcher of its own and gives way to any run a user hands the device.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, fields, is_dataclass
from typing import Callable, Iterator

import torch

from .limits import StopCheck
from .records import Event
from .report import Outcome, outcome_of
from .settings import RunStopped, Settings

# the recorded results a server keeps (MEDUSA_SHARED_RESULTS) and the memory their records may take
# (MEDUSA_SHARED_MB); the least recently used goes first
MAX_RESULTS = 64
MAX_MEGABYTES = 256.0
# the finished runs whose mean wall time a waiting caller's estimate is
RECENT_RUNS = 20
ALL_LEFT = "Everyone watching this run left, so it stopped."
GIVES_WAY = "A user's run needs the device, so the background recording gave way."


def age(seconds: float) -> str:
    """A time span as a person says it: "12 s", "3 min", "2 h"."""
    if seconds < 1:
        return "less than a second"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def deep_bytes(obj, seen: set[int] | None = None) -> int:
    """What ``obj`` and everything it holds take in memory (tensors by their storage), each object counted once:
    the size a recorded result is charged against the cache's bound."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if id(storage) in seen:
            return sys.getsizeof(obj)
        seen.add(id(storage))
        return sys.getsizeof(obj) + storage.nbytes()
    size = sys.getsizeof(obj)
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return size
    if isinstance(obj, dict):
        return size + sum(deep_bytes(k, seen) + deep_bytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return size + sum(deep_bytes(x, seen) for x in obj)
    if is_dataclass(obj):
        return size + sum(deep_bytes(getattr(obj, f.name), seen) for f in fields(obj))
    if hasattr(obj, "__dict__"):
        return size + deep_bytes(vars(obj), seen)
    return size


@dataclass(frozen=True)
class Batch:
    """What a watcher has not seen yet: the run's new events, and whether it has ended."""

    events: tuple[Event, ...]
    # what the page made of them (``SharedRun.frames``)
    frames: tuple
    ended: bool


class SharedRun:
    """One comparison, made once and watched by everyone who asked for it."""

    def __init__(self, key: str, prompt: str, settings: Settings, *, background: bool = False):
        self.key, self.prompt, self.settings, self.background = key, prompt, settings, background
        self.events: list[Event] = []
        # what a page shows of it, made once on the device's thread by ``produce``'s ``render`` (an update after
        # some events) and ``render_final`` (its last frame): every page watching it reads the same
        self.frames: list = []
        self.final = None
        # set when it ended: the finished comparison, or why it could not finish
        self.outcome: Outcome | None = None
        self.error: Exception | None = None
        self.ended = False
        # wall-clock times (time.time) of its first event and of its end
        self.started: float | None = None
        self.finished: float | None = None
        self.watchers = 0
        # of them, pages: only while one watches (or it is recorded in the background) is a page frame rendered
        self.pages = 0
        # wall seconds its production took on the device (prepare, three decoders, checks), once it ended
        self.seconds: float | None = None
        self._cond = threading.Condition()

    # ------------------------------------------------------------ the producer (the device's thread)
    def produce(
        self,
        pg,
        *,
        stop: StopCheck | None = None,
        device_waiting: Callable[[], int] | None = None,
        on_end: Callable[["SharedRun"], None] | None = None,
        render: Callable[..., object] | None = None,
        render_final: Callable[[Outcome], object] | None = None,
    ) -> None:
        """Prepare and run the three decoders (``Playground.prepare``, ``run``), then check them
        (``outcome_of``): every event goes to the watchers as it is made. ``stop``: besides the watchers
        (``stop_check``), e.g. the server's bound on one run's wall time; ``device_waiting``: how many runs
        wait for the device (a background run gives way to them). ``render(event, shown=...)`` makes what a page
        shows after an event (None: nothing new; ``shown``: a page watches, or the run is recorded in the
        background) and ``render_final`` its last frame when a page will show it, here, between two steps (outside
        their timings). Any failure ends the run with its error, which each watcher says in its sentence; ``on_end``
        then hears of it."""
        t0 = time.perf_counter()
        try:
            check = self.stop_check(stop, device_waiting=device_waiting)
            # everyone left while it waited for the device
            if why := check():
                raise RunStopped(why)
            ids, decoders = pg.prepare(self.prompt, self.settings)
            records = {}
            for ev in pg.run(ids, decoders, stop=check):
                records[ev.method] = ev.record
                frame = render(ev, shown=self.shown) if render is not None else None
                with self._cond:
                    self.started = self.started or time.time()
                    self.events.append(ev)
                    if frame is not None:
                        self.frames.append(frame)
                    self._cond.notify_all()
            outcome = outcome_of(pg, self.prompt, self.settings, records)
            self._end(outcome=outcome, final=render_final(outcome) if render_final is not None and self.shown else None)
        except Exception as e:
            self._end(error=e)
        finally:
            self.seconds = time.perf_counter() - t0
            if on_end is not None:
                on_end(self)

    @property
    def shown(self) -> bool:
        """A page shows it: one watches it, or it is recorded in the background (for the pages it will answer)."""
        return self.pages > 0 or self.background

    def _end(self, *, outcome: Outcome | None = None, error: Exception | None = None, final=None) -> None:
        with self._cond:
            self.outcome, self.error, self.ended, self.finished = outcome, error, True, time.time()
            self.final = final
            # the outcome (and its last frame) hold the finished records: the snapshots are not kept
            self.events, self.frames = [], []
            self._cond.notify_all()

    def stop_check(
        self, stop: StopCheck | None = None, *, device_waiting: Callable[[], int] | None = None
    ) -> StopCheck:
        """Between two steps: go on while someone watches; with nobody, a user's run ends, and a background one
        goes on until a user hands the device a run (``device_waiting``). ``stop``: any other reason first."""

        def check() -> str | None:
            if stop is not None and (why := stop()):
                return why
            if self.watchers > 0:
                return None
            if not self.background:
                return ALL_LEFT
            return GIVES_WAY if device_waiting is not None and device_waiting() else None

        return check

    # ------------------------------------------------------------ the watchers (any thread)
    def watch(self, *, page: bool = False) -> None:
        with self._cond:
            self.watchers += 1
            self.pages += page

    def leave(self, *, page: bool = False) -> None:
        with self._cond:
            self.watchers -= 1
            self.pages -= page

    def follow(self, stop: StopCheck | None = None, *, poll: float = 0.25) -> Iterator[Batch]:
        """The run's events in batches, from its first (a late watcher catches up in one batch) to its end.
        ``stop`` (this watcher's caller gone, its bound) is asked between batches: a reason raises RunStopped
        for this watcher only; it must ``leave`` (the run goes on for anyone else watching)."""
        seen = shown = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: len(self.events) > seen or self.ended, timeout=poll)
                new, frames, ended = tuple(self.events[seen:]), tuple(self.frames[shown:]), self.ended
            seen, shown = seen + len(new), shown + len(frames)
            if new or frames or ended:
                yield Batch(new, frames, ended)
            if ended:
                return
            if stop is not None and (why := stop()):
                raise RunStopped(why)

    def shared(self, how: str, *, now: float | None = None) -> dict:
        """What an answer says when it did not start this run: ``how`` it got it ("joined": it was running;
        "recorded": it had ended), how long ago, and the sentence the page and the API show."""
        now = time.time() if now is None else now
        if how == "recorded":
            ago = now - (self.finished or now)
            note = (
                f"Computed {age(ago)} ago on this server for an identical request; "
                "the timings are that run's measurements."
            )
        elif self.started is None:
            ago = 0.0
            note = (
                "Joined the run of an identical request, which starts now on this server; "
                "the timings are that run's measurements."
            )
        else:
            ago = now - self.started
            note = (
                f"Joined a run that an identical request started {age(ago)} ago on this server; "
                "the timings are that run's measurements."
            )
        return {"how": how, "seconds_ago": round(ago, 1), "note": note}


class SharedRuns:
    """The server's runs by request: those running now and those finished recently (the latter bounded by
    ``max_results`` and ``max_megabytes``, least recently used out first). Thread-safe."""

    def __init__(self, *, max_results: int = MAX_RESULTS, max_megabytes: float = MAX_MEGABYTES):
        self.max_results, self.max_bytes = max_results, int(max_megabytes * 2**20)
        self._running: dict[str, SharedRun] = {}
        self._done: OrderedDict[str, tuple[SharedRun, int]] = OrderedDict()
        # the wall seconds of the latest runs that finished on the device (what a waiting caller's estimate uses)
        self.durations: deque[float] = deque(maxlen=RECENT_RUNS)
        self._lock = threading.Lock()

    @staticmethod
    def key(identity: str, prompt, settings: Settings) -> str:
        """A request's key: the server's identity (model, heads, device, engine), the prompt and every setting."""
        return repr((identity, prompt, tuple(getattr(settings, f.name) for f in fields(settings))))

    def holds(self, key: str) -> bool:
        """An identical request is running or was recorded: a request with this key needs no place in the queue."""
        with self._lock:
            return key in self._running or key in self._done

    def take(
        self,
        key: str,
        prompt: str,
        settings: Settings,
        *,
        live: bool = False,
        background: bool = False,
        page: bool = False,
    ) -> tuple[SharedRun, str]:
        """The run a request watches, and how it got it: "joined" (running), "recorded" (finished), or "new" (a
        run to produce, registered now so that identical requests join it; ``live``: always new). The caller
        watches it (``watch`` is done here, atomically with the look-up; ``page``: a page, which shows its frames),
        except a ``background`` run."""
        with self._lock:
            if not live and not background:
                run = self._running.get(key)
                if run is not None:
                    run.watch(page=page)
                    return run, "joined"
                done = self._done.get(key)
                if done is not None:
                    self._done.move_to_end(key)
                    done[0].watch(page=page)
                    return done[0], "recorded"
            run = SharedRun(key, prompt, settings, background=background)
            if not background:
                run.watch(page=page)
            # a live run beside a running identical one: later requests join the newer one
            self._running[key] = run
            return run, "new"

    def ended(self, run: SharedRun) -> None:
        """A run ended: a finished one is kept (the newest result for its request), a failed one forgotten."""
        size = deep_bytes(run.outcome.records) if run.outcome is not None else 0
        with self._lock:
            if self._running.get(run.key) is run:
                del self._running[run.key]
            if run.outcome is None:
                return
            if run.seconds is not None:
                self.durations.append(run.seconds)
            self._done.pop(run.key, None)
            self._done[run.key] = (run, size)
            while self._done and (
                len(self._done) > self.max_results or sum(s for _, s in self._done.values()) > self.max_bytes
            ):
                self._done.popitem(last=False)

    def typical_seconds(self) -> float | None:
        """The mean wall time of the latest runs that finished (None before the first): a waiting caller's estimate."""
        with self._lock:
            return sum(self.durations) / len(self.durations) if self.durations else None

    def recorded(self) -> list[SharedRun]:
        with self._lock:
            return [run for run, _ in self._done.values()]

    def recorded_bytes(self) -> int:
        with self._lock:
            return sum(s for _, s in self._done.values())
