"""How the server takes calls: every run through the one device queue, a size limit on that queue, a share
of it per user (a browser session) and per network address, no route around it, numbers that are numbers,
and no uploads (the page takes no file).

``serve(demo, ...)`` is what app.py and the tests' live servers call, so the tests exercise the same
server a user gets.
"""

from __future__ import annotations

import ipaddress
import os
from contextlib import contextmanager

import gradio as gr

from .background import compile_between_runs
from .door import refusal, session_blocks
from .ui import launch_options

# the concurrency id of every event that runs the model (ui.py, lab.py)
DEVICE = "device"
# the line of calls that watch a run already the device's (joined or recorded: sharing.py); no concurrency limit
SHARED = "shared"
# calls that may wait for the device at once (MEDUSA_MAX_QUEUE): a class of 30, each with a run and some a second
QUEUE_SIZE = 64
# gradio's worker threads (its default: 40): each watcher of a shared run holds one while it waits for frames
MAX_THREADS = 160
# of them from one user: a browser session, or a gradio_client (MEDUSA_MAX_QUEUE_PER_CLIENT)
CLIENT_SHARE = 4
# of them from one network address (MEDUSA_MAX_QUEUE_PER_ADDRESS): a class of 30 behind one school network
# each has a place, and some a second one
ADDRESS_SHARE = 40
# How often gradio's event loop looks for a free slot, and for progress to send: its defaults wake the loop every
# millisecond, also while a run decodes, and on a small machine that CPU is taken from the decode's threads.
# A queued call then starts at most this much later.
QUEUE_POLL_SECONDS = 0.02
PROGRESS_POLL_SECONDS = 0.1
# the page takes no file: gradio's upload route stores at most this much a file
UPLOAD_LIMIT = "1mb"
# gradio's upload route stores every file it is sent, with no limit on their number: the page takes none, so it is shut
UPLOAD_ROUTES = ("/gradio_api/upload", "/upload")
DRAIN_BYTES = 4 * 2**20
NO_UPLOADS = "This server takes no uploads: the page and its API take text and numbers only; send those instead."
BUSY = (
    "The server is busy: {n} runs are already waiting for the device, the most it queues; try again in a few minutes."
)
YOURS = (
    "{n} of your runs are already waiting for the device, the most one user may queue; "
    "wait for one to finish (or cancel one), then try again."
)
ADDRESS = (
    "{n} runs from your network address are already waiting for the device, the most one address may queue; "
    "try again in a few minutes."
)


def trusted_proxies(text: str) -> tuple[str, ...]:
    """The proxies whose X-Forwarded-For entry is believed (MEDUSA_TRUSTED_PROXIES): addresses or networks,
    comma-separated; empty: none, and the header is ignored. A bad entry raises ValueError with one sentence."""
    entries = tuple(e.strip() for e in text.split(",") if e.strip())
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False) if "/" in entry else ipaddress.ip_address(entry)
        except ValueError:
            raise ValueError(
                f"{entry[:40]!r}, which is not an IP address or network (such as 10.0.0.1 or 10.0.0.0/8)"
            ) from None
    return entries


def address_of(request) -> str:
    """The address a call comes from: the connection's own, or, where that is a trusted proxy, the entry that
    proxy appended to X-Forwarded-For (uvicorn resolves it from ``trusted_proxies`` at launch: ``serve``).
    Entries a client wrote itself never count, so the header cannot make one machine look like many."""
    return getattr(getattr(request, "client", None), "host", None) or "?"


def user_of(session_hash: str | None, request) -> str:
    """Who a call's share belongs to: its browser session (or gradio_client's), so a class behind one address
    is 30 users; a call that names no session (a raw ``/call`` post) shares one with its whole address."""
    return f"session {session_hash}" if session_hash else f"address {address_of(request)}"


def waiting_user(event) -> str:
    # gradio gives a call without a session hash its own event id as one
    named = event.session_hash if event.session_hash != event._id else None
    return user_of(named, event.request)


def move_to_shared_line(queue, accepted: tuple) -> None:
    """Move a call gradio just queued (``push``'s answer) from the device's line to the shared one, which has no
    concurrency limit: its handler starts at once and watches a run that is already the device's. Nothing awaits
    between gradio's append and this, so the call has not started yet."""
    ok, event_id, _ = accepted
    event = queue.event_ids_to_events.get(event_id) if ok else None
    line = queue.event_queue_per_concurrency_id.get(getattr(event, "concurrency_id", None))
    if event is None or line is None or event not in line.queue:
        return
    line.queue.remove(event)
    if SHARED not in queue.event_queue_per_concurrency_id:
        from gradio.queueing import EventQueue

        queue.event_queue_per_concurrency_id[SHARED] = EventQueue(SHARED, None)
    event.concurrency_id = SHARED
    queue.event_queue_per_concurrency_id[SHARED].queue.append(event)


class MeasuredRuns:
    """gradio's per-event process time (what its queue's estimates are made of), read from the runs that really ran
    on the device: a call answered from a recorded run ends in milliseconds, and gradio's own average of every call
    would tell a waiting user they are nearly there. Calls add nothing to it."""

    def __init__(self, runs):
        self.runs = runs

    @property
    def avg_time(self) -> float:
        return self.runs.typical_seconds() or 0.0

    def add(self, seconds: float) -> None:
        pass


def measured_estimates(demo: gr.Blocks, handlers) -> None:
    """The estimates of the page's Run and ``/compare`` come from the measured runs (``MeasuredRuns``), once one
    has finished (before that gradio shows none)."""
    queue, sharing = demo._queue, handlers.sharing
    measured = MeasuredRuns(sharing.runs)

    def ended(_run) -> None:
        if sharing.runs.typical_seconds() is not None:
            for fn in sharing.routes:
                queue.process_time_per_fn[fn] = measured

    sharing.on_end.append(ended)


def guard_queue(
    demo: gr.Blocks,
    *,
    size: int = QUEUE_SIZE,
    per_client: int = CLIENT_SHARE,
    per_address: int = ADDRESS_SHARE,
    door=None,
    explain=None,
) -> None:
    """Refuse a run that would wait behind ``size`` others, or that one network address asks for while
    ``per_address`` of its runs wait, or one user (a browser session) while ``per_client`` of theirs wait: HTTP
    503 with one sentence (the page and gradio_client show it as "busy, try again"). Runs that are running do not
    count: only those waiting for their turn. A call with a NaN or an infinity anywhere, or a value gradio would
    refuse in its own words (``door.refusal``): HTTP 400 and the project's sentence.
    ``door(fn, data)``: true for a call that an identical running or recorded run answers (``Sharing.door``); it
    takes no place and starts at once (``move_to_shared_line``). ``explain(fn, data)``: the handler's own sentence
    for a call (``Sharing.sentence``)."""
    # gradio's queue, made by demo.queue(); it has no per-client limit of its own
    queue = demo._queue
    push = queue.push

    async def guarded_push(body, request, username):
        fn = demo.fns.get(body.fn_index) if body.fn_index is not None else None
        why = refusal(fn, body.data, read=explain, current=session_blocks(demo, body.session_hash))
        if why is not None:
            return False, why, "error"
        line = queue.event_queue_per_concurrency_id.get(DEVICE)
        # joined to a running run or answered from a recorded one: no place in the device's line
        if fn is not None and door is not None and door(fn, body.data):
            accepted = await push(body, request, username)
            move_to_shared_line(queue, accepted)
            return accepted
        if fn is not None and fn.concurrency_id == DEVICE and line is not None:
            waiting = list(line.queue)
            if len(waiting) >= size:
                return False, BUSY.format(n=len(waiting)), "queue_full"
            here = address_of(request)
            from_here = sum(address_of(e.request) == here for e in waiting)
            if from_here >= per_address:
                return False, ADDRESS.format(n=from_here), "queue_full"
            me = user_of(body.session_hash, request)
            mine = sum(waiting_user(e) == me for e in waiting)
            if mine >= per_client:
                return False, YOURS.format(n=mine), "queue_full"
        return await push(body, request, username)

    queue.push = guarded_push


@contextmanager
def forwarded_for(proxies: tuple[str, ...]):
    """uvicorn reads the proxies it trusts from FORWARDED_ALLOW_IPS when gradio starts it, and trusts the
    loopback by default: a client on the server's machine could name any address. Set while the server starts."""
    before = os.environ.get("FORWARDED_ALLOW_IPS")
    os.environ["FORWARDED_ALLOW_IPS"] = ",".join(proxies)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FORWARDED_ALLOW_IPS", None)
        else:
            os.environ["FORWARDED_ALLOW_IPS"] = before


def serve(
    demo: gr.Blocks,
    *,
    server_name: str,
    server_port: int,
    queue_size: int = QUEUE_SIZE,
    per_client: int = CLIENT_SHARE,
    per_address: int = ADDRESS_SHARE,
    proxies: tuple[str, ...] = (),
    record_examples: bool = False,
    **launch,
) -> gr.Blocks:
    """Queue and launch ``demo``: one run at a time on the device (the events' concurrency limit of 1, and
    ``DeviceTurn`` underneath), no REST route that skips the queue (``api_open=False``: ``/gradio_api/run/...``
    and ``fn_index`` posts are refused), the queue's limits, an event loop that leaves the CPU to the decode,
    small uploads. ``proxies``: the trusted proxies
    (``trusted_proxies``) whose X-Forwarded-For entry names the caller's address. ``launch`` goes on to
    ``demo.launch`` (share, prevent_thread_lock, quiet)."""
    demo.queue(default_concurrency_limit=1, api_open=False)
    demo._queue.sleep_when_free = QUEUE_POLL_SECONDS
    demo._queue.progress_update_sleep_when_free = PROGRESS_POLL_SECONDS
    handlers = getattr(demo, "handlers", None)
    door = handlers.sharing.door if handlers is not None else None
    explain = handlers.sharing.sentence if handlers is not None else None
    guard_queue(demo, size=queue_size, per_client=per_client, per_address=per_address, door=door, explain=explain)
    if handlers is not None:
        measured_estimates(demo, handlers)
    block = not launch.pop("prevent_thread_lock", False)
    with forwarded_for(trusted_proxies(",".join(proxies))):
        demo.launch(
            server_name=server_name,
            server_port=server_port,
            max_file_size=UPLOAD_LIMIT,
            max_threads=MAX_THREADS,
            prevent_thread_lock=True,
            **launch_options(),
            **launch,
        )
    refuse_uploads(demo.app)
    # the page's examples at its starting values, recorded while no run needs the device: never before the page,
    # and after a compiled engine being built is swapped in (what it records is what later runs run on)
    record = None
    if record_examples and handlers is not None and getattr(demo, "examples", None):
        record = lambda: handlers.sharing.record_in_background(demo.examples, demo.start, say=print)  # noqa: E731
    if handlers is not None and handlers.pg.pending is not None:
        compile_between_runs(handlers.pg, handlers.device, say=print, then=record)
    elif record is not None:
        record()
    if block:
        demo.block_thread()
    return demo


def refuse_uploads(app) -> None:
    """Answer every upload with HTTP 403 and one sentence, before gradio's own route (the first match wins)."""
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def no_uploads(request):
        read = 0
        # read what was sent (a little): a client that is cut off mid-send never sees the answer
        async for chunk in request.stream():
            read += len(chunk)
            if read > DRAIN_BYTES:
                break
        return PlainTextResponse(NO_UPLOADS, status_code=403)

    for path in UPLOAD_ROUTES:
        app.router.routes.insert(0, Route(path, no_uploads, methods=["POST"]))
