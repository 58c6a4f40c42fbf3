"""The Tree lab's plotly figures: the cost, gain and speed-up curves and the per-head acceptance
(``lab.py`` wires them into the tab)."""

from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from medusa_lib.present.inspector import ACCEPTED
from medusa_lib.present.lab import Curves, TreeLab, TreePoint
from medusa_lib.present.lab_measure import Measured, run_acceptance

from .figures import _layout, empty_figure

# Okabe-Ito vermillion, black, bluish green
CURRENT, MEASURED, OPTIMUM = "#D55E00", "#000000", "#009E73"
HEADS_ONLY, WITH_LOOKUP = "#0072B2", "#CC79A7"


def _curve_layout(
    fig: go.Figure,
    *,
    title: str,
    x_title: str,
    y_title: str,
    this: tuple | None,
    measured: tuple | None,
    this_name: str,
) -> go.Figure:
    """The three curves' common end: this tree's point (a star) and the measured run's (a diamond)
    as (x, y) or None, the axes from zero, the legend under the plot."""
    if this is not None:
        _point(fig, *this, name=this_name, color=CURRENT, symbol="star")
    if measured is not None:
        _point(fig, *measured, name="measured run", color=MEASURED, symbol="diamond")
    fig.update_xaxes(title_text=x_title, rangemode="tozero")
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    return _layout(
        fig,
        title=title,
        height=430,
        legend=dict(orientation="h", y=-0.27, x=0, yanchor="top"),
        margin=dict(l=10, r=10, t=48, b=10),
    )


def _point(fig: go.Figure, x, y, *, name: str, color: str, symbol: str, text: str = "") -> None:
    if x is None or y is None:
        return
    fig.add_trace(
        go.Scatter(
            x=[x],
            y=[y],
            mode="markers+text" if text else "markers",
            name=name,
            text=[text] if text else None,
            textposition="top center",
            marker=dict(color=color, size=15, symbol=symbol, line=dict(color="#fff", width=1)),
        )
    )


def cost_figure(
    c: Curves, point: TreePoint | None = None, measured: Measured | None = None, *, note: str = ""
) -> go.Figure:
    """Step cost relative to a plain step against tokens verified per step."""
    title = "Cost: one verify step / one plain step"
    if c.cost is None and not c.elsewhere:
        return empty_figure(note or "No cost figures yet.", title=title, height=360)
    fig = go.Figure()
    # another kind of device's calibration, beside this one's
    for other in c.elsewhere:
        fig.add_trace(
            go.Scatter(
                x=list(other.sizes),
                y=list(other.fitted),
                mode="lines+markers",
                name=f"{html.escape(other.device)} (its calibration)",
                line=dict(color="#B07AA1", width=2, dash="dash"),
                marker=dict(size=6),
            )
        )
    # this device's points and their fit; without them, no tree point on this curve
    if c.cost is not None:
        fig.add_trace(
            go.Scatter(
                x=list(c.cost.sizes),
                y=list(c.cost.measured),
                mode="markers",
                name=f"{c.cost.source} ({html.escape(c.cost.device)})",
                marker=dict(color="#8A8A8A", size=7),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=list(c.cost.sizes),
                y=list(c.cost.fitted),
                mode="lines",
                name="non-decreasing fit" + (" (MKL sizes apart)" if c.cost.mkl_rows else ""),
                line=dict(color=HEADS_ONLY, width=3),
            )
        )
    else:
        point = measured = None
    return _curve_layout(
        fig,
        title=title,
        x_title="tokens verified per step (with lookup)",
        y_title="\u00d7 a plain step",
        this=point and (point.tokens, point.cost),
        measured=measured and (measured.tokens, measured.cost),
        this_name=f"this tree ({point.tokens} tokens)" if point else "",
    )


def gain_figure(
    c: Curves, point: TreePoint | None = None, measured: Measured | None = None, *, note: str = ""
) -> go.Figure:
    """Tokens per step of the greedy tree of each size: expected from the accuracies, simulated by the calibration."""
    title = "Gain: tokens per step"
    if c.gain is None:
        return empty_figure(note or "No accuracies, no gain curve.", title=title, height=360)
    g = c.gain
    fig = go.Figure(
        go.Scatter(
            x=list(g.sizes),
            y=list(g.expected),
            mode="lines",
            name="expected (greedy tree, heads only)",
            line=dict(color=HEADS_ONLY, width=3),
        )
    )
    if g.simulated:
        fig.add_trace(
            go.Scatter(
                x=list(g.simulated),
                y=list(g.simulated.values()),
                mode="markers",
                name="simulated, heads only",
                marker=dict(color=HEADS_ONLY, size=9, symbol="circle-open", line=dict(width=2)),
            )
        )
    if g.with_lookup:
        fig.add_trace(
            go.Scatter(
                x=list(g.with_lookup),
                y=list(g.with_lookup.values()),
                mode="markers",
                name=f"simulated, with lookup-{c.lookup}",
                marker=dict(color=WITH_LOOKUP, size=9, symbol="triangle-up"),
            )
        )
    if g.lookup_gain is not None:
        fig.add_trace(
            go.Scatter(
                x=list(g.sizes),
                y=[e + x for e, x in zip(g.expected, g.lookup_gain)],
                mode="lines",
                name=f"expected + lookup-{c.lookup}'s simulated gain",
                line=dict(color=WITH_LOOKUP, width=2, dash="dash"),
            )
        )
    return _curve_layout(
        fig,
        title=title,
        x_title="tree size (tokens with the root)",
        y_title="tokens per step",
        this=point and (point.size, point.gain),
        measured=measured and (measured.size, measured.tokens_per_step),
        this_name="this tree (expected)",
    )


def speedup_figure(
    c: Curves, point: TreePoint | None = None, measured: Measured | None = None, *, note: str = ""
) -> go.Figure:
    """Predicted speed-up = gain / cost of the greedy tree of each size; the optimum and this tree marked."""
    title = "Predicted speed-up = gain / cost"
    if c.speedup is None:
        return empty_figure(note or "The speed-up needs both curves.", title=title, height=360)
    fig = go.Figure(
        go.Scatter(
            x=list(c.sizes), y=list(c.speedup), mode="lines", name="heads only", line=dict(color=HEADS_ONLY, width=3)
        )
    )
    i = c.sizes.index(c.optimum)
    _point(
        fig,
        c.optimum,
        c.speedup[i],
        name=f"optimum, heads only: {c.optimum} tokens, {c.speedup[i]:.2f}\u00d7",
        color=OPTIMUM,
        symbol="circle",
    )
    if c.speedup_lookup is not None:
        fig.add_trace(
            go.Scatter(
                x=list(c.sizes),
                y=list(c.speedup_lookup),
                mode="lines",
                name=f"with lookup-{c.lookup}",
                line=dict(color=WITH_LOOKUP, width=2, dash="dash"),
            )
        )
        j = c.sizes.index(c.optimum_lookup)
        _point(
            fig,
            c.optimum_lookup,
            c.speedup_lookup[j],
            name=f"optimum with lookup: {c.optimum_lookup} tokens, {c.speedup_lookup[j]:.2f}\u00d7",
            color=OPTIMUM,
            symbol="triangle-up",
        )
    fig.add_hline(y=1.0, line=dict(color="#999", dash="dot"))
    return _curve_layout(
        fig,
        title=title,
        x_title="tree size (tokens with the root)",
        y_title="\u00d7 plain decoding",
        this=point and (point.size, point.speedup),
        measured=measured and (measured.size, measured.speedup),
        this_name="this tree (predicted)",
    )


def acceptance_figure(lab: TreeLab, record=None, *, title: str = "Per-head acceptance") -> go.Figure:
    """Left: in the run, how often head k's rank-r node was accepted when its parent was (accepted /
    reached); right: the calibrated accuracy acc[k][r]. Rows: heads; columns: ranks (and the lookup
    branch's node of that depth)."""
    acc = run_acceptance(record, depth=lab.num_heads) if record is not None else None
    if acc is None and lab.accuracy is None:
        return empty_figure(
            "Run the comparison or press Measure to see what each head got right.", title=title, height=300
        )
    ranks = max((r + 1 for row in (acc.reached if acc else ()) for r, n in enumerate(row) if n), default=0)
    ranks = max(ranks, min(5, len(lab.accuracy[0])) if lab.accuracy else 1)
    heads = [f"head {k + 1}" for k in range(lab.num_heads)]
    cols = [f"r{r}" for r in range(ranks)]
    scale = [[0, "#F4F4F4"], [1, ACCEPTED]]
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=[
            f"this run: accepted / reached ({acc.steps} steps)" if acc else "no run yet",
            "calibrated accuracy",
        ],
        horizontal_spacing=0.12,
    )
    if acc is not None:
        lookup = any(acc.lookup_reached)
        z = [
            [acc.rates()[k][r] for r in range(ranks)]
            + ([acc.lookup_accepted[k] / acc.lookup_reached[k] if acc.lookup_reached[k] else None] if lookup else [])
            for k in range(lab.num_heads)
        ]
        text = [
            [f"{acc.accepted[k][r]}/{acc.reached[k][r]}" if acc.reached[k][r] else "" for r in range(ranks)]
            + ([f"{acc.lookup_accepted[k]}/{acc.lookup_reached[k]}" if acc.lookup_reached[k] else ""] if lookup else [])
            for k in range(lab.num_heads)
        ]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=cols + (["lookup"] if lookup else []),
                y=heads,
                zmin=0,
                zmax=1,
                colorscale=scale,
                showscale=False,
                text=text,
                texttemplate="%{text}",
                xgap=2,
                ygap=2,
                hovertemplate="%{y}, %{x}: %{text} accepted<extra></extra>",
            ),
            row=1,
            col=1,
        )
    if lab.accuracy is not None:
        z = [row[:ranks] for row in lab.accuracy]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=cols,
                y=heads,
                zmin=0,
                zmax=1,
                colorscale=scale,
                showscale=False,
                text=[[f"{v:.2f}" for v in row] for row in z],
                texttemplate="%{text}",
                xgap=2,
                ygap=2,
                hovertemplate="%{y}, %{x}: %{text}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category")
    return _layout(fig, title=title, height=int(120 + 48 * lab.num_heads), margin=dict(l=10, r=10, t=70, b=10))
