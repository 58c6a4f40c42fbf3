"""The Tree lab's EAGLE section: the EAGLE head's node budget against its speed-up, measured on this device.

The EAGLE drafter grows its own dynamic tree (top-k, depth, nodes: ``core/dynamic_tree.py``), so the
Medusa lab's tree editor does not apply to it. Its one knob that trades cost for tokens per step is
the node budget, the nodes verified per step: this section measures a few budgets on the
comparison's prompt (``medusa_lib.present.eagle_sweep.eagle_budgets``), one run after another against
plain greedy, with the comparison's Max new tokens, chat template and numerics.
"""

from __future__ import annotations

import html

import gradio as gr
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from medusa_lib.core.device import device_label
from medusa_lib.core.model import input_device
from medusa_lib.present import (
    EAGLE_BUDGETS,
    MAX_RUN_SECONDS,
    BudgetPoint,
    Playground,
    RunStopped,
    any_of,
    deadline,
    eagle_budgets,
)
from medusa_lib.present.export import eagle_export_hint
from medusa_lib.present.lab_measure import acceptance_text

from .figures import _layout, empty_figure
from .handlers import cannot_run
from .live import DeviceTurn, caller_gone, on_gpu
from .render import literal_markdown

# Okabe-Ito
SPEEDUP, PER_STEP, DEFAULT = "#D55E00", "#0072B2", "#009E73"


def budget_figure(
    points: list[BudgetPoint] | None, *, default_nodes: int | None, device: str, prompt_tokens: int | None = None
) -> go.Figure:
    """Measured speed-up over plain greedy (left axis) and tokens per step (right axis) against EAGLE's node budget."""
    title = f"EAGLE: node budget vs speed-up, measured on this device ({device})"
    if not points:
        return empty_figure(
            f"Press Measure EAGLE's node budgets to time EAGLE greedy with {', '.join(map(str, EAGLE_BUDGETS))} nodes "
            "against plain greedy "
            "on the comparison's prompt, here.",
            title=title,
            height=360,
        )
    x = [p.nodes for p in points]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.speedup for p in points],
            mode="lines+markers",
            name="speed-up over plain greedy (measured)",
            line=dict(color=SPEEDUP, width=3),
            marker=dict(size=10),
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[p.tokens_per_step for p in points],
            mode="lines+markers",
            name="tokens per step (measured)",
            line=dict(color=PER_STEP, width=2, dash="dot"),
            marker=dict(size=8),
        ),
        secondary_y=True,
    )
    if default_nodes in x:
        p = points[x.index(default_nodes)]
        fig.add_trace(
            go.Scatter(
                x=[p.nodes],
                y=[p.speedup],
                mode="markers",
                name=f"the head's default ({default_nodes} nodes)",
                marker=dict(color=DEFAULT, size=16, symbol="star", line=dict(color="#fff", width=1)),
            ),
            secondary_y=False,
        )
    fig.add_hline(y=1.0, line=dict(color="#999", dash="dash"), secondary_y=False)
    fig.update_xaxes(title_text="nodes verified per step (besides the root)", rangemode="tozero")
    fig.update_yaxes(title_text="\u00d7 plain greedy's tokens/s", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="tokens per step", rangemode="tozero", secondary_y=True)
    return _layout(
        fig,
        title=title,
        height=400,
        legend=dict(orientation="h", y=-0.25, x=0, yanchor="top"),
        margin=dict(l=10, r=10, t=48, b=10),
    )


class EagleLabHandlers:
    def __init__(
        self,
        playground: Playground,
        *,
        device: DeviceTurn | None = None,
        max_run_seconds: float | None = MAX_RUN_SECONDS,
    ):
        self.pg = playground
        self.device = device or DeviceTurn()
        self.max_run_seconds = max_run_seconds
        self.label = device_label(input_device(playground.model))

    def measure(self, prompt, max_new_tokens, chat_template, numerics, progress=gr.Progress()) -> tuple:
        """EAGLE greedy with each node budget against plain greedy, on the comparison's prompt: (figure, status)."""
        stop = any_of(caller_gone(), deadline(self.max_run_seconds))
        total = len(EAGLE_BUDGETS) + 1

        def step(done: int, total: int) -> None:
            if why := stop():
                raise RunStopped(why)
            progress(
                done / total,
                desc=f"Run {done} of {total} done (plain greedy, then EAGLE with {', '.join(map(str, EAGLE_BUDGETS))} "
                "nodes)",
            )

        try:
            progress(0, desc=f"Run 1 of {total}: plain greedy")
            points = self.device.call(
                eagle_budgets,
                self.pg,
                prompt,
                max_new_tokens=max_new_tokens,
                chat_template=bool(chat_template),
                numerics=numerics or None,
                stop=stop,
                progress=step,
            )
        except Exception as e:
            return gr.skip(), f"**Cannot measure:** {literal_markdown(cannot_run(e))}"
        tree = self.pg.drafters.tree
        best = max((p for p in points if p.speedup is not None), key=lambda p: p.speedup, default=None)
        rows = "; ".join(
            f"{p.nodes} nodes: {p.tokens_per_step:.2f} tokens/step, {acceptance_text(p.acceptance, short=True)}, "
            + (f"{p.speedup:.2f}\u00d7" if p.speedup is not None else "\u2014")
            for p in points
        )
        status = (
            f"Measured on this prompt, on {html.escape(self.label)}, {int(max_new_tokens)} new tokens a run: {rows}."
            + (f" Fastest here: {best.nodes} nodes." if best else "")
            + (f" The head's default is {tree.num_nodes}." if tree else "")
        )
        return budget_figure(points, default_nodes=tree.num_nodes if tree else None, device=self.label), status


def build_eagle_lab(
    pg: Playground,
    *,
    prompt: gr.Textbox,
    max_new: gr.Slider,
    chat: gr.Checkbox,
    numerics: gr.Radio,
    device: DeviceTurn | None = None,
    max_run_seconds: float | None = MAX_RUN_SECONDS,
) -> EagleLabHandlers | None:
    """The section's components (inside the lab tab) and its event; a line saying why there is none without
    an EAGLE head."""
    gr.Markdown("## EAGLE's node budget: measured speed-up on this device", elem_id="eagle-lab-title")
    tree = pg.drafters.tree
    if tree is None:
        gr.Markdown(pg.drafters.note or "This server has no EAGLE head.", elem_id="eagle-lab-note")
        return None
    h = EagleLabHandlers(pg, device=device, max_run_seconds=max_run_seconds)
    gr.Markdown(
        f"The EAGLE head grows its own tree every step (top-k {tree.top_k}, depth {tree.depth}), "
        "so the editor above does not apply to it; "
        f"its knob is the node budget (default {tree.num_nodes}). **Measure** runs plain greedy, "
        "then EAGLE greedy with "
        f"{', '.join(map(str, EAGLE_BUDGETS))} nodes (no lookup branch), on the comparison's prompt with its Max new "
        "tokens and numerics.",
        elem_id="eagle-lab-note",
    )
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=240):
            btn = gr.Button("Measure EAGLE's node budgets", variant="primary", elem_id="eagle-lab-measure")
            status = gr.Markdown("Not measured yet.", elem_id="eagle-lab-status")
        with gr.Column(scale=3):
            plot = gr.Plot(
                budget_figure(None, default_nodes=tree.num_nodes, device=h.label),
                show_label=False,
                elem_id="eagle-lab-plot",
            )
    # every numerics' copy comes from one folder
    head = next(iter(pg.drafters.eagles.values()))
    # whether it can be served in vLLM, and how
    gr.Markdown(eagle_export_hint(head), elem_id="eagle-lab-export")
    btn.click(
        on_gpu(h.measure),
        inputs=[prompt, max_new, chat, numerics],
        outputs=[plot, status],
        concurrency_id="device",
        concurrency_limit=1,
        api_visibility="private",
        show_progress="full",
        show_progress_on=[plot],
    )
    return h
