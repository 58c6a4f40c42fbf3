"""The page's plotly figures (ui/figures.py) and the race replay's clock, on a real tiny run.

The figures are checked as data: which nodes are drawn in which trace and colour, which mask
cells are visible or on the accepted path, where the timeline's steps land.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import pytest
from conftest import PROMPT, tiny_playground

from medusa_lib.present import RunRecord, Settings, mask_data, threshold_curve, tree_nodes
from medusa_lib.present.inspector import ACCEPTED, NODE_KINDS, REJECTED
from ui.figures import empty_figure, mask_figure, threshold_figure, timeline_figure, tree_figure


@pytest.fixture(scope="module")
def run():
    pg = tiny_playground()  # heads rigged to foresee the model's greedy answer: long accepted paths
    records = {
        e.method: e.record
        for e in pg.stream(PROMPT, Settings(max_new_tokens=24, tree="topk-3x2x1", lookup=0))
        if e.kind == "end"
    }
    return pg, records


def best_view(record: RunRecord):
    return max(record.views[1:], key=lambda v: v.step.accept_length)


def test_tree_figure_draws_every_node_once_accepted_in_green_rejected_in_grey(run):
    pg, records = run
    view = best_view(records["medusa-greedy"])
    nodes = tree_nodes(view, pg.tokenizer)
    fig = tree_figure(nodes, title="t")
    markers = {t.name: t for t in fig.data if t.mode == "markers+text"}
    drawn = sum(len(t.x) for t in markers.values())
    assert drawn == len(nodes) == view.step.tree.num_nodes + 1  # every tree node plus the bonus token
    accepted = markers["accepted candidate"]
    assert accepted.marker.color == ACCEPTED and len(accepted.x) == view.step.accept_length >= 2
    assert markers["rejected candidate"].marker.color == REJECTED
    assert len(markers["rejected candidate"].x) == view.step.tree.num_nodes - 1 - view.step.accept_length
    assert list(accepted.x) == list(range(1, view.step.accept_length + 1))  # one accepted node per depth, in order
    labels = [html.unescape(t) for t in accepted.text]
    assert labels == [n["label"] for n in nodes if n["kind"] == "candidate" and n["accepted"]]
    edges = [t for t in fig.data if t.mode == "lines"]
    assert (
        edges[1].line.color == ACCEPTED and edges[1].x.count(None) == view.step.accept_length + 1
    )  # root->...->last, then ->bonus


def test_each_node_kind_is_drawn_in_its_record_s_style_and_ui_compares_no_kind():
    """The node kinds' styles, names and words live in one table (``inspector.NODE_KINDS``); the figure reads it."""
    # one node of each kind in each of its states (the root first, as a tree has it), all under the root
    kinds = [(kind.name, accepted is not False) for kind in NODE_KINDS.values() for _, accepted in kind.styles]
    kinds.sort(key=lambda k: k[0] != "root")
    nodes = [
        dict(
            node=j, depth=min(j, 1), y=0.0, parent=j - 1 if j else -1, token_id=7, label="w", rank=0, kind=k, accepted=a
        )
        for j, (k, a) in enumerate(kinds)
    ]
    fig = tree_figure(nodes, title="t")
    markers = [t for t in fig.data if t.mode == "markers+text"]
    styles = [style for kind in NODE_KINDS.values() for style, _ in kind.styles]
    assert [(t.name, t.marker.color, t.marker.symbol, t.opacity) for t in markers] == [
        (s.legend, s.color, s.symbol, s.opacity) for s in styles
    ]
    hover = {t.name: t.hovertext[0] for t in markers}
    assert hover["node (head k, rank r)"] == "node 3: head 1, rank 0"  # an edited tree's node carries no token
    assert hover["lookup branch, accepted"].endswith("<br>lookup branch (n-gram from the context), depth 1")
    assert list(fig.layout.xaxis.ticktext) == ["root", "depth 1"]  # the lookup branch is no head's
    for source in Path(__file__).resolve().parents[1].joinpath("ui").glob("*.py"):
        assert '["kind"] ==' not in source.read_text() and '["kind"] !=' not in source.read_text(), source


def test_mask_figure_cells_are_the_tree_mask_with_the_accepted_path_marked(run):
    pg, records = run
    view = best_view(records["medusa-greedy"])
    z, cols, rows = mask_data(view, pg.tokenizer)
    fig = mask_figure(z, cols, rows, title="m")
    heat = fig.data[0]
    mask, on_path = view.step.tree.attn_mask.tolist(), set(view.step.accepted_nodes)
    assert len(heat.z) == len(rows) == view.step.tree.num_nodes and cols[0] == f"prefix ({view.prefix_len} tokens)"
    for i, row in enumerate(heat.z):
        assert row[0] == 1  # every node sees the whole prefix
        for j, cell in enumerate(row[1:]):
            assert cell == (0 if not mask[i][j] else 2 if i in on_path and j in on_path else 1)
    assert (
        sum(c == 2 for row in heat.z for c in row) == len(on_path) * (len(on_path) + 1) // 2
    )  # a causal chain on the path


def test_timeline_steps_land_at_their_measured_times_and_the_replay_cuts_them(run):
    _, records = run
    fig = timeline_figure(records)
    for trace, (method, rec) in zip(fig.data, records.items()):
        assert trace.x[-1] == pytest.approx(rec.elapsed) and trace.y[-1] == len(rec.tokens)
    t = records["plain"].elapsed / 2
    cut = timeline_figure(records, upto=t)
    for trace in cut.data:
        assert max(trace.x) <= t + 1e-9
    assert any(s.x0 == t for s in cut.layout.shapes)  # the replay's clock line


def test_threshold_figure_is_min_of_epsilon_and_delta_times_exp_minus_h():
    fig = threshold_figure(epsilon=0.09, delta=0.3, vocab_size=320)
    h, thr = threshold_curve(epsilon=0.09, delta=0.3, vocab_size=320)
    assert list(fig.data[0].y) == list(thr) and thr[0] == pytest.approx(0.09) and thr[-1] == pytest.approx(0.3 / 320)
    assert h[-1] == pytest.approx(math.log(320))


def test_empty_figure_wraps_its_message_and_escapes_it():
    fig = empty_figure("<b>" + "word " * 30, title="x")
    text = fig.layout.annotations[0].text
    assert "&lt;b&gt;" in text and "<b>" not in text and text.count("<br>") >= 3


def test_the_replay_shows_each_step_when_its_recorded_time_comes(run, monkeypatch):
    """Handlers.replay on a fake clock: every frame shows exactly the steps finished by then, and it ends done."""
    import ui.handlers as handlers
    from ui.outputs import REPLAY_OUTPUTS
    from ui.replay import REPLAY_FPS

    pg, records = run
    clock = {"t": 0.0}
    monkeypatch.setattr(handlers.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(handlers.time, "sleep", lambda s: clock.update(t=clock["t"] + s))
    total = max(r.elapsed for r in records.values())
    factor = total * REPLAY_FPS / 40  # a speed at which the (few-millisecond) tiny run takes ~40 frames
    frames = list(handlers.Handlers(pg).replay(records, f"{factor!r}x"))
    assert len(frames) == pytest.approx(total / factor * REPLAY_FPS, abs=2) and len(frames) > 30
    cols = [REPLAY_OUTPUTS.index(c) for c in ("col_plain", "col_greedy", "col_typical")]
    partial = 0
    for k, frame in enumerate(frames[:-1]):
        t = factor * k / REPLAY_FPS
        for c, rec in zip(cols, records.values()):
            shown = frame[c].count('class="tok ')
            finished = [v for v in rec.views if v.elapsed <= t]
            assert shown == sum(len([p for p in v.pieces if p.text]) for v in finished)
            partial += 0 < len(finished) < len(rec.views)
    assert partial > 10  # many frames show a run part-way
    assert all('data-state="done"' in frames[-1][c] for c in cols) and "(done)" in frames[-1][0]


def test_the_page_quotes_the_heads_own_calibration_not_literals():
    import json

    from ui.text import explain

    cfg = json.loads(
        (Path(__file__).resolve().parents[1] / "assets/heads/smollm2-135m-instruct/config.json").read_text()
    )
    tree = cfg["calibration"]["trees"][cfg["default_tree"]]
    text = explain(cfg["calibration"], default_tree=cfg["default_tree"], lookup=cfg["lookup"])
    assert f"({cfg['default_tree']}, {tree['nodes']} nodes, with a lookup branch of {cfg['lookup']})" in text
    assert (
        f"made {tree['measured_tokens_per_step']:.1f} tokens a step" in text
        and f"{tree['speedup']:.2f}x plain decoding's speed" in text
    )
    assert f"calibrated (bfloat16, on {cfg['calibration']['device']})" in text
    # the lookup length the figures were measured with, whatever the page's is; no device recorded: said so
    older = {**cfg["calibration"], "device": None}
    text = explain(older, default_tree=cfg["default_tree"], lookup=None)
    assert (
        f"with a lookup branch of {cfg['calibration']['lookup']})" in text
        and "on the machine they were calibrated on" in text
    )
    bare = explain(None)
    assert "When these heads were calibrated" not in bare and "Why is Medusa not always faster here?" in bare
