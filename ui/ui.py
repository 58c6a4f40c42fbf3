"""The page: layout and wiring. ``build_demo(playground)`` works with any (model, tokenizer, heads),
so tests build it around a tiny random model."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import gradio as gr

from medusa_lib.present import DRAFTER_NAMES, MAX_RUN_SECONDS, Playground, Settings, numerics_label

from .figures import empty_figure, timeline_figure
from .handlers import (
    INSPECT_CHOICES,
    INSPECT_OUTPUTS,
    PAGE_INPUTS,
    REPLAY_OUTPUTS,
    RUN_OUTPUTS,
    Handlers,
    empty_paths,
    empty_summary,
)
from .lab import build_lab
from .live import DeviceTurn, on_gpu
from .render import (
    LEGEND_HTML,
    badge_html,
    calibration_note_html,
    column_html,
    drafter_note_html,
    info_html,
    numerics_note_html,
    sampling_html,
)
from .text import HEADER, explain

CSS_FILE = Path(__file__).resolve().parents[1] / "assets" / "style.css"
DEFAULTS = Settings()
# The Mode choice: the greedy comparison first (Medusa greedy must write plain greedy's text), the sampled one a
# click away.
MODE_CHOICES = [("Greedy", "greedy"), ("Sampling", "sampling")]
MODE_INFO = "Greedy: plain greedy, Medusa greedy, Medusa typical at T. Sampling: all three at T from the seed."


def launch_options() -> dict:
    """What Gradio 6 takes at launch(): theme and css (shared by app.py and the tests)."""
    theme = gr.themes.Default(primary_hue="blue", text_size="lg", font=["ui-sans-serif", "system-ui", "sans-serif"])
    css = CSS_FILE.read_text(encoding="utf-8") if CSS_FILE.exists() else None
    return {"theme": theme, "css": css}


def build_demo(
    playground: Playground,
    *,
    examples: Sequence[dict] = (),
    model_name: str = "default",
    max_new_tokens: int = DEFAULTS.max_new_tokens,
    max_run_seconds: float | None = MAX_RUN_SECONDS,
    device: DeviceTurn | None = None,
) -> gr.Blocks:
    """The page around ``playground``. ``device``: the line every run takes (app.py serves it on its main
    thread); by default one of the page's own, served by a thread it starts at the first run."""
    pg, h = playground, Handlers(playground, max_run_seconds=max_run_seconds, device=device)
    limit = pg.max_new_tokens_limit  # the same limit for the slider and the API
    start = min(max_new_tokens, limit)  # the same starting value for the slider and the API's default
    c: dict[str, gr.components.Component] = {}

    with gr.Blocks(title="Medusa Playground") as demo:
        gr.Markdown(HEADER, elem_id="header")
        gr.HTML(
            info_html(
                model=model_name,
                device=pg.device,
                dtype=pg.dtype,
                heads=pg.heads.num_heads,
                heads_note=pg.heads_note,
                numerics=list(pg.variants),
                engine=pg.engine,
            ),
            elem_id="info",
        )

        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Playground", id="playground", elem_id="playground-tab"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=5):
                        prompt = gr.Textbox(
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
                                inputs=[prompt],
                                label="Examples: click one, then Run",
                                example_labels=[str(e.get("label") or e["prompt"][:40]) for e in examples],
                                examples_per_page=12,
                            )
                        with gr.Row():
                            run_btn = gr.Button("Run", variant="primary", elem_id="run-btn", scale=2)
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=1)
                            replay_btn = gr.Button("Race replay", variant="secondary", elem_id="replay-btn", scale=2)
                            speed = gr.Radio(
                                ["0.25x", "0.5x", "1x", "2x"],
                                value="1x",
                                label="Replay speed",
                                scale=2,
                                elem_id="replay-speed",
                            )
                        c["status"] = gr.Markdown(  # no LaTeX: a quoted value's $$ shows as typed (Handlers.refuse)
                            "Pick an example or type a prompt, then press **Run**.",
                            elem_id="status",
                            latex_delimiters=[],
                        )
                    with gr.Column(scale=4, elem_id="settings"):
                        with gr.Row():
                            mode = gr.Radio(
                                MODE_CHOICES,
                                value="sampling" if DEFAULTS.sample else "greedy",
                                label="Mode",
                                info=MODE_INFO,
                                elem_id="mode",
                                scale=3,
                            )
                            seed = gr.Number(
                                value=DEFAULTS.seed,
                                precision=0,
                                minimum=0,
                                label="Seed",
                                elem_id="seed",
                                min_width=90,
                                scale=1,
                            )
                        with gr.Row():
                            max_new = gr.Slider(
                                1,
                                limit,
                                value=start,
                                step=1,
                                label="Max new tokens",
                                elem_id="max-new-tokens",
                                min_width=220,
                            )
                            temperature = gr.Slider(
                                0,
                                2,
                                value=DEFAULTS.temperature,
                                step=0.05,
                                label="Temperature",
                                info="typical; all three in Sampling",
                                elem_id="temperature",
                                min_width=220,
                            )
                        with gr.Row():
                            with gr.Column(min_width=200):
                                epsilon = gr.Slider(
                                    0, 1, value=DEFAULTS.posterior_threshold, step=0.01, label="\u03b5 epsilon"
                                )
                                delta = gr.Slider(0, 1, value=DEFAULTS.posterior_alpha, step=0.01, label="\u03b4 delta")
                            thr_plot = gr.Plot(
                                h.threshold(DEFAULTS.posterior_threshold, DEFAULTS.posterior_alpha),
                                show_label=False,
                                elem_id="threshold-plot",
                                min_width=240,
                            )
                        # who drafts the Medusa columns' trees (present/drafter.py); the plain column never drafts
                        first_note = pg.drafters.note_of(pg.drafters.default)  # what the default drafter drafts
                        drafter = gr.Radio(
                            [(DRAFTER_NAMES[d], d) for d in pg.drafters.available],
                            value=pg.drafters.default,
                            label="Drafter",
                            interactive=len(pg.drafters.available) > 1,
                            elem_id="drafter",
                        )
                        if pg.drafters.note:
                            gr.HTML(drafter_note_html(pg.drafters.note, "drafter-note"), elem_id="drafter-note")
                        eagle_tree = gr.HTML(
                            drafter_note_html(first_note, "eagle-tree-note"),
                            visible=bool(first_note),
                            elem_id="eagle-tree-note",
                        )
                        with gr.Row():
                            tree = gr.Dropdown(
                                pg.tree_names(),
                                value=pg.defaults.tree,
                                label="Tree preset (Medusa drafter)",
                                interactive=pg.drafters.default == "medusa",
                                elem_id="tree-preset",
                            )
                            with gr.Column(min_width=160):
                                chat = gr.Checkbox(value=True, label="Use the chat template")
                                lookup = gr.Checkbox(
                                    value=pg.defaults.lookup_on,
                                    label=(
                                        f"Lookup branch ({pg.defaults.lookup} tokens: "
                                        "an n-gram copied from the context)"
                                    ),
                                    elem_id="lookup-branch",
                                )
                        if pg.defaults.note:  # the default tree was calibrated on another kind of device
                            gr.HTML(calibration_note_html(pg.defaults.note), elem_id="calibration-note")
                        # float32 first (exact: Medusa greedy == plain greedy through near-ties); a 16-bit copy
                        # is the fast choice (present/numerics.py)
                        numerics = gr.Radio(
                            [
                                (numerics_label(n, pg.numerics_speeds), n)
                                for n in sorted(pg.variants, key=lambda n: n != "float32")
                            ],
                            value=pg.default_numerics,
                            label="Numerics",
                            visible=len(pg.variants) > 1,
                            elem_id="numerics",
                        )
                        if pg.numerics_note:
                            gr.HTML(numerics_note_html(pg.numerics_note), elem_id="numerics-note")
                        custom_tree = gr.Textbox(
                            label="Custom tree (JSON list of paths; overrides the preset when not empty)",
                            placeholder="[[0], [0, 0], [1], [0, 0, 0]]",
                            lines=1,
                            interactive=pg.drafters.default == "medusa",
                            elem_id="custom-tree",
                        )

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

                gr.Markdown("## Step inspector: one Medusa step under the microscope", elem_id="inspector-title")
                with gr.Row():
                    insp_method = gr.Radio(INSPECT_CHOICES, value=INSPECT_CHOICES[0], label="Run", scale=1)
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
                    empty_paths(),
                    label="Accepted path of every step",
                    interactive=False,
                    max_height=360,
                    elem_id="path-table",
                )
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
            with gr.Tab("Tree lab", id="lab", elem_id="lab-tab"):
                lab, lab_c = build_lab(
                    pg,
                    custom_tree=custom_tree,
                    prompt=prompt,
                    max_new=max_new,
                    chat=chat,
                    lookup=lookup,
                    numerics=numerics,
                    mode=mode,
                    temperature=temperature,
                    seed=seed,
                    device=h.device,
                    max_run_seconds=max_run_seconds,
                )
        c["session"] = gr.State(None)

        # ------------------------------------------------------------ events
        page_inputs = dict(prompt=prompt, max_new_tokens=max_new, temperature=temperature, epsilon=epsilon, delta=delta)
        page_inputs |= dict(tree=tree, custom_tree=custom_tree, chat_template=chat, lookup_branch=lookup, seed=seed)
        page_inputs |= dict(numerics=numerics, insp_label=insp_method, mode=mode, drafter=drafter)
        run_in = [page_inputs[name] for name in PAGE_INPUTS]  # Handlers.run names them again
        run_ev = run_btn.click(
            on_gpu(h.run),
            inputs=run_in,
            outputs=[c[n] for n in RUN_OUTPUTS],
            concurrency_id="device",
            concurrency_limit=1,
            api_visibility="undocumented",
            api_name="run",
            show_progress="minimal",
        )
        submit_ev = prompt.submit(
            on_gpu(h.run),
            inputs=run_in,
            outputs=[c[n] for n in RUN_OUTPUTS],
            concurrency_id="device",
            concurrency_limit=1,
            api_visibility="private",
            show_progress="minimal",
        )
        # The replay renders a frame 12 times a second: it takes turns with the runs in the device's queue,
        # so it never costs CPU while another user's run is being timed.
        replay_ev = replay_btn.click(
            h.replay,
            inputs=[c["session"], speed],
            outputs=[c[n] for n in REPLAY_OUTPUTS],
            concurrency_id="device",
            concurrency_limit=1,
            api_visibility="private",
            show_progress="hidden",
        )
        # Stop: first the cancel (registered first, so the page sends it first), then the update, which waits
        # for the cancelled run to end and shows the columns it last sent, marked stopped.
        columns = [c["col_plain"], c["col_greedy"], c["col_typical"]]
        stop_btn.click(None, cancels=[run_ev, submit_ev, replay_ev], queue=False, api_visibility="private")
        stop_btn.click(h.stop, inputs=columns, outputs=[c["status"], *columns], queue=False, api_visibility="private")
        drafter.change(
            h.drafter_choice,
            inputs=drafter,
            outputs=[tree, custom_tree, eagle_tree],
            concurrency_limit=None,
            api_visibility="private",
            show_progress="hidden",
        )
        for slider in (epsilon, delta):
            slider.change(
                h.threshold,
                inputs=[epsilon, delta],
                outputs=thr_plot,
                concurrency_limit=None,
                api_visibility="private",
                show_progress="hidden",
            )
        c["insp_step"].release(
            h.inspector,
            inputs=[c["session"], insp_method, c["insp_step"]],
            outputs=[c[n] for n in INSPECT_OUTPUTS],
            concurrency_limit=None,
            api_visibility="private",
            show_progress="hidden",
        )
        # the lab's per-head acceptance follows the comparison's last Medusa run
        for ev in (run_ev, submit_ev):
            ev.then(
                lab.last_run,
                inputs=[lab_c["lab_state"], c["session"]],
                outputs=lab_c["lab_acceptance"],
                api_visibility="private",
                show_progress="hidden",
            )
        insp_method.change(
            h.switch_inspector,
            inputs=[c["session"], insp_method],
            outputs=[c[n] for n in ["insp_step", *INSPECT_OUTPUTS]],
            concurrency_limit=None,
            api_visibility="private",
            show_progress="hidden",
        )

        default_tree = pg.defaults.tree

        @on_gpu
        def compare(
            prompt: str,
            max_new_tokens: int = start,
            temperature: float = DEFAULTS.temperature,
            epsilon: float = DEFAULTS.posterior_threshold,
            delta: float = DEFAULTS.posterior_alpha,
            tree: str = default_tree,
            custom_tree: str = "",
            chat_template: bool = True,
            lookup_branch: bool = pg.defaults.lookup_on,
            sample: bool = False,
            seed: int = DEFAULTS.seed,
            numerics: str = pg.default_numerics,
            drafter: str = pg.drafters.default,
        ) -> dict:
            """Run plain greedy, Medusa greedy and Medusa typical (sampling at `temperature` from `seed`) on the
            prompt, one after another (the page's Greedy mode); return the three texts, their statistics (tokens/s,
            tokens/step, steps, prefill and wall time, tokens from the lookup branch), the greedy-equality check and
            the summary rows. lookup_branch: also verify an n-gram copied from the context beside the heads' tree.
            sample: the fair sampled comparison instead: plain sampling, Medusa exact sampling (== plain sampling
            with the same seed) and typical acceptance, all at `temperature` from `seed`; speedups against plain
            sampling; "sampling_match" instead of "greedy_match", and "sampling" with each run's mean log p and
            entropy under the model at T. numerics: which loaded copy runs ("float32", exact, the default where a
            float32 copy is loaded; or the fast 16-bit one, e.g. "bfloat16", whose Medusa outputs may differ from
            plain's at near-ties); the JSON's "numerics" says which ran. drafter: who drafts the Medusa columns'
            trees, "medusa" (the Medusa heads and `tree`), "eagle" (the EAGLE head, a new dynamic tree every step)
            or "lookup" (prompt lookup: the tokens that followed the latest earlier occurrence of the text's last
            few tokens, as one chain); `tree` and `custom_tree` apply to the Medusa heads only; the JSON's
            "drafter" says which ran. tree, numerics and drafter: null or "" mean the default (the heads' default
            tree; float32 where loaded; the faster drafter on this device, by the figures recorded in the heads'
            config.json); any other value must name one. A cancelled call (gradio_client's job.cancel()) or one
            whose client closes its event stream stops within a step."""
            return h.compare(
                prompt,
                max_new_tokens,
                temperature,
                epsilon,
                delta,
                tree,
                custom_tree,
                chat_template,
                lookup_branch,
                sample,
                seed,
                numerics,
                drafter,
            )

        # said in the API's description: a call that never opens its event stream sends no signal when it leaves
        if max_run_seconds is not None:
            compare.__doc__ += (
                f" A call runs for at most {max_run_seconds:g} s of wall time (this server's bound), "
                "then ends with an error."
            )
        gr.api(compare, api_name="compare", concurrency_id="device", concurrency_limit=1)
    return demo
