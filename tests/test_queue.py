"""One run at a time on every route, every run bounded, the queue limited: the device's one thread
(``DeviceTurn``), no REST route around the queue, the bound on the page's /run and the race replay, the
queue's size limit and its shares per user (browser session) and per address (no forged header buys a place),
NaN and infinity refused in one sentence, small uploads."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

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
    # the run itself ends at its next step (its bound, or its only watcher gone)
    assert wait_for(lambda: stats["closed"] == 1, 5) < 5 and stats["steps"] < 100


def test_the_race_replay_stops_at_the_bound():
    from ui.handlers import Handlers
    from ui.outputs import REPLAY_OUTPUTS, RUN_OUTPUTS

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
    """A live server whose queue holds 4 waiting runs, 3 of them from one address and 2 from one user."""
    from gradio_client import Client

    from ui import build_demo, serve

    pg = tiny_playground()
    pg.max_new_tokens_limit = LIMIT
    demo = build_demo(pg, max_new_tokens=16)
    port = free_port()
    serve(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, queue_size=4,
          per_client=2, per_address=3)  # fmt: skip
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


def call(url: str, body: dict, *, session: str | None = None, forwarded: str | None = None) -> tuple[int, dict | str]:
    """A /call/compare post as any HTTP client may make it: in a session of its choosing or none, and with
    any X-Forwarded-For it likes."""
    return post(
        url,
        "gradio_api/call/compare",
        {**body, **({"session_hash": session} if session else {})},
        {"X-Forwarded-For": forwarded} if forwarded else {},
    )


def yours(n: int) -> str:
    return (
        f"{n} of your runs are already waiting for the device, the most one user may queue; "
        "wait for one to finish (or cancel one), then try again."
    )


def from_address(n: int) -> str:
    return (
        f"{n} runs from your network address are already waiting for the device, the most one address may queue; "
        "try again in a few minutes."
    )


def test_a_forged_forwarded_for_buys_no_place(served_small, monkeypatch):
    """Behind no proxy X-Forwarded-For is ignored: posts from one machine, each naming another address, got every
    place of the queue. Calls in no session share one user per address; new sessions share the address's cap."""
    pg, url, client = served_small  # 4 places, 2 per user, 3 per address
    gate, stats = gate_runs(monkeypatch, pg)
    body = {"data": api_args(PROMPT, {"max_new_tokens": 4}, live=True)}
    try:
        assert call(url, body, forwarded="10.0.0.1")[0] == 200  # runs (held at the gate)
        assert wait_for(lambda: stats["started"] == 1, 30) < 30
        assert [call(url, body, forwarded=f"10.0.0.{i}")[0] for i in (2, 3)] == [200, 200]  # wait
        status, answer = call(url, body, forwarded="10.0.0.4")
        assert (status, answer["detail"]) == (503, yours(2))
        assert call(url, body, session="s1", forwarded="10.0.0.5")[0] == 200  # a session of its own: the 3rd
        status, answer = call(url, body, session="s2", forwarded="10.0.0.6")
        assert (status, answer["detail"]) == (503, from_address(3))
    finally:
        gate.set()
    assert wait_for(lambda: stats["started"] == 4, 60) < 60  # the four accepted runs all ran
    assert client.predict(PROMPT, 4, api_name="/compare")["methods"]["plain"]["tokens"] == 4


@pytest.fixture(scope="module")
def served_behind_a_proxy():
    """A live server that trusts the loopback as its proxy: 4 places, 2 per user, 2 per address."""
    from ui import build_demo, serve

    pg = tiny_playground()
    pg.max_new_tokens_limit = LIMIT
    demo = build_demo(pg, max_new_tokens=16)
    port = free_port()
    serve(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, queue_size=4,
          per_client=2, per_address=2, proxies=("127.0.0.1",))  # fmt: skip
    try:
        yield pg, f"http://127.0.0.1:{port}/", demo
    finally:
        demo.close()


def test_behind_a_trusted_proxy_only_its_own_entry_names_the_address(served_behind_a_proxy, monkeypatch):
    """The proxy appends the address it saw; what the client wrote before it (the left entries) never counts."""
    pg, url, _ = served_behind_a_proxy
    gate, stats = gate_runs(monkeypatch, pg)
    body = {"data": api_args(PROMPT, {"max_new_tokens": 4}, live=True)}
    try:
        assert call(url, body, session="run", forwarded="10.0.0.9")[0] == 200
        assert wait_for(lambda: stats["started"] == 1, 30) < 30
        posts = [call(url, body, session=f"s{i}", forwarded=f"6.6.6.{i}, 10.0.0.2")[0] for i in range(2)]
        assert posts == [200, 200]
        status, answer = call(url, body, session="s2", forwarded="6.6.6.2, 10.0.0.2")
        assert (status, answer["detail"]) == (503, from_address(2))
        assert call(url, body, session="s3", forwarded="10.0.0.3")[0] == 200  # another address behind the proxy
        status, answer = call(url, body, session="s3", forwarded="10.0.0.3")
        assert status == 200
        status, answer = call(url, body, session="s4", forwarded="10.0.0.4")  # every place taken
        assert status == 503 and answer["detail"].startswith(
            "The server is busy: 4 runs are already waiting for the device, the most it queues; try again"
        )
    finally:
        gate.set()
    assert wait_for(lambda: stats["started"] == 5, 60) < 60


def test_a_class_behind_one_address_all_queue_and_each_user_has_a_share(monkeypatch):
    """30 browser sessions from one address each get a place (up to the queue's size); one session's fifth
    waiting run is refused, another session's second is not. The app's default shares."""
    from ui import build_demo, serve
    from ui.serve import ADDRESS_SHARE, CLIENT_SHARE

    assert CLIENT_SHARE == 4 and ADDRESS_SHARE >= 30 + CLIENT_SHARE
    pg = tiny_playground(oracle=False)
    demo = build_demo(pg, max_new_tokens=4)
    port = free_port()
    serve(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, queue_size=40)
    url = f"http://127.0.0.1:{port}/"
    gate, stats = gate_runs(monkeypatch, pg)
    body = {"data": api_args(PROMPT, {"max_new_tokens": 2}, live=True)}
    try:
        assert call(url, body, session="teacher")[0] == 200
        assert wait_for(lambda: stats["started"] == 1, 30) < 30
        assert [call(url, body, session=f"student{i}")[0] for i in range(30)] == [200] * 30
        assert [call(url, body, session="student0")[0] for _ in range(3)] == [200] * 3  # 4 waiting
        status, answer = call(url, body, session="student0")
        assert (status, answer["detail"]) == (503, yours(4))
        assert call(url, body, session="student1")[0] == 200
    finally:
        gate.set()
        try:
            assert wait_for(lambda: stats["started"] == 35, 120) < 120
        finally:
            demo.close()


def test_an_unread_page_run_releases_the_device_at_the_bound(served_small, monkeypatch):
    """A /run posted and never read kept the device for its whole run (98.8 s in the issue): now the bound ends it."""
    import ui.handlers
    from medusa_lib.present import deadline

    pg, url, client = served_small
    monkeypatch.setattr(ui.handlers, "deadline", lambda seconds: deadline(2.0))
    stats = count_runs(monkeypatch, pg, step_seconds=0.02)
    page = PAGE_ARGS[:1] + [LIMIT] + PAGE_ARGS[2:] + ["greedy", "medusa", True]
    assert post(url, "gradio_api/call/run", {"data": page})[0] == 200  # posted, its stream never opened
    assert wait_for(lambda: stats["steps"] >= 1, 60) < 60
    assert_stops_and_the_next_run_is_quick(pg, client, stats, within=6)


def raw_call(url: str, api: str, args: list, at: int, literal: str) -> tuple[int, str]:
    """A /call post whose JSON body has ``literal`` (NaN, Infinity: Python's json reads them, JavaScript's and
    gradio_client's never write them) as argument ``at``: (HTTP status, the error's sentence or the event)."""
    items = [json.dumps(a) for a in args]
    items[at] = literal
    status, answer = post(url, f"gradio_api/call/{api}", ('{"data": [' + ", ".join(items) + "]}").encode())
    if status != 200:
        return status, answer["detail"]
    with urllib.request.urlopen(f"{url}gradio_api/call/{api}/{answer['event_id']}", timeout=60) as resp:
        events = resp.read().decode()
    error = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: ")][-1]
    return status, error.get("error") if isinstance(error, dict) else events


def raw_join(url: str, api: str, args: list, at: int, literal: str) -> tuple[int, str]:
    """The same body posted to /gradio_api/queue/join with the event's fn_index: (HTTP status, the sentence)."""
    import gradio_client

    index = next(
        d.get("id", i)
        for i, d in enumerate(gradio_client.Client(url, verbose=False).config["dependencies"])
        if d.get("api_name") == api
    )
    items = [json.dumps(a) for a in args]
    items[at] = literal
    body = '{"data": [' + ", ".join(items) + f'], "fn_index": {index}, "session_hash": "raw"' + "}"
    status, answer = post(url, "gradio_api/queue/join", body.encode())
    return status, answer["detail"] if status != 200 else answer


COMPARE_NUMBERS = {
    1: "Max new tokens must be a whole number from 1 to 512 (got {}).",
    2: "Temperature must be between 0 and 2 (got {}).",
    3: "Epsilon must be between 0 and 1 (got {}).",
    4: "Delta must be between 0 and 1 (got {}).",
    10: "The seed must be a whole number from 0 to 9223372036854775807 (got {}).",
}
RUN_NUMBERS = {
    1: "Max new tokens must be a whole number from 1 to 512 (got {}).",
    2: "Temperature must be between 0 and 2 (got {}).",
    3: "\u03b5 epsilon must be between 0 and 1 (got {}).",
    4: "\u03b4 delta must be between 0 and 1 (got {}).",
    9: "Seed must be a whole number of at least 0 (got {}).",
}


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_nan_and_infinity_in_a_raw_body_get_one_sentence_for_every_number(served_small, literal):
    """Both at the queue's door (HTTP 400, no place taken): /compare in the playground's words for its parameters,
    the page's /run naming the input by its label, where gradio let NaN through, named no input for an infinity,
    and answered a seed of NaN with no message."""
    pg, url, client = served_small
    compare = api_args(PROMPT, {"max_new_tokens": 4})
    shown = "Infinity" if literal == "1e400" else literal
    for at, sentence in COMPARE_NUMBERS.items():
        assert raw_call(url, "compare", compare, at, literal) == (400, sentence.format(shown)), at
        # the same body through the queue's own route (what gradio_client and the page use), by fn_index
        assert raw_join(url, "compare", compare, at, literal) == (400, sentence.format(shown)), at
    page = PAGE_ARGS[:1] + [4] + PAGE_ARGS[2:] + ["greedy", "medusa", True]
    for at, sentence in RUN_NUMBERS.items():
        assert raw_call(url, "run", page, at, literal) == (400, sentence.format(shown)), at
    assert client.predict(PROMPT, 4, api_name="/compare")["methods"]["plain"]["tokens"] == 4  # still serving


def test_the_event_loop_leaves_the_cpu_to_the_decode(served_behind_a_proxy):
    """gradio's queue looked for work every millisecond, also while a run decodes (its thread took a share of the
    CPU beside the decode's): a served demo looks as often as its own settings say."""
    from ui.serve import PROGRESS_POLL_SECONDS, QUEUE_POLL_SECONDS

    *_, demo = served_behind_a_proxy
    assert QUEUE_POLL_SECONDS >= 0.01 and PROGRESS_POLL_SECONDS >= 0.05
    assert (demo._queue.sleep_when_free, demo._queue.progress_update_sleep_when_free) == (
        QUEUE_POLL_SECONDS,
        PROGRESS_POLL_SECONDS,
    )


def upload(url: str, payload: bytes, name: str = "f.bin", path: str = "gradio_api/upload") -> tuple[int, str]:
    boundary = "xyz"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return post(url, path, body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})


def test_uploads_are_refused_whatever_their_size_or_number(served_small):
    """The page takes no file, but gradio's upload route stored any number of files (each up to the size cap):
    a client could fill the disk a megabyte at a time. Every upload is refused in one sentence, nothing stored."""
    import gradio

    pg, url, client = served_small
    sentence = "This server takes no uploads: the page and its API take text and numbers only; send those instead."
    folder = Path(gradio.utils.get_upload_folder())
    files = lambda: {p.name for p in folder.rglob("*")} if folder.exists() else set()  # noqa: E731
    assert not files() & {"f.bin", "many.bin"}
    for payload in (b"", b"x", b"0" * 1000, b"0" * (2 * 2**20)):
        assert upload(url, payload) == (403, sentence)
    for _ in range(20):
        assert upload(url, b"y" * 100, name="many.bin")[0] == 403
    assert upload(url, b"x", path="upload") == (403, sentence)
    assert not files() & {"f.bin", "many.bin"}  # nothing stored
    assert client.predict(PROMPT, 4, api_name="/compare")["methods"]["plain"]["tokens"] == 4  # still serving


def test_the_app_s_queue_limits_are_the_server_s_and_a_bad_one_gets_its_sentence(monkeypatch):
    from test_cli import load_app_module

    from ui.serve import ADDRESS_SHARE, CLIENT_SHARE, QUEUE_SIZE

    for k in (
        "MEDUSA_MAX_QUEUE",
        "MEDUSA_MAX_QUEUE_PER_CLIENT",
        "MEDUSA_MAX_QUEUE_PER_ADDRESS",
        "MEDUSA_TRUSTED_PROXIES",
    ):
        monkeypatch.delenv(k, raising=False)
    app_cli = load_app_module(monkeypatch)
    assert (app_cli.MAX_QUEUE, app_cli.MAX_QUEUE_PER_CLIENT, app_cli.MAX_QUEUE_PER_ADDRESS) == (
        QUEUE_SIZE,
        CLIENT_SHARE,
        ADDRESS_SHARE,
    )
    assert app_cli.proxies() == ()  # no proxy trusted: X-Forwarded-For is ignored
    assert load_app_module(monkeypatch, MEDUSA_TRUSTED_PROXIES="10.0.0.1, 172.16.0.0/12").proxies() == (
        "10.0.0.1",
        "172.16.0.0/12",
    )
    with pytest.raises(SystemExit) as e:
        load_app_module(monkeypatch, MEDUSA_TRUSTED_PROXIES="10.0.0.1,*").proxies()
    assert str(e.value) == (
        "error: MEDUSA_TRUSTED_PROXIES lists '*', which is not an IP address or network (such as 10.0.0.1 or "
        "10.0.0.0/8); list the addresses of the proxies in front of this server, comma-separated, or unset it."
    )
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
