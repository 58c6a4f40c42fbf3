"""Plotly figures: tokens against time, the typical-acceptance threshold, the candidate tree and
the tree attention mask. Data comes from medusa_lib.present; this file only draws.

Plotly reads a few HTML tags inside text (<b>, <br>), so every token label is html-escaped.
"""

from __future__ import annotations

import html
import textwrap
from typing import Mapping

import plotly.graph_objects as go

from medusa_lib.present import LABELS, RunRecord, threshold_curve
from medusa_lib.present.inspector import ACCEPTED, NODE_KINDS, NodeStyle

from .render import METHOD_COLORS

FONT = dict(family="Inter, Segoe UI, Helvetica, Arial, sans-serif", size=15)


def _layout(fig: go.Figure, *, title: str, height: int, **kw) -> go.Figure:
    kw.setdefault("margin", dict(l=10, r=10, t=48, b=10))
    fig.update_layout(
        title=dict(text=title, x=0.01, font=dict(size=17)), height=height, font=FONT, template="plotly_white", **kw
    )
    return fig


def empty_figure(message: str, *, height: int = 300, title: str = "", width_chars: int = 40) -> go.Figure:
    """A blank plot that says why it is blank; the message is wrapped (plotly does not wrap annotations)."""
    fig = go.Figure()
    text = "<br>".join(html.escape(line) for line in textwrap.wrap(message, width_chars))
    fig.add_annotation(
        text=text, showarrow=False, font=dict(size=16, color="#777"), x=0.5, y=0.5, xref="paper", yref="paper"
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title=title, height=height)


def timeline_figure(
    records: Mapping[str, RunRecord], *, upto: float | None = None, x_max: float | None = None
) -> go.Figure:
    """Tokens generated against time for each method (prefill included, device-synchronised step
    times). ``upto`` cuts every run at that time (race replay) and draws the clock."""
    fig = go.Figure()
    for method, rec in records.items():
        xs, ys, n = [0.0], [0], 0
        for v in rec.views:
            if upto is not None and v.elapsed > upto:
                break
            n += len(v.step.tokens)
            xs.append(v.elapsed)
            ys.append(n)
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line=dict(color=METHOD_COLORS[method], width=3, shape="hv"),
                name=LABELS[method],
            )
        )
    if upto is not None:
        fig.add_vline(x=upto, line=dict(color="#999", dash="dot"))
    fig.update_xaxes(
        title_text="seconds since the run started", range=[0, x_max] if x_max else None, rangemode="tozero"
    )
    fig.update_yaxes(title_text="tokens generated", rangemode="tozero")
    return _layout(fig, title="Tokens against time", height=360, legend=dict(orientation="h", y=-0.25, x=0))


def threshold_figure(*, epsilon: float, delta: float, vocab_size: int) -> go.Figure:
    """Typical acceptance: a candidate x passes iff p(x) > min(epsilon, delta * exp(-H))."""
    h, thr = threshold_curve(epsilon=epsilon, delta=delta, vocab_size=vocab_size)
    fig = go.Figure(
        go.Scatter(
            x=h, y=thr, mode="lines", line=dict(color=METHOD_COLORS["medusa-typical"], width=3), name="threshold"
        )
    )
    fig.update_xaxes(title_text="entropy H (nats)")
    fig.update_yaxes(title_text="accept if p(x) >", rangemode="tozero")
    return _layout(
        fig,
        title="min(\u03b5, \u03b4\u00b7e<sup>\u2212H</sup>)",
        height=230,
        showlegend=False,
        margin=dict(l=10, r=10, t=40, b=10),
    )


def tree_figure(nodes: list[dict], *, title: str) -> go.Figure:
    """The candidate tree laid out by depth (left to right); accepted path in green, rejected nodes dimmed."""
    if not nodes:
        return empty_figure("No tree in this step.", title=title)
    by_id = {n["node"]: n for n in nodes}
    fig = go.Figure()
    # accepted edges drawn last, on top
    for accepted in (False, True):
        xs, ys = [], []
        for n in nodes:
            p = by_id.get(n["parent"])
            if p is not None and (n["accepted"] and p["accepted"]) == accepted:
                xs += [p["depth"], n["depth"], None]
                ys += [-p["y"], -n["y"], None]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                hoverinfo="skip",
                showlegend=False,
                line=dict(color=ACCEPTED if accepted else "#D0D0D0", width=4 if accepted else 1.5),
            )
        )
    # each kind's nodes, drawn in its records' styles (medusa_lib.present.inspector.NODE_KINDS), in the legend's order
    by_kind: dict[str, list[dict]] = {}
    for n in nodes:
        by_kind.setdefault(n["kind"], []).append(n)
    for kind in NODE_KINDS.values():
        for style, accepted in kind.styles:
            sel = [n for n in by_kind.get(kind.name, ()) if accepted is None or n["accepted"] == accepted]
            if sel:
                _add_nodes(fig, sel, style)
    depth = int(max(n["depth"] for n in nodes if NODE_KINDS[n["kind"]].in_column))
    x_max = max(n["depth"] for n in nodes)
    leaves = max(n["y"] for n in nodes) + 1
    # The lookup branch and the drafts of a drafter without heads are no head's.
    no_heads = any(not NODE_KINDS[n["kind"]].head_depth or n.get("level", "head") != "head" for n in nodes)
    level = "depth" if no_heads else "head"
    fig.update_xaxes(
        tickvals=list(range(depth + 1)),
        ticktext=["root"] + [f"{level} {k}" for k in range(1, depth + 1)],
        range=[-0.3, x_max + 0.9],
        showgrid=False,
        zeroline=False,
        side="top",
    )
    fig.update_yaxes(visible=False, range=[-leaves + 0.4, 0.6])
    return _layout(
        fig,
        title=title,
        height=int(min(900, max(340, 28 * leaves + 120))),
        legend=dict(orientation="h", y=-0.02, x=0, yanchor="top"),
    )


def _add_nodes(fig: go.Figure, nodes: list[dict], style: NodeStyle) -> None:
    """One legend entry: ``nodes`` (of one kind and state) as markers in ``style``, each labelled with its token."""
    fig.add_trace(
        go.Scatter(
            x=[n["depth"] for n in nodes],
            y=[-n["y"] for n in nodes],
            mode="markers+text",
            name=style.legend,
            opacity=style.opacity,
            marker=dict(color=style.color, size=style.size, symbol=style.symbol, line=dict(color=style.color, width=2)),
            text=[html.escape(n["label"]) for n in nodes],
            textposition="middle right",
            textfont=dict(size=16 if style.opacity == 1.0 else 14, color="#111" if style.opacity == 1.0 else "#8A8A8A"),
            hovertext=[_hover(n) for n in nodes],
            hoverinfo="text",
        )
    )


def _hover(n: dict) -> str:
    kind = NODE_KINDS[n["kind"]]
    token = f"{html.escape(n['label'])} (id {n['token_id']})<br>" if kind.token else ""
    return f"node {n['node']}: {token}{kind.where(n)}"


def mask_figure(z: list[list[int]], cols: list[str], rows: list[str], *, title: str) -> go.Figure:
    """The tree attention mask: row i = query node, column j = key; the prefix is one visible block."""
    if not z:
        return empty_figure("No tree in this step.", title=title)
    L = len(rows)
    colorscale = [
        [0, "#F4F4F4"],
        [0.33, "#F4F4F4"],
        [0.34, "#8FB8DE"],
        [0.66, "#8FB8DE"],
        [0.67, ACCEPTED],
        [1, ACCEPTED],
    ]
    hover = [
        [
            f"{html.escape(r)} sees {html.escape(c)}" if v else f"{html.escape(r)} cannot see {html.escape(c)}"
            for c, v in zip(cols, row)
        ]
        for r, row in zip(rows, z)
    ]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[html.escape(c) for c in cols],
            y=[html.escape(r) for r in rows],
            zmin=0,
            zmax=2,
            colorscale=colorscale,
            showscale=False,
            xgap=1,
            ygap=1,
            hovertext=hover,
            hoverinfo="text",
        )
    )
    tick = 13 if L <= 20 else 10 if L <= 40 else 8
    fig.update_xaxes(side="bottom", tickangle=-60, tickfont=dict(size=tick), type="category")
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=tick), type="category")
    return _layout(fig, title=title, height=int(min(820, max(380, 18 * L + 220))), margin=dict(l=10, r=10, t=48, b=10))
