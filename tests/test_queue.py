"""One run at a time on every route, every run bounded, the queue limited (issue #35): the device's one thread
(``DeviceTurn``), no REST route around the queue, the bound on the page's /run and the race replay, the
queue's size limit and per-client share, small uploads."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import LIMIT, PROMPT, api_args, free_port, status_text, tiny_playground
from test_concurrency import assert_stops_and_the_next_run_is_quick, count_runs, wait_for

from ui.live import DeviceTurn

PAGE_ARGS = [PROMPT, 200, 0.7, 0.09, 0.3, "chain-2", "", True, True, 0, None, "Medusa greedy / exact sampling"]


def post(url: str, path: str, body: dict | bytes, headers: dict | None = None) -> tuple[int, dict | str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


# ---------------------------------------------------------------- the device's one thread
def test_runs_from_many_threads_run_one_at_a_time_on_one_thread():
    """What three calls posted at once get, whatever route brought them: the same thread, never overlapping."""
    device, lock = DeviceTurn(), threading.Lock()
    seen, active, peak = [], [0], [0]

    def work(i):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        seen.append(threading.get_ident())
        return i * i

    results = {}
    threads = [threading.Thread(target=lambda i=i: results.update({i: device.call(work, i)})) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {0: 0, 1: 1, 2: 4} and peak[0] == 1 and len(set(seen)) == 1
    assert seen[0] not in {t.ident for t in threads}


def test_a_run_s_error_reaches_its_caller_and_the_device_goes_on():
    device = DeviceTurn()
    with pytest.raises(ZeroDivisionError):
        device.call(lambda: 1 / 0)
    assert device.call(lambda: 7) == 7
    assert list(device.stream(iter(range(4)))) == [0, 1, 2, 3]


def test_a_stream_its_caller_leaves_is_closed_on_the_device_and_the_next_run_waits_for_that():
    device, log = DeviceTurn(), []

    def frames():
        try:
            for i in range(1000):
                time.sleep(0.01)
                yield i
        finally:
            log.append(("closed", threading.get_ident()))

    stream = device.stream(frames())
    assert next(stream) == 0
    stream.close()  # Stop, or a closed event stream
    assert device.call(lambda: log[:]) == [("closed", device._thread.ident)]  # closed before the next run began


def test_serve_forever_runs_the_jobs_on_the_thread_that_calls_it():
    device = DeviceTurn()
    server = threading.Thread(target=device.serve_forever, daemon=True)
    server.start()
    assert wait_for(lambda: device._thread is server, 5) < 5
    assert device.call(threading.get_ident) == server.ident


def test_a_run_inside_a_run_goes_inline_and_a_forked_process_runs_inline():
    device = DeviceTurn()
    assert device.call(lambda: device.call(lambda: 3)) == 3
    device._pid = -1  # as in a process forked from the server (ZeroGPU): it has no device thread
    assert device.call(threading.get_ident) == threading.get_ident()


# ---------------------------------------------------------------- every route bounded
def test_the_page_s_run_stops_at_the_bound_with_its_sentence(monkeypatch):
    """/run (the page's Run, also reachable by any client) ends at MEDUSA_MAX_RUN_SECONDS, as /compare does."""
    from ui.handlers import Handlers

    pg = tiny_playground(oracle=False)
    stats = count_runs(monkeypatch, pg, step_seconds=0.02)
    outs = list(Handlers(pg, max_run_seconds=0.5).run(*PAGE_ARGS))
    assert status_text(outs[-1][0]) == (
        "**Cannot run:** The run was stopped after 0.5 s, the most this server gives one call "
        "(MEDUSA_MAX_RUN_SECONDS); ask for fewer new tokens or send a shorter prompt."
    )
    assert stats["closed"] == 1 and stats["steps"] < 100


def test_the_race_replay_stops_at_the_bound():
    from ui.handlers import REPLAY_OUTPUTS, RUN_OUTPUTS, Handlers

    pg = tiny_playground(oracle=False)
    records = list(Handlers(pg).run(*PAGE_ARGS[:1], 24, *PAGE_ARGS[2:]))[-1][RUN_OUTPUTS.index("session")]
    h = Handlers(pg, max_run_seconds=0.5)
    t0 = time.perf_counter()
    outs = list(h.replay(records, "0.001x"))  # a replay of several minutes
    assert time.perf_counter() - t0 < 5
    assert status_text(outs[-1][REPLAY_OUTPUTS.index("status")]) == (
        "**Cannot run:** The replay was stopped after 0.5 s, the most this server gives one call "
        "(MEDUSA_MAX_RUN_SECONDS); pick a faster replay speed."
    )


# ---------------------------------------------------------------- a live server
@pytest.fixture(scope="module")
def served_small():
    """A live server whose queue holds 3 waiting runs, 2 of them from one client."""
    from gradio_client import Client

    from ui import build_demo, serve

    pg = tiny_playground()
    pg.max_new_tokens_limit = LIMIT
    demo = build_demo(pg, max_new_tokens=16)
    port = free_port()
    serve(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, queue_size=3,
          per_client=2)  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    try:
        yield pg, url, Client(url, verbose=False)
    finally:
        demo.close()


def test_direct_rest_calls_cannot_skip_the_queue(served_small):
    """Off Spaces gradio leaves its REST routes open: /gradio_api/run/<name> and fn_index posts ran beside the queue."""
    pg, url, client = served_small
    for path, body in [
        ("gradio_api/run/compare", {"data": api_args(PROMPT, {"max_new_tokens": 4})}),
        ("gradio_api/api/compare", {"data": api_args(PROMPT, {"max_new_tokens": 4})}),
        ("gradio_api/run/predict", {"data": [], "fn_index": 0}),
    ]:
        status, answer = post(url, path, body)
        assert status == 404, (path, status, answer)
        assert "join the queue" in json.dumps(answer), (path, answer)
    # the queue's own route still runs
    assert client.predict(PROMPT, 4, api_name="/compare")["methods"]["plain"]["tokens"] == 4


def gate_runs(monkeypatch, pg) -> tuple[threading.Event, dict]:
    """Every run waits at its start until the gate opens: the queue behind it fills."""
    orig, gate, stats = type(pg).run, threading.Event(), {"started": 0}

    def run(ids, decoders, **kw):
        stats["started"] += 1
        gate.wait(60)
        yield from orig(pg, ids, decoders, **kw)

    monkeypatch.setattr(pg, "run", run)
    return gate, stats


def test_the_queue_has_a_size_limit_and_one_client_cannot_hold_every_place(served_small, monkeypatch):
    pg, url, client = served_small
    gate, stats = gate_runs(monkeypatch, pg)
    body = {"data": api_args(PROMPT, {"max_new_tokens": 4})}
    me, other, third = {}, {"X-Forwarded-For": "10.0.0.2"}, {"X-Forwarded-For": "10.0.0.3"}
    try:
        assert post(url, "gradio_api/call/compare", body, me)[0] == 200  # runs (held at the gate)
        assert wait_for(lambda: stats["started"] == 1, 30) < 30
        assert [post(url, "gradio_api/call/compare", body, me)[0] for _ in range(2)] == [200, 200]  # wait
        status, answer = post(url, "gradio_api/call/compare", body, me)  # a third waiting run from one client
        assert status == 503 and answer["detail"] == (
            "2 runs from your address are already waiting for the device, the most one client may queue; "
            "wait for one to finish (or cancel one), then try again."
        )
        assert post(url, "gradio_api/call/compare", body, other)[0] == 200  # another client: the 3rd place
        status, answer = post(url, "gradio_api/call/compare", body, third)
        assert status == 503 and answer["detail"].startswith(
            "The server is busy: 3 runs are already waiting for the device, the most it queues; try again"
        )
    finally:
        gate.set()
    assert wait_for(lambda: stats["started"] == 4, 60) < 60  # the four accepted runs all ran
    assert client.predict(PROMPT, 4, api_name="/compare")["methods"]["plain"]["tokens"] == 4


def test_an_unread_page_run_releases_the_device_at_the_bound(served_small, monkeypatch):
    """A /run posted and never read kept the device for its whole run (98.8 s in the issue): now the bound ends it."""
    import ui.handlers
    from medusa_lib.present import deadline

    pg, url, client = served_small
    monkeypatch.setattr(ui.handlers, "deadline", lambda seconds: deadline(2.0))
    stats = count_runs(monkeypatch, pg, step_seconds=0.02)
    page = PAGE_ARGS[:1] + [LIMIT] + PAGE_ARGS[2:] + ["greedy", "medusa"]
    assert post(url, "gradio_api/call/run", {"data": page})[0] == 200  # posted, its stream never opened
    assert wait_for(lambda: stats["steps"] >= 1, 60) < 60
    assert_stops_and_the_next_run_is_quick(pg, client, stats, within=6)


def test_uploads_are_capped_small(served_small):
    pg, url, client = served_small
    boundary = "xyz"
    payload = b"0" * (2 * 2**20)
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="big.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    status, answer = post(url, "gradio_api/upload", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert status == 413, (status, answer)


def test_the_app_s_queue_limits_are_the_server_s_and_a_bad_one_gets_its_sentence(monkeypatch):
    from test_cli import load_app_module

    from ui.serve import CLIENT_SHARE, QUEUE_SIZE

    for k in ("MEDUSA_MAX_QUEUE", "MEDUSA_MAX_QUEUE_PER_CLIENT"):
        monkeypatch.delenv(k, raising=False)
    app_cli = load_app_module(monkeypatch)
    assert (app_cli.MAX_QUEUE, app_cli.MAX_QUEUE_PER_CLIENT) == (QUEUE_SIZE, CLIENT_SHARE)
    with pytest.raises(SystemExit) as e:
        load_app_module(monkeypatch, MEDUSA_MAX_QUEUE="0")
    assert str(e.value) == "error: MEDUSA_MAX_QUEUE='0' is not a whole number from 1 up; fix it or unset it."


@pytest.mark.parametrize("interrupts", [1, 2])
def test_ctrl_c_closes_the_server_without_a_traceback(model_folder, tmp_path, interrupts):
    """app.py runs every run on its main thread (DeviceTurn.serve_forever): Ctrl-C still reaches it and closes the
    server, once or twice pressed."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from conftest import random_heads

    port, heads = free_port(), tmp_path / "heads"
    random_heads().save(heads)
    root = Path(__file__).resolve().parents[1]
    server = subprocess.Popen(
        [sys.executable, str(root / "app.py"), "--model", str(model_folder), "--heads", str(heads), "--device", "cpu"]
        + ["--port", str(port)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job starts with it ignored
    )
    try:

        def up() -> bool:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
                return True
            except OSError:
                return server.poll() is not None  # it exited: nothing to wait for

        assert wait_for(up, 120) < 120 and server.poll() is None, server.stdout.read().decode()[-2000:]
        time.sleep(1)
        for _ in range(interrupts):
            server.send_signal(signal.SIGINT)
            time.sleep(0.3)
        server.wait(20)
    finally:
        server.kill()
    out = server.stdout.read().decode()
    assert "Keyboard interruption in main thread... closing server." in out and "Traceback" not in out, out[-2000:]
