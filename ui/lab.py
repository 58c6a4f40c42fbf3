"""The Tree lab tab: the cost, gain and speed-up curves, the tree editor, and what each head got right.

The data comes from ``medusa_lib.present``'s ``lab`` (the curves), ``tree_editor`` and ``lab_measure``; this
file draws it and wires the tab. Editing never runs the model: the tree, its mask and its point on the three
curves are redrawn from the library.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
import plotly.graph_objects as go

from medusa_lib.core.drafters import EagleDrafter
from medusa_lib.present import (
    DRAFTED_BY,
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
from medusa_lib.present.lab import curves, measure_costs, tree_lab, tree_point
from medusa_lib.present.lab_measure import acceptance_text, measure_tree
from medusa_lib.present.settings import Request
from medusa_lib.present.tree_editor import (
    add_best_node,
    choices_text,
    editor_mask,
    editor_nodes,
    editor_tree,
    leaves,
    preset_choices,
    remove_leaf,
)

from .eagle_lab import build_eagle_lab
from .figures import empty_figure, mask_figure, tree_figure
from .handlers import cannot_run
from .lab_figures import acceptance_figure, cost_figure, gain_figure, speedup_figure
from .live import DeviceTurn, caller_gone, on_gpu
from .outputs import by_name, method_of, pack
from .render import literal_markdown

EDIT_OUTPUTS = ["lab_status", "lab_paths", "lab_leaf", "lab_tree", "lab_mask", "lab_cost", "lab_gain", "lab_speedup"]
MEASURE_OUTPUTS = [*EDIT_OUTPUTS, "lab_acceptance", "lab_state"]
COST_OUTPUTS = ["lab_note", "lab_cost", "lab_gain", "lab_speedup", "lab_state"]
# Measure's inputs by name, in the order build_lab wires their components: the session's lab, the edited tree's
# paths as the run's custom tree, then the comparison's prompt and settings (``Request``'s names; the Mode choice
# stands for ``sample``)
MEASURE_INPUTS = (
    "lab_state",
    "custom_tree",
    "prompt",
    "max_new_tokens",
    "chat_template",
    "lookup_branch",
    "numerics",
    "mode",
    "temperature",
    "seed",
)


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
        # the comparison's: one run at a time
        self.device = device or DeviceTurn()
        # any client can reach these handlers through the queue: the API's bound
        self.max_run_seconds = max_run_seconds

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
            return {"lab_status": f"**Cannot use this tree:** {literal_markdown(cannot_run(e))}"}
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
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot use this tree:** {literal_markdown(cannot_run(e))}")
        return pack(EDIT_OUTPUTS, **self.draw(state, text, lookup_on))

    def add_node(self, state, text, lookup_on) -> tuple:
        lab = self.state(state)["lab"]
        try:
            if lab.accuracy is None:
                raise ValueError(lab.gain_note)
            tree = editor_tree(self.pg, text)
            text = choices_text(add_best_node(tree.choices, lab.accuracy, num_heads=self.pg.heads.num_heads))
        except ValueError as e:
            # a TreeError, or no accuracies
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot add a node:** {literal_markdown(str(e))}")
        except Exception as e:
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot add a node:** {literal_markdown(cannot_run(e))}")
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
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot remove it:** {literal_markdown(str(e))}")
        except Exception as e:
            return pack(EDIT_OUTPUTS, lab_status=f"**Cannot remove it:** {literal_markdown(cannot_run(e))}")
        return pack(EDIT_OUTPUTS, **self.draw(state, text, lookup_on))

    def use(self, text) -> tuple:
        """Send the edited tree to the comparison's Custom tree box."""
        try:
            tree = editor_tree(self.pg, text)
        except Exception as e:
            return gr.skip(), f"**Cannot use this tree:** {literal_markdown(cannot_run(e))}"
        return choices_text(
            tree.choices
        ), f"Sent to the comparison's Custom tree box ({tree.num_nodes} tokens): press **Run** above."

    # ---------------------------------------------------------------- measuring
    def measure_event(self, *values) -> tuple:
        """Measure as its button sends it: the values of ``MEASURE_INPUTS``, in that order, bound to their names
        once, here."""
        return self.measure(**by_name(MEASURE_INPUTS, values, {}))

    def measure(
        self,
        lab_state: dict | None = None,
        *,
        custom_tree: str,
        prompt: str,
        max_new_tokens: int,
        chat_template: bool = True,
        lookup_branch: bool = True,
        numerics: str | None = None,
        mode: str = "greedy",
        temperature: float = 0.0,
        seed: int = 0,
    ) -> tuple:
        """Plain greedy, then Medusa greedy with the edited tree (``custom_tree``: its paths; the sampling mode: plain
        sampling, then Medusa exact sampling, at the comparison's temperature and seed), on the comparison's prompt:
        the measured point and per-head acceptance. The settings come by name, as one ``Request`` to the library."""
        st, stop = self.state(lab_state), self.stop()
        try:
            request = Request(
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                custom_tree=custom_tree,
                chat_template=bool(chat_template),
                lookup_branch=bool(lookup_branch),
                sample=sample_of_mode(mode),
                seed=seed,
                numerics=numerics or None,
            )
            m = self.device.call(measure_tree, self.pg, prompt, request, stop=stop)
        except Exception as e:
            return pack(MEASURE_OUTPUTS, lab_status=f"**Cannot measure:** {literal_markdown(cannot_run(e))}")
        st = {**st, "measured": m}
        speed = (
            f"{m.speedup:.2f}\u00d7 {REFERENCE_NAMES[m.plain.method]}"
            if m.speedup is not None
            else "no speed-up (plain made no decode step)"
        )
        status = (
            f"Measured on this prompt: {m.tokens_per_step:.2f} tokens/step, {speed} "
            f"({LABELS[m.medusa.method]}, {len(m.medusa.tokens)} tokens). "
            f"Acceptance as vLLM reports it: {acceptance_text(m.acceptance)}."
        )
        return pack(
            MEASURE_OUTPUTS,
            **self.draw(st, custom_tree, lookup_branch, status=status),
            lab_acceptance=acceptance_figure(st["lab"], m.medusa, title="Per-head acceptance: the Measure run"),
            lab_state=st,
        )

    def measure_costs(self, state, text, lookup_on, progress=gr.Progress()) -> tuple:
        st, stop = self.state(state), self.stop()

        # after each timed forward: the place to stop
        def step(done: int, total: int) -> None:
            if why := stop():
                raise RunStopped(why)
            progress(done / total, desc=f"Timed {done} of {total} verify steps (every size, round after round)")

        try:
            progress(0, desc="Timing one verify step of each size")
            lab = self.device.call(measure_costs, self.pg, st["lab"], progress=step)
        except Exception as e:
            return pack(COST_OUTPUTS, lab_note=f"**Cannot measure the costs:** {literal_markdown(cannot_run(e))}")
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
        # the heads' ranks mean nothing in another drafter's tree
        if rec is not None and rec.drafter is not None and not self.pg.drafters.takes_tree(rec.drafter):
            # the Tree lab's EAGLE section (eagle_lab.py) sweeps that drafter's own node budgets
            see = " See EAGLE's node budgets below." if rec.drafter == EagleDrafter.name else ""
            return empty_figure(
                f"The last run was drafted by {DRAFTED_BY[rec.drafter]}; per-head acceptance is about the Medusa heads."
                + see,
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
    """The tab's components (inside the caller's gr.Tab) and its events (Measure follows the comparison's
    settings and mode); returns the handlers and components."""
    h = LabHandlers(pg, device=device, max_run_seconds=max_run_seconds)
    c: dict[str, gr.components.Component] = {}
    start = choices_text(preset_choices(pg.defaults.tree, pg.tree_presets))
    first = h.draw(None, start, pg.defaults.lookup_on)
    gr.Markdown(
        "## Tree lab: why a tree is fast on this device\nSpeed-up = tokens per step (gain) / what one tree step costs "
        "against a plain step (cost). "
        "Edit a tree below: its point moves on the three curves at once, without running the model.",
        elem_id="lab-title",
    )
    with gr.Row(equal_height=True):
        notes = (pg.defaults.why, h.base.cost_note, h.base.gain_note)
        c["lab_note"] = gr.Markdown(" ".join(n for n in notes if n), elem_id="lab-note")
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
    # under the heads' own figure, the page's one word on serving them (a developer's note, not a first look's)
    # whether these heads can be served in vLLM, and how
    gr.Markdown(export_hint(pg.heads), elem_id="lab-export")
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
    # the comparison's components under MEASURE_INPUTS' names
    measure_in = dict(
        lab_state=c["lab_state"],
        custom_tree=c["lab_paths"],
        prompt=prompt,
        max_new_tokens=max_new,
        chat_template=chat,
        lookup_branch=lookup,
        numerics=numerics,
        mode=mode,
        temperature=temperature,
        seed=seed,
    )
    measure_btn.click(
        on_gpu(h.measure_event),
        inputs=[measure_in[name] for name in MEASURE_INPUTS],
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
