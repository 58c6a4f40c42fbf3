"""The page's handlers (ui/handlers.py): failures as one sentence, Stop, runs without decode steps, the replay's
queue."""

from __future__ import annotations

import html
import re
import threading
import time
from dataclasses import replace

import pytest
import torch
from conftest import (
    API_ORDER,
    PROMPT,
    assert_refused_on_the_api_and_the_page,
    column_text,
    launch,
    make_model,
    page_start,
    page_values,
    status_text,
    tiny_playground,
    tiny_tokenizer,
)

from medusa_lib.present import Piece, Playground, Settings, untrained_heads


def test_api_offers_no_model_or_heads_choice(served):
    _, _, client = served
    api = client.view_api(print_info=False, return_format="dict")
    assert list(api["named_endpoints"]) == ["/compare"] and not api["unnamed_endpoints"]
    params = [p["parameter_name"] for p in api["named_endpoints"]["/compare"]["parameters"]]
    assert params == ["prompt", *API_ORDER, "run_live"]
    components = {c["id"]: c for c in client.config["components"]}
    for dep in client.config["dependencies"]:  # every event of the page, documented or not
        for i in dep["inputs"]:
            label = str(components[i].get("props", {}).get("label") or "").lower()
            assert not re.search(r"\b(model|heads|checkpoint|folder|file|url)\b", label), label


def script_playground() -> Playground:
    """A tiny Llama whose lm_head bias makes it write the token '<script>' every time."""
    model = make_model("llama")
    model.generation_config.eos_token_id = model.config.eos_token_id = None
    tok = tiny_tokenizer()
    old = model.lm_head
    model.lm_head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        model.lm_head.weight.copy_(old.weight)
        model.lm_head.bias.zero_()
        model.lm_head.bias[tok.convert_tokens_to_ids("<script>")] = 100.0
    return Playground(model, tok, untrained_heads(model))


def test_generated_html_shows_as_text_on_the_page_and_in_the_api():
    from gradio_client import Client

    demo, url = launch(script_playground())
    try:
        client = Client(url, verbose=False)
        out = client.predict(PROMPT, 4, api_name="/compare")
        assert (
            out["methods"]["plain"]["text"].split() == ["<script>"] * 4
        )  # the API returns the text itself (JSON), the caller decides how to show it
        job = client.submit(*page_values(max_new_tokens=4), api_name="/run")
        cols = [u[1] for u in job if isinstance(u[1], str) and 'data-state="done"' in u[1]]
    finally:
        demo.close()
    assert cols and "<script>" not in cols[-1] and cols[-1].count("&lt;script&gt;") == 4
    assert column_text(cols[-1]).split() == ["<script>"] * 4


def test_an_unexpected_error_is_one_sentence_on_the_page_and_in_the_api(served, monkeypatch):
    """A bug (not a bad input) still ends as one sentence; its traceback goes to the log only."""
    from ui.handlers import UNEXPECTED

    pg, _, client = served
    message = UNEXPECTED.format(name="KeyError")

    def broken(*a, **k):
        raise KeyError("a bug")

    with monkeypatch.context() as m:
        m.setattr(pg, "prepare", broken)
        assert_refused_on_the_api_and_the_page(pg, client, PROMPT, message)
    assert client.predict(PROMPT, 2, api_name="/compare")["methods"]["plain"]["tokens"] == 2  # still serving


def test_a_refused_run_s_status_shows_markdown_in_a_quoted_value_as_typed():
    """The status line is Markdown: a preset name quoted back shows its marks (emphasis, code, a link,
    a tag) as typed, never as formatting (issue #35); the pop-up renders HTML, so it gets HTML escaping only."""
    from markdown_it import MarkdownIt

    from ui.handlers import RUN_OUTPUTS, Handlers

    name = "*bold* _it_ `code` [a](http://x) <b>"
    pg = tiny_playground(oracle=False)
    message = f"Unknown tree preset {name!r}; choose one of: {', '.join(pg.tree_names())}."
    with pytest.warns(UserWarning) as warned:
        outs = list(
            Handlers(pg).run(PROMPT, 4, 0.7, 0.09, 0.3, name, "", True, True, 0, None, "Medusa greedy / exact sampling")
        )
    status = outs[-1][RUN_OUTPUTS.index("status")]
    assert status.startswith(
        r"**Cannot run:** Unknown tree preset '\*bold\* \_it\_ \`code\` \[a\](http://x) &lt;b&gt;'"
    )
    assert status_text(status) == f"**Cannot run:** {message}"
    shown = MarkdownIt("commonmark").enable("strikethrough").render(status)  # what the page's Markdown makes of it
    assert shown.count("<strong>") == 1 and not any(t in shown for t in ("<em>", "<code>", "<a ", "<b>")), shown
    assert html.unescape(re.sub(r"<[^>]+>", "", shown)).strip() == f"Cannot run: {message}"
    assert str(warned[-1].message) == html.escape(message, quote=False)  # the pop-up: HTML escaped, no backslashes


def test_a_run_that_fails_midway_marks_its_column_stopped_and_keeps_its_tokens(monkeypatch):
    from ui.handlers import RUN_OUTPUTS, UNEXPECTED, Handlers

    pg = tiny_playground(oracle=False)
    orig = Playground.run_method

    def failing(self, view, decoder, ids, **kw):
        for i, ev in enumerate(orig(self, view, decoder, ids, **kw)):
            if view == "medusa-greedy" and i == 4:  # the page's default mode: the greedy comparison
                raise RuntimeError("boom")
            yield ev

    monkeypatch.setattr(Playground, "run_method", failing)
    monkeypatch.setattr("ui.handlers.STREAM_EVERY", 0.0)  # every step reaches the page
    with pytest.warns(UserWarning):
        outs = list(Handlers(pg).run(*page_start(max_new_tokens=8, numerics=None)))
    last = outs[-1]
    assert status_text(last[RUN_OUTPUTS.index("status")]) == f"**Cannot run:** {UNEXPECTED.format(name='RuntimeError')}"
    greedy = last[RUN_OUTPUTS.index("col_greedy")]
    assert 'data-state="stopped"' in greedy and column_text(greedy)  # its tokens so far stay, it no longer says running
    assert (
        'data-state="done"'
        in [o for o in outs if isinstance(o[RUN_OUTPUTS.index("col_plain")], str)][-1][RUN_OUTPUTS.index("col_plain")]
    )


def test_stop_turns_running_and_replaying_columns_into_stopped(served):
    from ui.handlers import Handlers
    from ui.render import column_html

    pg, _, _ = served
    rec = next(
        e.record
        for e in pg.stream(PROMPT, Settings(max_new_tokens=6, tree="chain-2"))
        if e.kind == "step" and len(e.record.views) > 2
    )
    running, replay, done = (column_html("plain", rec, state=s) for s in ("running", "replay", "done"))
    waiting = column_html("medusa-typical", None)
    status, *cols = Handlers(pg).stop(running, replay, done)
    assert status.startswith("Stopped")
    for col, before in zip(cols, (running, replay)):
        assert 'data-state="stopped"' in col and "running" not in col and "cursor" not in col
        stats = lambda c: re.search(r'<div class="method-stats">(.*?)</div>', c).group(1)  # noqa: E731
        assert column_text(col) == column_text(before) and stats(col) == stats(before)  # tokens and statistics stay
    assert cols[2] == done
    assert Handlers(pg).stop(waiting, None, "")[1:] == (waiting, None, "")  # nothing running: nothing changes
    trick = column_html(
        "plain",
        None,
        state="done",
        pieces=[Piece(5, '" data-state="running"><span class="method-state">running&hellip;</span>', "base", 1)],
    )
    assert (
        Handlers(pg).stop(trick, "", "")[1] == trick
    )  # generated text is escaped: only the column's own state marker is read


def test_stop_waits_for_the_cancelled_run_and_shows_the_columns_it_last_sent(monkeypatch):
    """Stop's update and the cancelled run's last frames travel separately: Stop must not answer before
    the run has ended, and must show the run's last columns (not the older ones the click carried)."""
    from types import SimpleNamespace

    from test_concurrency import count_runs

    from ui.handlers import RUN_OUTPUTS, Handlers
    from ui.render import stopped_column

    monkeypatch.setattr("ui.handlers.STREAM_EVERY", 0.0)  # every step is a frame
    pg = tiny_playground(oracle=False)
    h = Handlers(pg)
    count_runs(monkeypatch, pg, step_seconds=0.01)  # the run decodes on the device while the page renders
    me, other = SimpleNamespace(session_hash="me"), SimpleNamespace(session_hash="other")
    theirs = list(h.run(*page_start(max_new_tokens=3, numerics=None), request=other))  # another user's finished run
    gen = h.run(*page_start(max_new_tokens=200, numerics=None), request=me)
    plain = RUN_OUTPUTS.index("col_plain")
    frames = [next(gen) for _ in range(6)]
    at_click = [
        [f[RUN_OUTPUTS.index(c)] for f in frames if isinstance(f[RUN_OUTPUTS.index(c)], str)][-1]
        for c in ("col_plain", "col_greedy", "col_typical")
    ]  # what the page holds
    answer = {}
    stopper = threading.Thread(target=lambda: answer.update(out=h.stop(*at_click, request=me)))
    stopper.start()
    time.sleep(0.3)
    assert stopper.is_alive()  # waiting for the run to end
    last = next(gen)  # a frame the run sends after the click
    assert last[plain] != at_click[0]
    gen.close()  # what gradio's cancel does
    stopper.join(5)
    status, *cols = answer["out"]
    assert status.startswith("Stopped") and cols[0] == stopped_column(last[plain]) and 'data-state="stopped"' in cols[0]
    assert cols[1:] == at_click[1:]  # not started yet: still waiting
    their_page = [
        [f[RUN_OUTPUTS.index(c)] for f in theirs if isinstance(f[RUN_OUTPUTS.index(c)], str)][-1]
        for c in ("col_plain", "col_greedy", "col_typical")
    ]
    t0 = time.perf_counter()
    assert (
        list(h.stop(*their_page, request=other)[1:]) == their_page
    )  # nothing running there: done columns stay, at once
    assert time.perf_counter() - t0 < 1 and all('data-state="done"' in c for c in their_page)


def test_max_new_tokens_one_shows_dashes_and_says_why(served):
    from ui.handlers import RUN_OUTPUTS, Handlers

    pg, _, client = served
    out = client.predict(PROMPT, 1, api_name="/compare")
    for m in out["methods"].values():
        assert m["tokens"] == 1 and m["steps"] == 0 and m["tokens_per_second"] is None and m["tokens_per_step"] is None
    assert all(
        r["tokens/s"] is None and r["tokens/step"] is None and r["speedup"] is None for r in out["summary"]
    )  # JSON null
    outs = list(Handlers(pg).run(*page_start(max_new_tokens=1, numerics=None)))
    status = outs[-1][RUN_OUTPUTS.index("status")]
    assert status == (
        "Done. Medusa columns drafted by the Medusa heads. "  # prompt lookup is always offered beside them
        "Greedy mode: Medusa typical sampled at T = 0.7, seed 0; speedups are against plain greedy. "
        "Plain (greedy), Medusa greedy, Medusa typical made only the prefill's token (Max new tokens is 1), "
        "so there is no decode step to time: tokens/s, tokens/step and speedup show \u2014. "
        "Raise Max new tokens to 2 or more to measure them."
    )
    summary = outs[-1][RUN_OUTPUTS.index("summary")]
    assert summary["tokens/s"].tolist() == ["\u2014"] * 3
    tree = outs[-1][RUN_OUTPUTS.index("tree_plot")]
    shown = html.unescape(" ".join(a.text for a in tree.layout.annotations)).replace("<br>", " ")
    assert "ended after the prefill's first token (Max new tokens is 1)" in shown and "Run the playground" not in shown


def test_race_replay_takes_turns_with_runs_in_the_device_queue():
    """A replay renders frames while it plays: in the device's queue it never runs beside a timed run."""
    from ui import build_demo

    fns = {f.api_name: f for f in build_demo(tiny_playground(oracle=False)).fns.values()}
    # Run, the prompt's Enter (named after its handler), /compare and the replay
    names = ("run", "run_event", "compare", "replay")
    device = {name: (fns[name].concurrency_id, fns[name].concurrency_limit) for name in names}
    assert len(set(device.values())) == 1 and device["run"][1] == 1, device


def test_out_of_memory_on_cpu_or_gpu_gets_the_memory_sentence_and_a_bug_the_unexpected_one(caplog):
    from ui.handlers import OUT_OF_MEMORY, UNEXPECTED, cannot_run, no_step_message

    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 9663676416 bytes."
    )
    for e in (cpu, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), MemoryError()):
        assert cannot_run(e) == OUT_OF_MEMORY
    assert cannot_run(RuntimeError("shape mismatch")) == UNEXPECTED.format(name="RuntimeError")
    assert "shape mismatch" in caplog.text  # the bug's details go to the log
    pg = tiny_playground(oracle=False)
    rec = next(e.record for e in pg.stream(PROMPT, Settings(max_new_tokens=1, tree="chain-2")) if e.kind == "end")
    assert no_step_message(rec).endswith("no Medusa step to inspect. Raise Max new tokens and run again.")
    eos_rec = replace(rec, views=(replace(rec.views[0], step=replace(rec.views[0].step, finish_reason="eos")),))
    assert no_step_message(eos_rec).endswith(
        "(the model ended its answer at once): no Medusa step to inspect."
    )  # no advice that would not help


def test_the_mode_picks_the_sampled_or_the_greedy_comparison():
    """Sampling mode: plain sampling, Medusa exact sampling, typical, speed-ups against plain sampling,
    the cost panel and the exact-sampling badge; greedy mode (the default) at any T: plain greedy,
    Medusa greedy and typical sampling at T, speed-ups against plain greedy."""
    from ui.handlers import Handlers
    from ui.outputs import INSPECT_CHOICES, RUN_OUTPUTS

    h = Handlers(tiny_playground())
    at = {n: RUN_OUTPUTS.index(n) for n in RUN_OUTPUTS}
    frames = list(
        h.run(PROMPT, 16, 0.9, 0.09, 0.3, "topk-3x2x1", "", True, True, 7, None, INSPECT_CHOICES[0], "sampling")
    )
    sampled = list(frames[-1])
    for col in ("col_plain", "col_greedy"):  # the columns as the page holds them: the last frame that sent each
        sampled[at[col]] = [f[at[col]] for f in frames if isinstance(f[at[col]], str)][-1]
    assert list(sampled[at["session"]]) == ["plain-sample", "medusa-sample", "medusa-typical"]
    assert "Sampled at T = 0.9, seed 7; speedups are against plain sampling." in sampled[at["status"]]
    badge = sampled[at["badge"]]
    assert (
        'data-sampled="true"' in badge
        and "Medusa exact sampling = plain sampling, same seed (float32): all 16 tokens identical." in badge
    )
    assert 'data-method="plain-sample"' in sampled[at["col_plain"]] and "Plain (sampling)" in sampled[at["col_plain"]]
    assert (
        'data-method="medusa-sample"' in sampled[at["col_greedy"]]
        and "Medusa exact sampling" in sampled[at["col_greedy"]]
    )
    assert list(sampled[at["summary"]]["method"]) == ["Plain (sampling)", "Medusa exact sampling", "Medusa typical"]
    panel = sampled[at["sampling"]]
    assert (
        'data-rows="3"' in panel
        and "at T = 0.9" in panel
        and all(f"<td>{m}</td>" in panel for m in ("Plain (sampling)", "Medusa exact sampling", "Medusa typical"))
    )
    tree_title = sampled[at["tree_plot"]].layout.title.text
    assert tree_title.startswith("Medusa exact sampling, step")  # the inspector shows the run the middle column made
    other_seed = list(
        h.run(PROMPT, 16, 0.9, 0.09, 0.3, "topk-3x2x1", "", True, True, 8, None, INSPECT_CHOICES[0], "sampling")
    )[-1]
    assert (
        other_seed[at["session"]]["plain-sample"].tokens != sampled[at["session"]]["plain-sample"].tokens
    )  # the seed is used

    frames = list(
        h.run(PROMPT, 16, 0.9, 0.09, 0.3, "topk-3x2x1", "", True, True, 7, None, INSPECT_CHOICES[0])
    )  # the default mode, T = 0.9
    greedy = frames[-1]
    assert list(greedy[at["session"]]) == ["plain", "medusa-greedy", "medusa-typical"]
    assert (
        'data-sampled="false"' in greedy[at["badge"]]
        and "Medusa greedy = plain greedy (float32): all 16 tokens identical." in greedy[at["badge"]]
    )
    assert (
        'data-rows="0"' in greedy[at["sampling"]]
        and "Medusa typical sampled at T = 0.9, seed 7; speedups are against plain greedy." in greedy[at["status"]]
    )
    assert greedy[at["tree_plot"]].layout.title.text.startswith(
        "Medusa greedy, step"
    )  # the inspector starts on Medusa greedy's run
    typical = [f[at["col_typical"]] for f in frames if isinstance(f[at["col_typical"]], str)][-1]
    assert (
        "samples at T = 0.9 from seed 7" in html.unescape(typical)
        and "not plain greedy's text (not the same output)" in html.unescape(typical)
        and "speed-up against plain greedy" in html.unescape(typical)
    )
    assert 'class="speedup" data-speedup=' in typical  # its speed-up over plain greedy, in the column
    at_zero = list(h.run(PROMPT, 16, 0, 0.09, 0.3, "topk-3x2x1", "", True, True, 7, None, INSPECT_CHOICES[0]))[-1]
    assert "Sampled at" not in at_zero[at["status"]] and "sampled at" not in at_zero[at["status"]]


def test_gradio_hands_the_run_its_request_so_a_stop_or_a_closed_stream_finds_the_run():
    """gradio injects ``gr.Request`` only into a positional parameter annotated with it: a handler taking
    ``*values`` would get None, and Stop and the closed-stream check would lose the session's run. The page's
    event takes it first and hands it on with the inputs' values, in ``PAGE_INPUTS``' order."""
    from gradio.helpers import special_args

    from ui.handlers import PAGE_INPUTS, Handlers

    h, request = Handlers(tiny_playground(oracle=False)), object()
    inputs = [f"value-{name}" for name in PAGE_INPUTS]
    args, *_ = special_args(h.run_event, list(inputs), request)
    assert args[0] is request and args[1:] == inputs
    seen = []
    h.live.track = lambda request, names, frames: seen.append(request) or iter(())
    list(h.run_event(*args))
    assert seen == [request]
