"""A call's life on the one device: the GPU it asks for, its turn, its caller, and what Stop shows.

Gradio cannot stop the thread a run streams from: a run checks between two steps whether its
caller is gone (``caller_gone``), takes the device one run at a time (``DeviceTurn``), and leaves
per browser session the columns it last sent (``LiveColumns``), which Stop shows marked stopped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Iterator

import anyio
import gradio as gr

try:  # Hugging Face Spaces (ZeroGPU): request the GPU only while a run needs it
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
# seconds a call waits for a cancelled run to notice and give the device back (it checks between steps)
DEVICE_WAIT = 10.0
CANCELLED = "The call was cancelled, so its run stopped."
GONE = "The caller closed its connection, so its run stopped."
log = logging.getLogger("medusa_playground")


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
    if event_id is None or queue is None:  # called directly (tests, a notebook): nobody to lose
        return lambda: None
    try:  # the event's task, named "<session>_<fn><gradio-sep><event id>" by gradio's queue
        tasks = anyio.from_thread.run_sync(asyncio.all_tasks)
    except RuntimeError:  # not a worker thread of the server's event loop
        tasks = set()
    task = next((t for t in tasks if t.get_name().endswith(f"<gradio-sep>{event_id}")), None)

    def check() -> str | None:
        if task is not None and (task.cancelling() or task.done()):
            return CANCELLED
        event = queue.event_ids_to_events.get(event_id)
        return GONE if event is not None and not event.alive else None

    return check


class DeviceTurn:
    """One run at a time on the device, also after a cancel: gradio frees the queue's slot as soon as
    it cancels a call, while the cancelled run's thread still finishes its step; the next run waits
    for it here (at most DEVICE_WAIT seconds), so its timings are not shared with a dying run."""

    def __init__(self):
        self._lock = threading.Lock()

    @contextmanager
    def turn(self) -> Iterator[None]:
        held = self._lock.acquire(timeout=DEVICE_WAIT)
        if not held:
            log.warning("a stopped run held the device for over %g s; running beside it", DEVICE_WAIT)
        try:
            yield
        finally:
            if held:
                self._lock.release()


class LiveColumns:
    """Per browser session, the columns its run or replay last sent, and whether that has ended.

    Stop's own update and the cancelled run's last frames travel separately, so Stop waits for
    the run to end and then shows what it last sent (not what the page held at the click), marked
    stopped. Kept for the most recent MAX_SESSIONS sessions only."""

    MAX_SESSIONS = 1000
    STOP_WAIT = 5.0  # seconds Stop waits for the cancelled run to finish its step and close

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
        finally:  # also on Stop, when gradio closes this generator: close the run (its decoders and caches) first
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
