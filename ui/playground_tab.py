"""The Playground tab's layout: the prompt and its buttons, the settings, the three columns and their summary,
the step inspector and the page's explanation. Each section adds its components to one dict by name (the run's
inputs under ``PAGE_INPUTS``' names, its outputs under ``RUN_OUTPUTS``'); ui.py wires their events."""

from __future__ import annotations

from typing import Sequence

import gradio as gr

from medusa_lib.present import DRAFTER_NAMES, Playground, numerics_label
from medusa_lib.present.settings import Request

from .figures import empty_figure, timeline_figure
from .handlers import Handlers
from .outputs import INSPECT_CHOICES, empty_paths, empty_summary
from .render import (
    LEGEND_HTML,
    badge_html,
    calibration_note_html,
    column_html,
    drafter_note_html,
    numerics_note_html,
    sampling_html,
)
from .text import explain

Components = dict[str, gr.components.Component]
# The Mode choice: the greedy comparison first (Medusa greedy must write plain greedy's text), the sampled one a
# click away.
MODE_CHOICES = [("Greedy", "greedy"), ("Sampling", "sampling")]
MODE_INFO = "Greedy: plain greedy, Medusa greedy, Medusa typical at T. Sampling: all three at T from the seed."


def prompt_panel(pg: Playground, examples: Sequence[dict], c: Components) -> None:
    """The prompt, its examples, Run, Stop and the race replay's button and speed, and the status line."""
    c["prompt"] = gr.Textbox(
        label="Prompt",
        lines=3,
        max_lines=8,
        placeholder="Ask the model something, or pick an example below.",
        elem_id="prompt",
        info=pg.prompt_limit_note(),
    )
    if examples:
        gr.Examples(
            examples=[[e["prompt"]] for e in examples],
            inputs=[c["prompt"]],
            label="Examples: click one, then Run",
            example_labels=[str(e.get("label") or e["prompt"][:40]) for e in examples],
            examples_per_page=12,
        )
    with gr.Row():
        c["run_btn"] = gr.Button("Run", variant="primary", elem_id="run-btn", scale=2)
        c["stop_btn"] = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=1)
        c["replay_btn"] = gr.Button("Race replay", variant="secondary", elem_id="replay-btn", scale=2)
        c["speed"] = gr.Radio(
            ["0.25x", "0.5x", "1x", "2x"], value="1x", label="Replay speed", scale=2, elem_id="replay-speed"
        )
    # an identical request running now is joined, one run recently is answered from its records (ui/sharing.py)
    c["run_live"] = gr.Checkbox(
        value=False,
        label="Run live",
        info="Measure afresh: otherwise a request identical to one this server is running or ran recently "
        "shares that run and its measured timings.",
        elem_id="run-live",
    )
    # no LaTeX: a quoted value's $$ shows as typed (Handlers.refuse)
    c["status"] = gr.Markdown(
        "Pick an example or type a prompt, then press **Run**.", elem_id="status", latex_delimiters=[]
    )


def settings_panel(pg: Playground, h: Handlers, start: Request, c: Components) -> None:
    """The run's settings, each under its ``Request`` name and starting at ``start``'s value (the Mode choice
    stands for ``sample``), with the notes that go with them."""
    with gr.Row():
        c["mode"] = gr.Radio(
            MODE_CHOICES,
            value="sampling" if start.sample else "greedy",
            label="Mode",
            info=MODE_INFO,
            elem_id="mode",
            scale=3,
        )
        c["seed"] = gr.Number(
            value=start.seed, precision=0, minimum=0, label="Seed", elem_id="seed", min_width=90, scale=1
        )
    with gr.Row():
        c["max_new_tokens"] = gr.Slider(
            1,
            pg.max_new_tokens_limit,
            value=start.max_new_tokens,
            step=1,
            label="Max new tokens",
            elem_id="max-new-tokens",
            min_width=220,
        )
        c["temperature"] = gr.Slider(
            0,
            2,
            value=start.temperature,
            step=0.05,
            label="Temperature",
            info="typical; all three in Sampling",
            elem_id="temperature",
            min_width=220,
        )
    with gr.Row():
        with gr.Column(min_width=200):
            c["epsilon"] = gr.Slider(0, 1, value=start.epsilon, step=0.01, label="\u03b5 epsilon")
            c["delta"] = gr.Slider(0, 1, value=start.delta, step=0.01, label="\u03b4 delta")
        c["threshold_plot"] = gr.Plot(
            h.threshold(start.epsilon, start.delta), show_label=False, elem_id="threshold-plot", min_width=240
        )
    # who drafts the Medusa columns' trees (present/drafter.py); the plain column never drafts
    takes_tree, first_note = pg.drafters.takes_tree(start.drafter), pg.drafters.note_of(start.drafter)
    c["drafter"] = gr.Radio(
        [(DRAFTER_NAMES[d], d) for d in pg.drafters.available],
        value=start.drafter,
        label="Drafter",
        interactive=len(pg.drafters.available) > 1,
        elem_id="drafter",
    )
    if pg.drafters.note:
        gr.HTML(drafter_note_html(pg.drafters.note, "drafter-note"), elem_id="drafter-note")
    c["eagle_tree"] = gr.HTML(
        drafter_note_html(first_note, "eagle-tree-note"), visible=bool(first_note), elem_id="eagle-tree-note"
    )
    with gr.Row():
        c["tree"] = gr.Dropdown(
            pg.tree_names(),
            value=start.tree,
            label="Tree preset (Medusa drafter)",
            interactive=takes_tree,
            elem_id="tree-preset",
        )
        with gr.Column(min_width=160):
            c["chat_template"] = gr.Checkbox(value=start.chat_template, label="Use the chat template")
            c["lookup_branch"] = gr.Checkbox(
                value=start.lookup_branch,
                label=f"Lookup branch ({pg.defaults.lookup} tokens: an n-gram copied from the context)",
                elem_id="lookup-branch",
            )
    # the default tree was calibrated on another kind of device
    if pg.defaults.note:
        gr.HTML(calibration_note_html(pg.defaults.note), elem_id="calibration-note")
    # float32 first (exact: Medusa greedy == plain greedy through near-ties); a 16-bit copy is the fast choice
    # (present/numerics.py)
    c["numerics"] = gr.Radio(
        [(numerics_label(n, pg.numerics_speeds), n) for n in sorted(pg.variants, key=lambda n: n != "float32")],
        value=start.numerics,
        label="Numerics",
        visible=len(pg.variants) > 1,
        elem_id="numerics",
    )
    if pg.numerics_note:
        gr.HTML(numerics_note_html(pg.numerics_note), elem_id="numerics-note")
    c["custom_tree"] = gr.Textbox(
        value=start.custom_tree,
        label="Custom tree (JSON list of paths; overrides the preset when not empty)",
        placeholder="[[0], [0, 0], [1], [0, 0, 0]]",
        lines=1,
        interactive=takes_tree,
        elem_id="custom-tree",
    )


def results(c: Components) -> None:
    """The three columns, the exactness badge, the sampling panel, the summary table and the timeline."""
    gr.HTML(LEGEND_HTML, elem_id="legend")
    with gr.Row(equal_height=True, elem_id="columns"):
        c["col_plain"] = gr.HTML(column_html("plain", None), elem_id="out-plain")
        c["col_greedy"] = gr.HTML(column_html("medusa-greedy", None), elem_id="out-greedy")
        c["col_typical"] = gr.HTML(column_html("medusa-typical", None), elem_id="out-typical")
    c["badge"] = gr.HTML(badge_html(None), elem_id="greedy-badge")
    c["sampling"] = gr.HTML(sampling_html(None), elem_id="sampling-panel")
    with gr.Row(equal_height=False):
        with gr.Column(scale=7):
            c["summary"] = gr.Dataframe(
                empty_summary(),
                label=(
                    "Summary: wall = prefill + decode; tokens/s counts the decode steps only; "
                    "speedup = tokens/s over plain's"
                ),
                interactive=False,
                elem_id="summary",
                wrap=True,
                column_widths=["17%", "12%", "8%", "10%", "11%", "10%", "12%", "8%", "12%"],
            )
        with gr.Column(scale=5):
            c["timeline"] = gr.Plot(timeline_figure({}), show_label=False, elem_id="timeline")


def inspector(c: Components) -> None:
    """The step inspector: which run, which step, its candidate tree, its attention mask and every accepted path."""
    gr.Markdown("## Step inspector: one Medusa step under the microscope", elem_id="inspector-title")
    with gr.Row():
        c["insp_label"] = gr.Radio(INSPECT_CHOICES, value=INSPECT_CHOICES[0], label="Run", scale=1)
        c["insp_step"] = gr.Slider(
            1,
            2,
            value=1,
            step=1,
            label="Step (opens on the longest accepted path)",
            interactive=False,
            scale=3,
            elem_id="step-slider",
        )
    with gr.Row(equal_height=False):
        c["tree_plot"] = gr.Plot(
            empty_figure("Run the playground to see a candidate tree.", title="Candidate tree"),
            show_label=False,
            elem_id="tree-plot",
            scale=3,
        )
        c["mask_plot"] = gr.Plot(
            empty_figure("Run the playground to see the tree attention mask.", title="Tree attention mask"),
            show_label=False,
            elem_id="mask-plot",
            scale=2,
        )
    c["path_table"] = gr.Dataframe(
        empty_paths(), label="Accepted path of every step", interactive=False, max_height=360, elem_id="path-table"
    )


def explanation(pg: Playground) -> None:
    """How to read the page, with the figures of the calibration the default tree came from."""
    with gr.Accordion("How to read this page", open=True):
        gr.Markdown(
            explain(
                pg.defaults.calibration,
                default_tree=pg.defaults.tree,
                lookup=pg.defaults.lookup_length,
                drafter_note=pg.drafters.note,
            ),
            elem_id="explain",
        )


def playground_tab(pg: Playground, h: Handlers, start: Request, examples: Sequence[dict], c: Components) -> None:
    """The Playground tab: the prompt beside the settings, the results, the step inspector, the explanation."""
    with gr.Row(equal_height=False):
        with gr.Column(scale=5):
            prompt_panel(pg, examples, c)
        with gr.Column(scale=4, elem_id="settings"):
            settings_panel(pg, h, start, c)
    results(c)
    inspector(c)
    explanation(pg)
