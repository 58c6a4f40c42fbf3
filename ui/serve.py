"""How the server takes calls: every run through the one device queue, a size limit on that queue and
a share of it per client, no route around it, and uploads capped small (the page takes no file).

``serve(demo, ...)`` is what app.py and the tests' live servers call, so the tests exercise the same
server a user gets.
"""

from __future__ import annotations

import gradio as gr

from .ui import launch_options

DEVICE = "device"  # the concurrency id of every event that runs the model (ui.py, lab.py)
QUEUE_SIZE = 16  # calls that may wait for the device at once (MEDUSA_MAX_QUEUE)
CLIENT_SHARE = 4  # of them from one client address (MEDUSA_MAX_QUEUE_PER_CLIENT)
UPLOAD_LIMIT = "1mb"  # the page takes no file: gradio's upload route stores at most this much a file
BUSY = (
    "The server is busy: {n} runs are already waiting for the device, the most it queues; try again in a few minutes."
)
YOURS = (
    "{n} runs from your address are already waiting for the device, the most one client may queue; "
    "wait for one to finish (or cancel one), then try again."
)


def client_of(request) -> str:
    """Who a call comes from: its address, and the address a proxy (a Hugging Face Space) says it forwards.

    A client can write any X-Forwarded-For it likes, so the header alone never decides: a spoofed one
    still shares the queue's size limit with everyone else."""
    host = getattr(getattr(request, "client", None), "host", None) or "?"
    headers = getattr(request, "headers", None) or {}
    forwarded = str(headers.get("x-forwarded-for", "")).split(",")[0].strip()
    return f"{host}|{forwarded}"


def guard_queue(demo: gr.Blocks, *, size: int = QUEUE_SIZE, per_client: int = CLIENT_SHARE) -> None:
    """Refuse a run that would wait behind ``size`` others, or that one client asks for while ``per_client``
    of its runs wait: HTTP 503 with one sentence (the page and gradio_client show it as "busy, try again").
    Runs that are running do not count: only those waiting for their turn."""
    queue = demo._queue  # gradio's queue, made by demo.queue(); it has no per-client limit of its own
    push = queue.push

    async def guarded_push(body, request, username):
        fn = demo.fns.get(body.fn_index) if body.fn_index is not None else None
        line = queue.event_queue_per_concurrency_id.get(DEVICE)
        if fn is not None and fn.concurrency_id == DEVICE and line is not None:
            waiting = list(line.queue)
            if len(waiting) >= size:
                return False, BUSY.format(n=len(waiting)), "queue_full"
            me = client_of(request)
            mine = sum(client_of(e.request) == me for e in waiting)
            if mine >= per_client:
                return False, YOURS.format(n=mine), "queue_full"
        return await push(body, request, username)

    queue.push = guarded_push


def serve(
    demo: gr.Blocks,
    *,
    server_name: str,
    server_port: int,
    queue_size: int = QUEUE_SIZE,
    per_client: int = CLIENT_SHARE,
    **launch,
) -> gr.Blocks:
    """Queue and launch ``demo``: one run at a time on the device (the events' concurrency limit of 1, and
    ``DeviceTurn`` underneath), no REST route that skips the queue (``api_open=False``: ``/gradio_api/run/...``
    and ``fn_index`` posts are refused), the queue's limits, small uploads. ``launch`` goes on to
    ``demo.launch`` (share, prevent_thread_lock, quiet)."""
    demo.queue(default_concurrency_limit=1, api_open=False)
    guard_queue(demo, size=queue_size, per_client=per_client)
    demo.launch(
        server_name=server_name,
        server_port=server_port,
        max_file_size=UPLOAD_LIMIT,
        **launch_options(),
        **launch,
    )
    return demo
