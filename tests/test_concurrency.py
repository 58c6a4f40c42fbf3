"""Several users at once, Stop through the server, and memory over many runs: runs never share state."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch
from conftest import (
    LIMIT,
    PROMPT,
    column_text,
    page_start,
    page_values,
    serving,
    tiny_playground,
)

from medusa_lib.present import Playground, Settings


def count_runs(monkeypatch, pg: Playground, *, step_seconds: float = 0.0) -> dict:
    """Wrap pg.run (the page and /compare both run through it): how many runs overlap, steps decoded,
    and whether each run's generator was closed. ``step_seconds`` makes each step that much slower
    (the tiny model decodes 500 tokens in well under a second, faster than a cancel on a busy machine)."""
    orig, lock = Playground.run, threading.Lock()
    stats = {"active": 0, "peak": 0, "steps": 0, "closed": 0}

    def run(ids, decoders, **kw):
        with lock:
            stats["active"] += 1
            stats["peak"] = max(stats["peak"], stats["active"])
        try:
            for ev in orig(pg, ids, decoders, **kw):
                stats["steps"] += ev.kind == "step"
                time.sleep(step_seconds)
                yield ev
        finally:
            with lock:
                stats["active"] -= 1
                stats["closed"] += 1

    monkeypatch.setattr(pg, "run", run)
    return stats


@pytest.fixture(scope="module")
def served_static():
    """The server of ``served`` on the static engine: runs share one StaticKV, one at a time."""
    yield from serving(tiny_playground(static=True))


@pytest.mark.parametrize("engine", ["dynamic", "static"])
def test_four_sessions_at_once_each_get_their_own_tokens_and_queue(engine, request, monkeypatch):
    from gradio_client import Client
    from gradio_client.utils import Status

    pg, url, client = request.getfixturevalue("served" if engine == "dynamic" else "served_static")
    prompts = [f"w{10 + i} w{40 + i} w{70 + i}" for i in range(4)]
    alone = [client.predict(p, 24, api_name="/compare") for p in prompts]
    stats = count_runs(monkeypatch, pg)
    clients = [Client(url, verbose=False) for _ in prompts]
    jobs = [c.submit(p, 24, run_live=True, api_name="/compare") for c, p in zip(clients, prompts)]
    ranks = set()
    while not all(j.done() for j in jobs):
        for j in jobs:
            s = j.status()
            if s.code == Status.IN_QUEUE and s.rank is not None:
                ranks.add(s.rank)
        time.sleep(0.005)
    together = [j.result() for j in jobs]
    for a, b in zip(alone, together):
        for m in ("plain", "medusa-greedy", "medusa-typical"):
            assert b["methods"][m]["token_ids"] == a["methods"][m]["token_ids"]
    assert len({tuple(r["methods"]["plain"]["token_ids"]) for r in together}) == 4  # four prompts, four answers
    assert stats["peak"] == 1  # concurrency_limit=1: the runs took turns on the device
    assert ranks and max(ranks) >= 1, ranks  # a waiting job was told its place in the queue


def test_four_page_sessions_at_once_see_only_their_own_text(served):
    from gradio_client import Client

    _, url, client = served
    prompts = [f"w{100 + i} w{130 + i}" for i in range(4)]
    alone = [
        client.predict(p, 12, 0.7, 0.09, 0.3, "chain-2", "", True, True, False, 0, api_name="/compare")["methods"]
        for p in prompts
    ]  # the greedy mode, as the page's default
    jobs = [Client(url, verbose=False).submit(*page_values(prompt=p), api_name="/run") for p in prompts]
    for job, ref in zip(jobs, alone):
        updates = list(job)
        assert job.result()[0].startswith("Done")
        for k, m in enumerate(["plain", "medusa-greedy", "medusa-typical"], start=1):
            done = [u[k] for u in updates if isinstance(u[k], str) and 'data-state="done"' in u[k]]
            assert column_text(done[-1]) == ref[m]["text"]


def test_stop_through_the_server_ends_the_run_and_the_next_run_works(served, monkeypatch):
    pg, _, client = served
    dep = next(d for d in client.config["dependencies"] if d.get("api_name") == "run")
    stop = [d for d in client.config["dependencies"] if d.get("cancels")]
    assert stop and dep["id"] in stop[0]["cancels"]  # the Stop button cancels the Run event
    stats = count_runs(monkeypatch, pg, step_seconds=0.005)
    job = client.submit(*page_values(max_new_tokens=LIMIT), api_name="/run")
    for out in job:
        if "Running" in str(out[0]):
            break
    job.cancel()
    deadline = time.time() + 10
    while not stats["closed"] and time.time() < deadline:
        time.sleep(0.02)
    assert stats["closed"] == 1  # gradio closed the handler, which closed the decoders (their caches go with them)
    steps = stats["steps"]
    time.sleep(0.5)
    assert stats["steps"] == steps  # nothing decodes after Stop
    assert (
        steps < 500
    )  # stopped inside the first method: plain alone runs ~505 steps (2.5 s here) to the 512-token context
    assert client.predict(PROMPT, 4, api_name="/compare")["methods"]["plain"]["tokens"] == 4


def wait_for(cond, seconds: float) -> float:
    """Seconds until ``cond()`` held (polled every 20 ms), or inf after ``seconds``."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if cond():
            return time.perf_counter() - t0
        time.sleep(0.02)
    return float("inf")


def assert_stops_and_the_next_run_is_quick(pg, client, stats, *, within: float) -> None:
    """The run ended (its generator closed) within ``within`` s, decodes nothing more, and a short call runs at once."""
    took = wait_for(lambda: stats["closed"] == 1, within)
    assert took < within, f"the run went on decoding: {stats}"
    steps = stats["steps"]
    time.sleep(0.5)
    assert stats["steps"] == steps  # nothing decodes once it stopped
    assert steps < 500  # stopped inside the first method: plain alone runs ~505 steps to the 512-token context
    t0 = time.perf_counter()
    assert client.predict(PROMPT, 4, api_name="/compare")["methods"]["plain"]["tokens"] == 4
    assert time.perf_counter() - t0 < 10  # the next user does not wait for the abandoned run (it would take > 30 s)


def start_long_compare(url: str, *, open_stream: bool):
    """POST a long /compare over raw HTTP (as curl would); with ``open_stream``, also send the GET of its event
    stream on a socket of its own and return that socket (gradio sends nothing on it before an event)."""
    import json
    import socket
    import urllib.request

    from conftest import api_args

    body = json.dumps({"data": api_args(PROMPT, {"max_new_tokens": LIMIT}, live=True)}).encode()
    req = urllib.request.Request(
        f"{url}gradio_api/call/compare", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        event_id = json.load(resp)["event_id"]
    if not open_stream:
        return None
    host, port = url.split("//")[1].rstrip("/").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        f"GET /gradio_api/call/compare/{event_id} HTTP/1.1\r\nHost: {host}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    return sock


def test_a_cancelled_compare_stops_decoding_and_frees_the_device(served, monkeypatch):
    """gradio_client's job.cancel() on /compare (a plain function in a worker thread gradio cannot stop): the run
    sees the cancelled call between two steps and ends; the next user's run starts at once (issue #26)."""
    pg, url, client = served
    from gradio_client import Client

    stats = count_runs(monkeypatch, pg, step_seconds=0.02)  # plain alone: ~505 steps, over 10 s
    job = Client(url, verbose=False).submit(PROMPT, LIMIT, api_name="/compare")
    assert wait_for(lambda: stats["steps"] >= 5, 60) < 60
    assert job.cancel()
    assert_stops_and_the_next_run_is_quick(pg, client, stats, within=3)


def test_a_dropped_event_stream_stops_the_run(served, monkeypatch):
    """A raw HTTP client that opens its event stream, reads a little and closes it: its run ends (issue #26)."""
    pg, url, client = served
    stats = count_runs(monkeypatch, pg, step_seconds=0.02)
    sock = start_long_compare(url, open_stream=True)
    assert wait_for(lambda: stats["steps"] >= 5, 60) < 60
    sock.close()
    assert_stops_and_the_next_run_is_quick(pg, client, stats, within=5)


def test_a_call_that_never_opens_its_stream_ends_at_the_wall_time_bound(served, monkeypatch):
    """No signal reaches the server when such a client leaves: the bound (MEDUSA_MAX_RUN_SECONDS) ends the run."""
    import ui.handlers
    from medusa_lib.present import deadline

    pg, url, client = served
    monkeypatch.setattr(ui.handlers, "deadline", lambda seconds: deadline(2.0))
    stats = count_runs(monkeypatch, pg, step_seconds=0.02)
    start_long_compare(url, open_stream=False)
    assert wait_for(lambda: stats["steps"] >= 1, 60) < 60
    assert_stops_and_the_next_run_is_quick(pg, client, stats, within=6)


def test_the_bound_ends_an_api_run_with_one_sentence():
    from gradio import Error

    from ui.handlers import Handlers

    pg = tiny_playground(oracle=False)
    with pytest.raises(Error) as err:
        Handlers(pg, max_run_seconds=0).compare(PROMPT, 64, 0.7, 0.09, 0.3, "chain-2", "", True, True)
    assert str(err.value.message) == (
        "The run was stopped after 0 s, the most this server gives one call (MEDUSA_MAX_RUN_SECONDS); "
        "ask for fewer new tokens or send a shorter prompt."
    )


def test_closing_the_run_handler_stops_the_decoder_at_once(monkeypatch):
    from ui.handlers import Handlers

    pg = tiny_playground(oracle=False)
    stats = count_runs(monkeypatch, pg, step_seconds=0.01)  # 200 steps take 2 s: longer than the close needs
    gen = Handlers(pg).run(*page_start(max_new_tokens=200, numerics=None))
    for out in gen:
        if stats["steps"] >= 3:
            break
    gen.close()  # what gradio does on Stop: the run closes on the device's thread after the step it is in
    assert wait_for(lambda: stats["closed"] == 1, 10) < 2
    steps = stats["steps"]
    time.sleep(0.2)
    assert stats["active"] == 0 and stats["steps"] == steps < 200
    outs = list(Handlers(pg).run(*page_start(max_new_tokens=4, numerics=None)))
    assert outs[-1][0].startswith("Done")


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def test_fifty_runs_do_not_grow_resident_memory():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: steady on a shared CPU
    try:
        _fifty_runs()
    finally:
        torch.set_num_threads(threads)


def _fifty_runs():
    pg = tiny_playground(oracle=False)
    settings = Settings(max_new_tokens=16, tree="topk-3x2x1")
    for _ in range(5):  # warm-up: allocator pools, lazy imports, tokenizer caches
        pg.compare(PROMPT, settings)
    gc.collect()
    before = rss_mb()
    t0 = time.perf_counter()
    for i in range(50):
        pg.compare(f"w{10 + i} w{20 + i}", settings)
    gc.collect()
    after = rss_mb()
    print(
        f"\nRSS before {before:.1f} MB, after 50 runs {after:.1f} MB, growth {after - before:+.1f} MB "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    assert after - before < 30


def test_a_long_run_gives_memory_back_and_a_short_one_does_not(monkeypatch):
    import medusa_lib.present.memory as memory

    trims = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda pad: trims.append(pad))
    monkeypatch.setattr(memory, "LONG_RUN_TOKENS", 300)  # the tiny model's context is 512 tokens
    pg = tiny_playground(oracle=False)
    pg.compare(PROMPT, Settings(max_new_tokens=8, tree="chain-2"))  # 14 prompt tokens + 8: short
    assert trims == []
    pg.compare(" ".join(["w10"] * 250), Settings(max_new_tokens=64, tree="chain-2"))  # 252 + 64: long
    assert trims == [0]
    gen = pg.stream(PROMPT, Settings(max_new_tokens=300, tree="chain-2"))
    next(gen), next(gen)
    gen.close()  # Stop: the memory goes back too
    assert trims == [0, 0]
