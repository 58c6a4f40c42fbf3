"""Identical requests computed once: joined while running, answered from records once finished, never mixed.

A class clicks the same examples: the second identical request must not run the model again, must say that it
shares a run (and how old its timings are), and must get exactly the records of the run it shares. One watcher's
Stop or departure never ends the run for another; the last one leaving does. A request that a shared run answers
takes no place in the device's queue."""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch
from conftest import PROMPT, api_args, column_text, free_port, status_text, tiny_playground
from test_concurrency import count_runs, wait_for
from test_queue import call, post

from medusa_lib.present import RunStopped, Settings
from medusa_lib.present.shared import ALL_LEFT, GIVES_WAY, SharedRuns, age, deep_bytes
from ui.handlers import RUN_OUTPUTS, Handlers
from ui.live import DeviceTurn
from ui.sharing import Sharing

# the page's inputs (PAGE_INPUTS) of a greedy float32 run of the Medusa heads
PAGE = [PROMPT, 24, 0.7, 0.09, 0.3, "chain-2", "", True, True, 0, "float32", "Medusa greedy / exact sampling"]
STATUS, SESSION = RUN_OUTPUTS.index("status"), RUN_OUTPUTS.index("session")
COLUMNS = [RUN_OUTPUTS.index(n) for n in ("col_plain", "col_greedy", "col_typical")]


@pytest.fixture
def pg():
    return tiny_playground()


def tokens(out: dict) -> dict:
    return {m: r["token_ids"] for m, r in out["methods"].items()}


def timings(out: dict) -> dict:
    return {m: (r["decode_seconds"], r["tokens_per_second"]) for m, r in out["methods"].items()}


# ---------------------------------------------------------------- the registry
def test_a_finished_run_answers_an_identical_request_and_no_other(pg, monkeypatch):
    h = Handlers(pg)
    stats = count_runs(monkeypatch, pg)
    first = h.compare(PROMPT, max_new_tokens=16)
    again = h.compare(PROMPT, max_new_tokens=16)
    assert stats["closed"] == 1  # the second call ran nothing
    assert first["shared"] is None and again["shared"]["how"] == "recorded"
    assert again["shared"]["note"] == (
        "Computed less than a second ago on this server for an identical request; "
        "the timings are that run's measurements."
    )
    assert tokens(again) == tokens(first) and timings(again) == timings(first)  # that run's own measurements
    # any other setting is another request: a seed, the numerics' name spelled out, the tree
    h.compare(PROMPT, max_new_tokens=16, seed=1)
    h.compare(PROMPT, max_new_tokens=15)
    h.compare(PROMPT, max_new_tokens=16, tree="chain-3")
    assert stats["closed"] == 4
    # the page's Run of the same request shares it too, and says so
    outs = list(h.run(PROMPT, 16, *PAGE[2:5], "", "", True, None, 0, None, PAGE[11], "greedy", ""))
    assert stats["closed"] == 4
    status = status_text(outs[-1][STATUS])
    assert re.match(
        r"Done\. \*\*Computed (less than a second|\d+ s) ago on this server for an identical request; ", status
    )
    assert "Tick **Run live** to measure it again." in status
    records = outs[-1][SESSION]
    assert {m: r.tokens for m, r in records.items()} == tokens(first)
    assert [column_text(outs[-1][i]) for i in COLUMNS] == [r["text"] for r in first["methods"].values()]
    # the run only an API call watched got its last frame from the first page it answered; the next reuse it
    run = h.sharing.runs.recorded()[-1]  # the most recently used
    assert run.settings.max_new_tokens == 16 and run.settings.tree != "chain-3"
    final = run.final
    assert final is not None
    list(h.run(PROMPT, 16, *PAGE[2:5], "", "", True, None, 0, None, PAGE[11], "greedy", ""))
    assert run.final is final


def test_run_live_measures_again_and_its_result_answers_the_next_request(pg, monkeypatch):
    h = Handlers(pg)
    stats = count_runs(monkeypatch, pg)
    first = h.compare(PROMPT, max_new_tokens=16)
    live = h.compare(PROMPT, max_new_tokens=16, run_live=True)
    assert stats["closed"] == 2 and live["shared"] is None
    assert tokens(live) == tokens(first) and timings(live) != timings(first)  # measured afresh
    assert timings(h.compare(PROMPT, max_new_tokens=16)) == timings(live)  # the newest result answers
    outs = list(h.run(*PAGE, "greedy", "medusa", True))
    assert stats["closed"] == 3 and "Computed" not in status_text(outs[-1][STATUS])
    with pytest.raises(Exception, match=r"The Run live switch \(run_live\) must be true or false"):
        h.compare(PROMPT, max_new_tokens=16, run_live="yes")


def test_the_cache_keeps_at_most_n_results_and_m_megabytes_least_recently_used_out_first(pg):
    h = Handlers(pg, runs=SharedRuns(max_results=2, max_megabytes=1000))
    for n in (4, 5, 6):
        h.compare(PROMPT, max_new_tokens=n)
    assert sorted(r.settings.max_new_tokens for r in h.sharing.runs.recorded()) == [5, 6]
    h.compare(PROMPT, max_new_tokens=5)  # used: 6 is now the least recent
    h.compare(PROMPT, max_new_tokens=7)
    assert sorted(r.settings.max_new_tokens for r in h.sharing.runs.recorded()) == [5, 7]
    one = h.sharing.runs.recorded_bytes() / 2
    assert one > 1000  # records, steps, their tree tensors
    small = Handlers(pg, runs=SharedRuns(max_results=10, max_megabytes=1.5 * one / 2**20))
    small.compare(PROMPT, max_new_tokens=5)
    small.compare(PROMPT, max_new_tokens=6)
    assert [r.settings.max_new_tokens for r in small.sharing.runs.recorded()] == [6]
    assert 0 < small.sharing.runs.recorded_bytes() <= 1.5 * one
    assert not Handlers(pg, runs=SharedRuns(max_results=0)).sharing.runs.recorded()


def test_deep_bytes_counts_each_object_and_tensor_storage_once():
    t = torch.zeros(1000, dtype=torch.float32)
    one = deep_bytes([t])
    assert 4000 < one < 5000 and deep_bytes([t, t, t[:10]]) < one + 400
    assert [age(s) for s in (0.2, 12.4, 150, 7200)] == ["less than a second", "12 s", "2 min", "2 h"]


# ---------------------------------------------------------------- joining a running run
def test_a_late_request_joins_the_running_run_and_gets_the_same_records(pg, monkeypatch):
    h = Handlers(pg)
    stats = count_runs(monkeypatch, pg, step_seconds=0.02)
    answers = {}
    first = threading.Thread(target=lambda: answers.setdefault("first", h.compare(PROMPT, max_new_tokens=24)))
    first.start()
    assert wait_for(lambda: stats["steps"] >= 3, 30) < 30
    late = h.compare(PROMPT, max_new_tokens=24)
    first.join(30)
    assert stats["closed"] == 1 and stats["peak"] == 1
    assert late["shared"]["how"] == "joined" and late["shared"]["note"].startswith(
        "Joined a run that an identical request started "
    )
    assert tokens(late) == tokens(answers["first"]) and timings(late) == timings(answers["first"])


def test_one_watcher_leaving_never_ends_the_run_for_another_and_the_last_one_does(pg, monkeypatch):
    """Two page sessions watch one run: the first one's Stop (gradio closes its generator) leaves the second
    watching to the end; a run whose only watcher leaves stops within a step."""
    h = Handlers(pg)
    stats = count_runs(monkeypatch, pg, step_seconds=0.01)
    a = h.run(*PAGE, "greedy", "medusa", False)
    for out in a:
        if "Running" in str(out[STATUS]):
            break
    b = list_in_thread(h.run(*PAGE, "greedy", "medusa", False))
    # b watches the run once its second frame is out (its first, "Checking the settings", comes before it joins)
    assert wait_for(lambda: len(b["frames"]) >= 2, 30) < 30
    a.close()  # Stop in session a
    b["thread"].join(60)
    assert stats["closed"] == 1
    final = b["frames"][-1]
    assert status_text(final[STATUS]).startswith("Done.") and all('data-state="done"' in final[i] for i in COLUMNS)
    # alone, leaving ends it
    c = h.run(*PAGE[:1], 200, *PAGE[2:], "greedy", "medusa", True)
    for out in c:
        if "Running" in str(out[STATUS]):
            break
    steps = stats["steps"]
    c.close()
    assert wait_for(lambda: stats["closed"] == 2, 10) < 10
    assert stats["steps"] - steps < 60  # the one 200-token run stopped early, not at its end
    assert h.sharing.runs.recorded()[-1].settings.max_new_tokens == 24  # a stopped run is not recorded


def list_in_thread(frames) -> dict:
    got = {"frames": []}
    got["thread"] = threading.Thread(target=lambda: got["frames"].extend(frames))
    got["thread"].start()
    return got


def test_a_run_with_no_watcher_left_stops_and_a_background_one_gives_way(pg):
    runs = SharedRuns()
    run, how = runs.take("k", PROMPT, Settings(max_new_tokens=8))
    assert how == "new" and run.watchers == 1
    run.leave()
    run.produce(pg, on_end=runs.ended)
    assert isinstance(run.error, RunStopped) and str(run.error) == ALL_LEFT and not runs.recorded()
    waiting = [0]
    bg, _ = runs.take("b", PROMPT, Settings(max_new_tokens=8), background=True)
    check = bg.stop_check(device_waiting=lambda: waiting[0])
    assert check() is None  # nobody watches, nobody waits: it goes on
    waiting[0] = 1
    assert check() == GIVES_WAY
    bg.watch()  # a user joined it: now it is their run
    assert check() is None


# ---------------------------------------------------------------- the queue's door
@pytest.fixture
def served_tight():
    """A live server whose queue holds one waiting run."""
    from gradio_client import Client

    from ui import build_demo, serve

    pg = tiny_playground()
    demo = build_demo(pg, max_new_tokens=16)
    port = free_port()
    serve(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, queue_size=1)
    url = f"http://127.0.0.1:{port}/"
    try:
        yield pg, url, Client(url, verbose=False)
    finally:
        demo.close()


def test_requests_a_shared_run_answers_take_no_place_in_the_queue(served_tight, monkeypatch):
    from gradio_client import Client

    pg, url, client = served_tight
    stats = count_runs(monkeypatch, pg, step_seconds=0.05)
    running = client.submit(PROMPT, 12, api_name="/compare")
    assert wait_for(lambda: stats["steps"] >= 1, 30) < 30
    assert call(url, {"data": api_args("w11 w12", {"max_new_tokens": 4})}, session="other")[0] == 200  # the place
    status, answer = call(url, {"data": api_args("w13 w14", {"max_new_tokens": 4})}, session="third")
    assert status == 503 and answer["detail"].startswith("The server is busy: 1 runs are already waiting")
    # identical to the running run: joined, with no place
    joined = [Client(url, verbose=False).submit(PROMPT, 12, api_name="/compare") for _ in range(5)]
    outs = [j.result(60) for j in joined]
    first = running.result(60)
    assert all(o["shared"]["how"] == "joined" and tokens(o) == tokens(first) for o in outs)
    assert wait_for(lambda: stats["closed"] == 2, 30) < 30  # the running run and the queued one: nothing else ran
    # identical to a recorded run: answered at once, while the queue is full again
    hold = client.submit("w21 w22", 200, api_name="/compare")
    assert wait_for(lambda: stats["steps"] >= 40, 30) < 30
    assert call(url, {"data": api_args("w15 w16", {"max_new_tokens": 4})}, session="fourth")[0] == 200
    t0 = time.perf_counter()
    recorded = client.predict(PROMPT, 12, api_name="/compare")
    assert time.perf_counter() - t0 < 5 and recorded["shared"]["how"] == "recorded"
    assert tokens(recorded) == tokens(first)
    hold.cancel()


def test_a_raw_page_run_that_a_recorded_run_answers_streams_its_records(served_tight):
    pg, url, client = served_tight
    first = client.predict(PROMPT, 12, api_name="/compare")
    # the page's starting values: what /compare's defaults are
    page = [PROMPT, 12, *PAGE[2:5], pg.defaults.tree, "", True, pg.defaults.lookup_on, 0, "float32", PAGE[11]]
    page += ["greedy", pg.drafters.default, False]
    status, answer = post(url, "gradio_api/call/run", {"data": page})
    assert status == 200
    import urllib.request

    with urllib.request.urlopen(f"{url}gradio_api/call/run/{answer['event_id']}", timeout=60) as resp:
        events = resp.read().decode()
    assert "Computed" in events and "identical request" in events
    assert all(r["text"].split()[0] in events for r in first["methods"].values() if r["text"].split())


# ---------------------------------------------------------------- examples recorded in the background
def test_examples_are_recorded_in_the_background_and_give_way_to_a_user(pg, monkeypatch):
    stats = count_runs(monkeypatch, pg, step_seconds=0.01)
    device = DeviceTurn()
    sharing = Sharing(pg, device, max_run_seconds=60)
    monkeypatch.setattr("ui.sharing.IDLE_SECONDS", 0.05)
    start = pg.starting_request(24)
    examples = ["w10 w11 w12", "w20 w21 w22"]
    thread = sharing.record_in_background(examples, start)
    assert wait_for(lambda: stats["steps"] >= 2, 30) < 30
    # a user's run arrives while the first example records: the recording gives way within a step
    user = Handlers(pg, device=device, runs=sharing.runs)
    user.compare("w30 w31", max_new_tokens=24, numerics="float32")
    thread.join(120)
    recorded = {r.prompt: r for r in sharing.runs.recorded()}
    assert set(examples) <= set(recorded)
    assert stats["closed"] >= 4  # the stopped recording, the user's run, then the two examples
    # a page Run of an example at the page's starting values is answered from its record
    h = Handlers(pg, device=device, runs=sharing.runs)
    out = h.compare(examples[0], max_new_tokens=24)
    assert out["shared"]["how"] == "recorded"


def test_a_waiting_caller_s_estimate_comes_from_runs_that_ran_not_from_recorded_answers(monkeypatch):
    """gradio estimates a waiting call's time from its event's average duration; answers from records take
    milliseconds and must not pull it down."""
    from conftest import launch

    demo, url = launch(tiny_playground())
    try:
        from gradio_client import Client

        client = Client(url, verbose=False)
        h, queue = demo.handlers, demo._queue
        compare = next(f for f in demo.fns.values() if f.api_name == "compare")
        client.predict(PROMPT, 12, api_name="/compare")
        ran = h.sharing.runs.typical_seconds()
        assert ran > 0 and queue.process_time_per_fn[compare].avg_time == ran
        for _ in range(5):
            assert client.predict(PROMPT, 12, api_name="/compare")["shared"]["how"] == "recorded"
        assert queue.process_time_per_fn[compare].avg_time == ran
        page = [f for f in h.sharing.routes if f.fn == h.run_event]
        assert page and all(queue.process_time_per_fn[f].avg_time == ran for f in page)
    finally:
        demo.close()


def test_a_page_that_joins_a_run_only_an_api_call_watched_catches_up_in_one_frame(pg, monkeypatch):
    """A run only /compare callers watch renders no page frame (they read its records); a page joining it later
    gets every column so far in its first update, then the rest, and the same last frame as anyone."""
    h = Handlers(pg)
    stats = count_runs(monkeypatch, pg, step_seconds=0.01)
    api = {}
    first = threading.Thread(target=lambda: api.setdefault("out", h.compare(PROMPT, max_new_tokens=40)))
    first.start()
    assert wait_for(lambda: stats["steps"] >= 50, 30) < 30  # plain has ended, Medusa greedy is running
    run = h.sharing.runs._running[next(iter(h.sharing.runs._running))]
    assert run.frames == []  # nobody showed it
    outs = list(h.run(PROMPT, 40, *PAGE[2:5], "", "", True, None, 0, None, PAGE[11], "greedy", ""))
    first.join(30)
    assert stats["closed"] == 1
    caught_up = next(o for o in outs if isinstance(o[COLUMNS[0]], str))
    assert 'data-state="done"' in caught_up[COLUMNS[0]] and "Running **Medusa" in status_text(caught_up[STATUS])
    assert "joined a run that an identical request started" in status_text(caught_up[STATUS])
    assert [column_text(outs[-1][i]) for i in COLUMNS] == [r["text"] for r in api["out"]["methods"].values()]
