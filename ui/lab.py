"""The Tree lab tab: the cost, gain and speed-up curves, the tree editor, and what each head got right.

The data comes from ``medusa_lib.present.lab``; this file draws it and wires the tab. Editing never
runs the model: the tree, its mask and its point on the three curves are redrawn from the library.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from medusa_lib.present import (
    LABELS,
    MAX_RUN_SECONDS,
    REFERENCE_NAMES,
    Playground,
    RunStopped,
    any_of,
    deadline,
    sample_of_mode,
)
from medusa_lib.present.export import export_hint
from medusa_lib.present.lab import (
    Curves,
    Measured,
    TreeLab,
    TreePoint,
    add_best_node,
    choices_text,
    curves,
    editor_mask,
    editor_nodes,
    editor_tree,
    leaves,
    measure_costs,
    measure_tree,
    preset_choices,
    remove_leaf,
    run_acceptance,
    tree_lab,
    tree_point,
)

from .eagle_lab import build_eagle_lab
from .figures import ACCEPTED, _layout, empty_figure, mask_figure, tree_figure
from .handlers import DeviceTurn, caller_gone, cannot_run, method_of, on_gpu, pack

CURRENT, MEASURED, OPTIMUM = "#D55E00", "#000000", "#009E73"  # Okabe-Ito vermillion, black, bluish green
HEADS_ONLY, WITH_LOOKUP = "#0072B2", "#CC79A7"
EDIT_OUTPUTS = ["lab_status", "lab_paths", "lab_leaf", "lab_tree", "lab_mask", "lab_cost", "lab_gain", "lab_speedup"]
MEASURE_OUTPUTS = [*EDIT_OUTPUTS, "lab_acceptance", "lab_state"]
COST_OUTPUTS = ["lab_note", "lab_cost", "lab_gain", "lab_speedup", "lab_state"]


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
    if c.cost is None:
        return empty_figure(note or "No cost figures yet.", title=title, height=360)
    fig = go.Figure()
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
            name="non-decreasing fit",
            line=dict(color=HEADS_ONLY, width=3),
        )
    )
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
    """Left: in the run, how often head k's rank-r node was accepted when its parent was (accepted / reached);
    right: the calibrated accuracy acc[k][r]. Rows: heads; columns: ranks (and the lookup branch's node of that depth)."""
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


class LabHandlers:
    """The tab's handlers. A session's lab (its cost curve, measured here or not, and its last Measure)
    lives in its gr.State; the playground is shared read-only."""

    def __init__(
        self,
        playground: Playground,
        *,
        device: DeviceTurn | None = None,
        max_run_seconds: float | None = MAX_RUN_SECONDS,
    ):
        self.pg = playground
        self.base = tree_lab(playground)
        self.device = device or DeviceTurn()  # the comparison's: one run at a time
        self.max_run_seconds = max_run_seconds  # any client can reach these handlers through the queue: the API's bound

    def stop(self):
        return any_of(caller_gone(), deadline(self.max_run_seconds))

    def state(self, state: dict | None) -> dict:
        return state if state else {"lab": self.base, "measured": None}

    def draw(self, state: dict | None, text: str, lookup_on: bool, *, status: str = "") -> dict[str, Any]:
        """Everything an edit redraws; a bad tree leaves the figures as they are and says why."""
        st = self.state(state)
        lab, measured = st["lab"], st["measured"]
        try:
            tree = editor_tree(self.pg, text)
        except Exception as e:
            return {"lab_status": f"**Cannot use this tree:** {html.escape(cannot_run(e), quote=False)}"}
        point = tree_point(lab, tree, lookup_on=bool(lookup_on))
        c = curves(lab)
        leaf_names = [choices_text([c_])[1:-1] for c_ in leaves(tree.choices)]
        bits = [f"{tree.num_nodes} tokens ({tree.num_nodes - 1} nodes, depth {tree.depth})"]
        if point.gain is not None:
            bits.append(f"expected {point.gain:.2f} tokens/step")
        if point.speedup is not None:
            bits.append(
                f"predicted {point.speedup:.2f}\u00d7 plain" + (f" (optimum: {c.optimum} tokens)" if c.optimum else "")
            )
        return {
            "lab_status": status or "This tree: " + ", ".join(bits) + ".",
            "lab_paths": choices_text(tree.choices),
            "lab_leaf": gr.update(choices=leaf_names, value=leaf_names[-1] if leaf_names else None),
            "lab_tree": tree_figure(editor_nodes(tree), title=f"Edited tree: {tree.num_nodes} tokens"),
            "lab_mask": mask_figure(*editor_mask(tree), title="Its tree attention mask (row attends to column)"),
            "lab_cost": cost_figure(c, point, measured, note=lab.cost_note),
            "lab_gain": gain_figure(c, point, measured, note=lab.gain_note),
            "lab_speedup": speedup_figure(
                c, point, measured, note=lab.cost_note if lab.cost is None else lab.gain_note
            ),
        }

    # ---------------------------------------------------------------- the editor
    def edit(self, state, text, lookup_on) -> tuple:
        return pack(EDIT_OUTPUTS, **self.draw(state, text, lookup_on))

    def preset(self, state, name, lookup_on) -> tuple:
        try:
            text = choices_text(preset_choices(name, self.pg.tree_presets))
        except Exception as e:
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot use this tree:** {html.escape(cannot_run(e), quote=False)}")
        return pack(EDIT_OUTPUTS, **self.draw(state, text, lookup_on))

    def add_node(self, state, text, lookup_on) -> tuple:
        lab = self.state(state)["lab"]
        try:
            if lab.accuracy is None:
                raise ValueError(lab.gain_note)
            tree = editor_tree(self.pg, text)
            text = choices_text(add_best_node(tree.choices, lab.accuracy, num_heads=self.pg.heads.num_heads))
        except ValueError as e:  # a TreeError, or no accuracies
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot add a node:** {html.escape(str(e), quote=False)}")
        except Exception as e:
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot add a node:** {html.escape(cannot_run(e), quote=False)}")
        return pack(EDIT_OUTPUTS, **self.draw(state, text, lookup_on))

    def remove(self, state, text, leaf, lookup_on) -> tuple:
        try:
            tree = editor_tree(self.pg, text)
            try:
                node = [int(r) for r in str(leaf or "").strip("[] ").split(",")]
            except ValueError:
                raise ValueError("Pick a leaf to remove from the list.") from None
            text = choices_text(remove_leaf(tree.choices, node))
        except ValueError as e:
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot remove it:** {html.escape(str(e), quote=False)}")
        except Exception as e:
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot remove it:** {html.escape(cannot_run(e), quote=False)}")
        return pack(EDIT_OUTPUTS, **self.draw(state, text, lookup_on))

    def use(self, text) -> tuple:
        """Send the edited tree to the comparison's Custom tree box."""
        try:
            tree = editor_tree(self.pg, text)
        except Exception as e:
            return gr.skip(), f"**Cannot use this tree:** {html.escape(cannot_run(e), quote=False)}"
        return choices_text(
            tree.choices
        ), f"Sent to the comparison's Custom tree box ({tree.num_nodes} tokens): press **Run** above."

    # ---------------------------------------------------------------- measuring
    def measure(
        self,
        state,
        text,
        prompt,
        max_new_tokens,
        chat_template,
        lookup_on,
        numerics,
        mode="greedy",
        temperature=0.0,
        seed=0,
    ) -> tuple:
        """Plain greedy, then Medusa greedy with the edited tree (the sampling mode: plain sampling, then Medusa exact sampling, at
        the comparison's temperature and seed), on the comparison's prompt: the measured point and per-head acceptance."""
        st, stop = self.state(state), self.stop()
        try:
            sample = sample_of_mode(mode)
            with self.device.turn():
                m = measure_tree(
                    self.pg,
                    prompt,
                    text,
                    max_new_tokens=max_new_tokens,
                    chat_template=bool(chat_template),
                    lookup_on=bool(lookup_on),
                    numerics=numerics or None,
                    sample=sample,
                    temperature=temperature,
                    seed=seed,
                    stop=stop,
                )
        except Exception as e:
            return pack(MEASURE_OUTPUTS, lab_status=f"**Cannot measure:** {html.escape(cannot_run(e), quote=False)}")
        st = {**st, "measured": m}
        speed = (
            f"{m.speedup:.2f}\u00d7 {REFERENCE_NAMES[m.plain.method]}"
            if m.speedup is not None
            else "no speed-up (plain made no decode step)"
        )
        status = f"Measured on this prompt: {m.tokens_per_step:.2f} tokens/step, {speed} ({LABELS[m.medusa.method]}, {len(m.medusa.tokens)} tokens)."
        return pack(
            MEASURE_OUTPUTS,
            **self.draw(st, text, lookup_on, status=status),
            lab_acceptance=acceptance_figure(st["lab"], m.medusa, title="Per-head acceptance: the Measure run"),
            lab_state=st,
        )

    def measure_costs(self, state, text, lookup_on, progress=gr.Progress()) -> tuple:
        st, stop = self.state(state), self.stop()

        def step(done: int, total: int) -> None:  # after each size: the place to stop
            if why := stop():
                raise RunStopped(why)
            progress(done / total, desc=f"Timing size {done} of {total}")

        try:
            progress(0, desc="Timing one verify step of each size")
            with self.device.turn():
                lab = measure_costs(self.pg, st["lab"], progress=step)
        except Exception as e:
            return pack(
                COST_OUTPUTS, lab_note=f"**Cannot measure the costs:** {html.escape(cannot_run(e), quote=False)}"
            )
        st = {**st, "lab": lab}
        drawn = self.draw(st, text, lookup_on)
        return pack(
            COST_OUTPUTS,
            lab_note=lab.cost_note + (" " + lab.gain_note if lab.gain_note else ""),
            lab_state=st,
            **{k: drawn[k] for k in ("lab_cost", "lab_gain", "lab_speedup") if k in drawn},
        )

    def last_run(self, state, records) -> go.Figure:
        """Per-head acceptance of the comparison's last Medusa greedy (or exact sampling) run."""
        rec = (records or {}).get(method_of("", records))
        if rec is not None and rec.drafter == "eagle":  # the heads' ranks mean nothing in EAGLE's dynamic tree
            return empty_figure(
                "The last run was drafted by the EAGLE head; per-head acceptance is about the Medusa heads. See EAGLE's node budgets below.",
                title="Per-head acceptance",
                height=300,
            )
        return acceptance_figure(
            self.state(state)["lab"],
            rec,
            title=f"Per-head acceptance: the last {LABELS[rec.method]} run" if rec else "Per-head acceptance",
        )


def build_lab(
    pg: Playground,
    *,
    custom_tree: gr.Textbox,
    prompt: gr.Textbox,
    max_new: gr.Slider,
    chat: gr.Checkbox,
    lookup: gr.Checkbox,
    numerics: gr.Radio,
    mode: gr.Radio,
    temperature: gr.Slider,
    seed: gr.Number,
    device: DeviceTurn | None = None,
    max_run_seconds: float | None = MAX_RUN_SECONDS,
) -> tuple[LabHandlers, dict]:
    """The tab's components (inside the caller's gr.Tab) and its events (Measure follows the comparison's settings and mode);
    returns the handlers and components."""
    h = LabHandlers(pg, device=device, max_run_seconds=max_run_seconds)
    c: dict[str, gr.components.Component] = {}
    start = choices_text(preset_choices(pg.defaults.tree, pg.tree_presets))
    first = h.draw(None, start, pg.defaults.lookup_on)
    gr.Markdown(
        "## Tree lab: why a tree is fast on this device\nSpeed-up = tokens per step (gain) / what one tree step costs against a plain step (cost). "
        "Edit a tree below: its point moves on the three curves at once, without running the model.",
        elem_id="lab-title",
    )
    gr.Markdown(export_hint(pg.heads), elem_id="lab-export")  # whether these heads can be served in vLLM, and how
    with gr.Row(equal_height=True):
        c["lab_note"] = gr.Markdown(" ".join(n for n in (h.base.cost_note, h.base.gain_note) if n), elem_id="lab-note")
        costs_btn = gr.Button(
            "Measure costs on this machine", variant="secondary", elem_id="lab-measure-costs", scale=0, min_width=260
        )
    with gr.Row(equal_height=False):
        c["lab_cost"] = gr.Plot(first["lab_cost"], show_label=False, elem_id="lab-cost")
        c["lab_gain"] = gr.Plot(first["lab_gain"], show_label=False, elem_id="lab-gain")
        c["lab_speedup"] = gr.Plot(first["lab_speedup"], show_label=False, elem_id="lab-speedup")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            preset = gr.Dropdown(
                pg.tree_names(), value=pg.defaults.tree, label="Start from a preset", elem_id="lab-preset"
            )
            c["lab_paths"] = gr.Textbox(
                value=first["lab_paths"], label="Paths of the tree (JSON; Enter redraws)", lines=3, elem_id="lab-paths"
            )
            add_btn = gr.Button("Add the next best node", elem_id="lab-add")
            with gr.Row(equal_height=True):
                c["lab_leaf"] = gr.Dropdown(
                    choices=first["lab_leaf"]["choices"],
                    value=first["lab_leaf"]["value"],
                    label="Leaf to remove",
                    elem_id="lab-leaf",
                    scale=2,
                )
                remove_btn = gr.Button("Remove leaf", elem_id="lab-remove", scale=1)
            with gr.Row():
                use_btn = gr.Button("Use this tree", variant="secondary", elem_id="lab-use")
                measure_btn = gr.Button("Measure", variant="primary", elem_id="lab-measure")
            c["lab_status"] = gr.Markdown(first["lab_status"], elem_id="lab-status")
        with gr.Column(scale=3):
            c["lab_tree"] = gr.Plot(first["lab_tree"], show_label=False, elem_id="lab-tree")
        with gr.Column(scale=2):
            c["lab_mask"] = gr.Plot(first["lab_mask"], show_label=False, elem_id="lab-mask")
    c["lab_acceptance"] = gr.Plot(acceptance_figure(h.base), show_label=False, elem_id="lab-acceptance")
    c["lab_state"] = gr.State(None)
    build_eagle_lab(
        pg,
        prompt=prompt,
        max_new=max_new,
        chat=chat,
        numerics=numerics,
        device=h.device,
        max_run_seconds=max_run_seconds,
    )

    quiet = dict(concurrency_limit=None, api_visibility="private", show_progress="hidden")
    edit_out = [c[n] for n in EDIT_OUTPUTS]
    preset.input(h.preset, inputs=[c["lab_state"], preset, lookup], outputs=edit_out, **quiet)
    c["lab_paths"].submit(h.edit, inputs=[c["lab_state"], c["lab_paths"], lookup], outputs=edit_out, **quiet)
    c["lab_paths"].blur(h.edit, inputs=[c["lab_state"], c["lab_paths"], lookup], outputs=edit_out, **quiet)
    add_btn.click(h.add_node, inputs=[c["lab_state"], c["lab_paths"], lookup], outputs=edit_out, **quiet)
    remove_btn.click(
        h.remove, inputs=[c["lab_state"], c["lab_paths"], c["lab_leaf"], lookup], outputs=edit_out, **quiet
    )
    lookup.change(h.edit, inputs=[c["lab_state"], c["lab_paths"], lookup], outputs=edit_out, **quiet)
    use_btn.click(h.use, inputs=[c["lab_paths"]], outputs=[custom_tree, c["lab_status"]], **quiet)
    measure_btn.click(
        on_gpu(h.measure),
        inputs=[c["lab_state"], c["lab_paths"], prompt, max_new, chat, lookup, numerics, mode, temperature, seed],
        outputs=[c[n] for n in MEASURE_OUTPUTS],
        concurrency_id="device",
        concurrency_limit=1,
        api_visibility="private",
        show_progress="minimal",
    )
    costs_btn.click(
        on_gpu(h.measure_costs),
        inputs=[c["lab_state"], c["lab_paths"], lookup],
        outputs=[c[n] for n in COST_OUTPUTS],
        concurrency_id="device",
        concurrency_limit=1,
        api_visibility="private",
        show_progress="full",
    )
    return h, c
