"""A call's life on the one device: the GPU it asks for, its turn, its caller, and what Stop shows.

Gradio cannot stop the thread a run streams from: a run checks between two steps whether its
caller is gone (``caller_gone``), runs on the device's one thread, one run at a time (``DeviceTurn``), and leaves
per browser session the columns it last sent (``LiveColumns``), which Stop shows marked stopped.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterator, TypeVar

import anyio
import gradio as gr

# Hugging Face Spaces (ZeroGPU): request the GPU only while a run needs it
try:
    import spaces

    on_gpu: Callable = spaces.GPU
except ImportError:

    def on_gpu(fn: Callable) -> Callable:
        return fn


# the page column each method's run streams into
COLUMN = {
    "plain": "col_plain",
    "plain-sample": "col_plain",
    "medusa-greedy": "col_greedy",
    "medusa-sample": "col_greedy",
    "medusa-typical": "col_typical",
}
CANCELLED = "The call was cancelled, so its run stopped."
GONE = "The caller closed its connection, so its run stopped."
log = logging.getLogger("medusa_playground")
T = TypeVar("T")


def caller_gone() -> Callable[[], str | None]:
    """Inside a queued handler's worker thread: a check that says when gradio has let go of the call.

    A plain function runs in a thread that gradio cannot stop: ``/cancel`` (what gradio_client's
    ``job.cancel()`` posts) cancels the event's asyncio task, and a client that closes its event
    stream marks the event dead (``alive = False``); the thread sees neither unless it looks. This
    looks, so a run can end between two steps. A client that never opens its stream sends no
    signal at all: the wall-time bound (``deadline``) ends its run."""
    from gradio.context import LocalContext

    event_id, blocks = LocalContext.event_id.get(None), LocalContext.blocks.get(None)
    queue = getattr(blocks, "_queue", None)
    # called directly (tests, a notebook): nobody to lose
    if event_id is None or queue is None:
        return lambda: None
    # the event's task, named "<session>_<fn><gradio-sep><event id>" by gradio's queue
    try:
        tasks = anyio.from_thread.run_sync(asyncio.all_tasks)
    except RuntimeError:
        # not a worker thread of the server's event loop
        tasks = set()
    task = next((t for t in tasks if t.get_name().endswith(f"<gradio-sep>{event_id}")), None)

    def check() -> str | None:
        if task is not None and (task.cancelling() or task.done()):
            return CANCELLED
        event = queue.event_ids_to_events.get(event_id)
        return GONE if event is not None and not event.alive else None

    return check


class DeviceTurn:
    """The device's one line: every run, whatever its route (the page, ``/compare``, the race replay,
    the Tree lab's measurements, a client that skips the page), executes on one long-lived thread, in
    the order it arrived, so no run ever overlaps another and every run's timings are its own.

    The thread is app.py's main thread (``serve_forever``), the thread that loaded the model, as in
    ``page_check`` and any script; elsewhere (tests, a notebook) a daemon thread started at the first
    run. torch keeps per-thread state (the OpenMP team of the thread that calls it, its allocator
    arena): running every step on one thread keeps that state warm instead of paying for it again on
    whichever of gradio's pool threads a call or a streamed frame lands on.

    A call's handler waits for its run here and hands on what it yields; when the caller stops
    reading (Stop, a closed stream), the run is closed on the device's thread after the step it is in,
    before the next run starts. In a process forked from the server (ZeroGPU's spaces.GPU) runs go
    inline: the fork holds the calling thread only."""

    def __init__(self):
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        # a job is running on the device's thread
        self._running = False

    def serve_forever(self) -> None:
        """Run the device's jobs on the calling thread, for ever (app.py's main thread, after launch)."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the device's runs already have a thread")
            self._thread = threading.current_thread()
        self._serve()

    def _serve(self) -> None:
        while True:
            # a timeout, so that Ctrl-C reaches the main thread while it waits
            try:
                job = self._jobs.get(timeout=0.5)
            except queue.Empty:
                continue
            self._running = True
            try:
                job.run()
            finally:
                self._running = False

    def waiting(self) -> int:
        """Runs handed to the device that have not started yet."""
        return self._jobs.qsize()

    def idle(self) -> bool:
        """No run holds the device and none waits for it."""
        return not self._running and self._jobs.empty()

    def wait_idle(self, quiet: float) -> None:
        """Return once the device has been idle ``quiet`` seconds in a row (background work's turn)."""
        quiet_since = None
        while True:
            if self.idle():
                quiet_since = quiet_since or time.perf_counter()
                if time.perf_counter() - quiet_since >= quiet:
                    return
            else:
                quiet_since = None
            time.sleep(0.1)

    def _inline(self) -> bool:
        """Run on the calling thread: it is the device's (a run inside a run), or a fork that lacks it."""
        if os.getpid() != self._pid or threading.current_thread() is self._thread:
            return True
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="medusa-device", daemon=True)
                self._thread.start()
        return False

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)`` on the device's thread when its turn comes; its result, or its exception."""
        if self._inline():
            return fn(*args, **kwargs)
        for _, value in self.stream(_once(fn, args, kwargs)):
            return value
        raise RuntimeError("the server stopped before the run ended")

    def submit(self, fn: Callable[..., object], *args) -> None:
        """``fn(*args)`` on the device's thread when its turn comes, with nobody waiting for it: a run that
        several callers watch (``SharedRun``) lives as long as they do, not as long as the one that started it."""
        if self._inline():
            fn(*args)
            return
        self._jobs.put(_Job(_once(fn, args, {}), contextvars.copy_context()))

    def stream(self, frames: Iterator[T]) -> Iterator[T]:
        """``frames`` iterated on the device's thread when its turn comes, each handed on as it is made.
        Closing this iterator closes ``frames`` there, after the step it is in (or before it starts)."""
        if self._inline():
            yield from frames
            return
        # gr.Warning and gr.Progress find their call in it
        job = _Job(frames, contextvars.copy_context())
        self._jobs.put(job)
        try:
            while True:
                kind, value = job.out.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            job.abandoned = True


class _Job:
    def __init__(self, frames: Iterator, context: contextvars.Context):
        self.frames, self.context = frames, context
        self.out: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        # its caller stopped reading: close it at the next step
        self.abandoned = False

    def run(self) -> None:
        try:
            while not self.abandoned:
                try:
                    frame = self.context.run(next, self.frames)
                except StopIteration:
                    break
                self.out.put(("frame", frame))
        except Exception as e:
            # the caller raises it; the device's thread goes on
            self.out.put(("error", e))
        except BaseException:
            # Ctrl-C on the main thread: the server stops
            self.out.put(("error", RuntimeError("the server stopped during the run")))
            raise
        finally:
            try:
                # its decoders and caches go back now, before the next run
                self.context.run(self.frames.close)
            except Exception as e:
                log.error("closing a run failed", exc_info=e)
            self.out.put(("end", None))


def _once(fn: Callable[..., T], args: tuple, kwargs: dict) -> Iterator[tuple[str, T]]:
    yield "result", fn(*args, **kwargs)


class LiveColumns:
    """Per browser session, the columns its run or replay last sent, and whether that has ended.

    Stop's own update and the cancelled run's last frames travel separately, so Stop waits for
    the run to end and then shows what it last sent (not what the page held at the click), marked
    stopped. Kept for the most recent MAX_SESSIONS sessions only."""

    MAX_SESSIONS = 1000
    # seconds Stop waits for the cancelled run to finish its step and close
    STOP_WAIT = 5.0

    def __init__(self):
        self._sessions: OrderedDict[str, tuple[dict[str, str], threading.Event]] = OrderedDict()
        self._lock = threading.Lock()

    def track(self, request: gr.Request | None, names: list[str], frames: Iterator[tuple]) -> Iterator[tuple]:
        session = getattr(request, "session_hash", None)
        columns, ended = {}, threading.Event()
        if session is not None:
            with self._lock:
                self._sessions[session] = (columns, ended)
                self._sessions.move_to_end(session)
                while len(self._sessions) > self.MAX_SESSIONS:
                    self._sessions.popitem(last=False)
        try:
            for frame in frames:
                columns.update({n: v for n, v in zip(names, frame) if n in COLUMN.values() and isinstance(v, str)})
                yield frame
        finally:
            # also on Stop, when gradio closes this generator: close the run (its decoders and caches) first
            frames.close()
            ended.set()

    def last_columns(self, request: gr.Request | None, shown: dict[str, str]) -> dict[str, str]:
        with self._lock:
            entry = self._sessions.get(getattr(request, "session_hash", None))
        if entry is None:
            return shown
        columns, ended = entry
        ended.wait(self.STOP_WAIT)
        return {**shown, **columns}
