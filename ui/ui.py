"""The page: layout and wiring. ``build_demo(playground)`` works with any (model, tokenizer, heads),
so tests build it around a tiny random model. The Playground tab's sections are laid out in playground_tab.py,
the Tree lab's in lab.py; this file composes them, wires their events and declares the ``/compare`` API."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import gradio as gr

from medusa_lib.present import MAX_RUN_SECONDS, Playground
from medusa_lib.present.settings import Request
from medusa_lib.present.shared import MAX_MEGABYTES, MAX_RESULTS, SharedRuns

from .handlers import Handlers
from .lab import LabHandlers, build_lab
from .live import DeviceTurn, on_gpu
from .outputs import INSPECT_OUTPUTS, PAGE_INPUTS, REPLAY_OUTPUTS, RUN_OUTPUTS
from .playground_tab import Components, playground_tab
from .render import info_html
from .text import HEADER

CSS_FILE = Path(__file__).resolve().parents[1] / "assets" / "style.css"


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
    max_new_tokens: int = Request.max_new_tokens,
    max_run_seconds: float | None = MAX_RUN_SECONDS,
    device: DeviceTurn | None = None,
    shared_results: int = MAX_RESULTS,
    shared_megabytes: float = MAX_MEGABYTES,
) -> gr.Blocks:
    """The page around ``playground``. ``max_new_tokens``: the slider's start and ``/compare``'s default (within
    the playground's limit). ``device``: the line every run takes (app.py serves it on its main thread); by
    default one of the page's own, served by a thread it starts at the first run. ``shared_results`` and
    ``shared_megabytes``: the finished runs kept to answer identical requests (``SharedRuns``)."""
    shared_runs = SharedRuns(max_results=shared_results, max_megabytes=shared_megabytes)
    pg, h = playground, Handlers(playground, max_run_seconds=max_run_seconds, device=device, runs=shared_runs)
    # the page's starting values and /compare's defaults
    start = pg.starting_request(max_new_tokens)
    c: Components = {}

    with gr.Blocks(title="Medusa Playground") as demo:
        info, info_now = header(pg, model_name)
        if pg.pending is not None:
            # each page load reads what runs now; no place on the device's line (it reads a few attributes)
            demo.load(info_now, outputs=info, concurrency_limit=None, api_visibility="private", show_progress="hidden")
        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Playground", id="playground", elem_id="playground-tab"):
                playground_tab(pg, h, start, examples, c)
            with gr.Tab("Tree lab", id="lab", elem_id="lab-tab"):
                lab, lab_c = tree_lab(pg, h, c, max_run_seconds=max_run_seconds)
        c["session"] = gr.State(None)

        runs = wire_run(h, c)
        replay = wire_replay(h, c)
        wire_stop(h, c, cancels=[*runs, replay])
        wire_settings(h, c)
        wire_inspector(h, c, runs=runs, lab=lab, lab_c=lab_c)
        compare_api(h, start, max_run_seconds=max_run_seconds)
    # the queue's door reads these routes' inputs: a request a shared run answers takes no place (serve.py)
    h.sharing.routes = {
        **{f: h.page_request for f in demo.fns.values() if f.fn == h.run_event},
        **{f: h.compare_request for f in demo.fns.values() if f.api_name == "compare"},
    }
    demo.handlers = h
    # what app.py records in the background after start-up: the examples at the page's starting values
    demo.examples = [e["prompt"] for e in examples]
    demo.start = start
    return demo


# ---------------------------------------------------------------- layout
def header(pg: Playground, model_name: str) -> tuple[gr.HTML, Callable[[], str]]:
    """The title and the line that says what this server loaded; while a compiled engine is built between runs
    (``pg.pending``), each page load reads what runs now."""

    def info() -> str:
        return info_html(
            model=model_name,
            device=pg.device,
            dtype=pg.dtype,
            heads=pg.heads.num_heads,
            heads_note=pg.heads_note,
            numerics=list(pg.variants),
            engine=pg.engine,
            tree=pg.defaults.why,
            compiling=pg.pending.status() if pg.pending is not None else "",
        )

    gr.Markdown(HEADER, elem_id="header")
    line = gr.HTML(info(), elem_id="info")
    return line, info


def tree_lab(
    pg: Playground, h: Handlers, c: Components, *, max_run_seconds: float | None
) -> tuple[LabHandlers, Components]:
    """The Tree lab tab: it edits the comparison's custom tree and measures with the comparison's settings."""
    return build_lab(
        pg,
        custom_tree=c["custom_tree"],
        prompt=c["prompt"],
        max_new=c["max_new_tokens"],
        chat=c["chat_template"],
        lookup=c["lookup_branch"],
        numerics=c["numerics"],
        mode=c["mode"],
        temperature=c["temperature"],
        seed=c["seed"],
        device=h.device,
        max_run_seconds=max_run_seconds,
    )


# ---------------------------------------------------------------- events
def wire_run(h: Handlers, c: Components) -> tuple:
    """Run and the prompt's Enter: the page's inputs, bound to ``PAGE_INPUTS``' names once, here."""
    run_in, run_out = [c[name] for name in PAGE_INPUTS], [c[name] for name in RUN_OUTPUTS]
    run_ev = c["run_btn"].click(
        on_gpu(h.run_event),
        inputs=run_in,
        outputs=run_out,
        concurrency_id="device",
        concurrency_limit=1,
        api_visibility="undocumented",
        api_name="run",
        # a waiting user's place and estimate, in the status line (the columns keep the last run meanwhile)
        show_progress="full",
        show_progress_on=c["status"],
    )
    submit_ev = c["prompt"].submit(
        on_gpu(h.run_event),
        inputs=run_in,
        outputs=run_out,
        concurrency_id="device",
        concurrency_limit=1,
        api_visibility="private",
        show_progress="full",
        show_progress_on=c["status"],
    )
    return run_ev, submit_ev


def wire_replay(h: Handlers, c: Components):
    """The race replay. It renders a frame 12 times a second: it takes turns with the runs in the device's queue,
    so it never costs CPU while another user's run is being timed."""
    return c["replay_btn"].click(
        h.replay,
        inputs=[c["session"], c["speed"]],
        outputs=[c[n] for n in REPLAY_OUTPUTS],
        concurrency_id="device",
        concurrency_limit=1,
        api_visibility="private",
        show_progress="hidden",
    )


def wire_stop(h: Handlers, c: Components, *, cancels: list) -> None:
    """Stop: first the cancel (registered first, so the page sends it first), then the update, which waits for the
    cancelled run to end and shows the columns it last sent, marked stopped."""
    columns = [c["col_plain"], c["col_greedy"], c["col_typical"]]
    c["stop_btn"].click(None, cancels=cancels, queue=False, api_visibility="private")
    c["stop_btn"].click(h.stop, inputs=columns, outputs=[c["status"], *columns], queue=False, api_visibility="private")


def wire_settings(h: Handlers, c: Components) -> None:
    """What follows a setting on the page: the tree controls follow the drafter, the threshold plot epsilon and
    delta."""
    c["drafter"].change(
        h.drafter_choice,
        inputs=c["drafter"],
        outputs=[c["tree"], c["custom_tree"], c["eagle_tree"]],
        concurrency_limit=None,
        api_visibility="private",
        show_progress="hidden",
    )
    for slider in (c["epsilon"], c["delta"]):
        slider.change(
            h.threshold,
            inputs=[c["epsilon"], c["delta"]],
            outputs=c["threshold_plot"],
            concurrency_limit=None,
            api_visibility="private",
            show_progress="hidden",
        )


def wire_inspector(h: Handlers, c: Components, *, runs: tuple, lab: LabHandlers, lab_c: Components) -> None:
    """The step inspector's slider and choice of run; and the lab's per-head acceptance, which follows the
    comparison's last Medusa run."""
    c["insp_step"].release(
        h.inspector,
        inputs=[c["session"], c["insp_label"], c["insp_step"]],
        outputs=[c[n] for n in INSPECT_OUTPUTS],
        concurrency_limit=None,
        api_visibility="private",
        show_progress="hidden",
    )
    for ev in runs:
        ev.then(
            lab.last_run,
            inputs=[lab_c["lab_state"], c["session"]],
            outputs=lab_c["lab_acceptance"],
            api_visibility="private",
            show_progress="hidden",
        )
    c["insp_label"].change(
        h.switch_inspector,
        inputs=[c["session"], c["insp_label"]],
        outputs=[c[n] for n in ["insp_step", *INSPECT_OUTPUTS]],
        concurrency_limit=None,
        api_visibility="private",
        show_progress="hidden",
    )


# ---------------------------------------------------------------- API
def compare_api(h: Handlers, start: Request, *, max_run_seconds: float | None) -> None:
    """``/compare``: its parameters are ``Request``'s names in its order, their defaults the page's starting
    values (``start``), as docs/serving.md documents them."""

    @on_gpu
    def compare(
        prompt: str,
        max_new_tokens: int = start.max_new_tokens,
        temperature: float = start.temperature,
        epsilon: float = start.epsilon,
        delta: float = start.delta,
        tree: str = start.tree,
        custom_tree: str = start.custom_tree,
        chat_template: bool = start.chat_template,
        lookup_branch: bool = start.lookup_branch,
        sample: bool = start.sample,
        seed: int = start.seed,
        numerics: str = start.numerics,
        drafter: str = start.drafter,
        run_live: bool = False,
    ) -> dict:
        """Run plain greedy, Medusa greedy and Medusa typical (sampling at `temperature` from `seed`) on the
        prompt, one after another (the page's Greedy mode); return the three texts, their statistics (tokens/s,
        tokens/step, steps, prefill and wall time, tokens from the lookup branch), the greedy-equality check and
        the summary rows. lookup_branch: also verify an n-gram copied from the context beside the heads' tree
        (null: on unless the heads were calibrated without it).
        sample: the fair sampled comparison instead: plain sampling, Medusa exact sampling (== plain sampling
        with the same seed) and typical acceptance, all at `temperature` from `seed`; speedups against plain
        sampling; "sampling_match" instead of "greedy_match", and "sampling" with each run's mean log p and
        entropy under the model at T. numerics: which loaded copy runs ("float32", exact, the default where a
        float32 copy is loaded; or the fast 16-bit one, e.g. "bfloat16", whose Medusa outputs may differ from
        plain's at near-ties); the JSON's "numerics" says which ran. drafter: who drafts the Medusa columns'
        trees, "medusa" (the Medusa heads and `tree`), "eagle" (the EAGLE head, a new dynamic tree every step),
        "lookup" (prompt lookup: the tokens that followed the latest earlier occurrence of the text's last
        few tokens, as one chain) or "rest" (REST: continuations of the text's longest suffix found in a
        datastore, a new tree every step), those the server offers; `tree` and `custom_tree` apply to the
        Medusa heads only; the JSON's
        "drafter" says which ran. tree, numerics and drafter: null or "" mean the default (the heads' default
        tree; float32 where loaded; the faster drafter on this device, by the figures recorded in the heads'
        config.json); any other value must name one. A cancelled call (gradio_client's job.cancel()) or one
        whose client closes its event stream stops within a step. A request identical to one this server is
        running joins it, and one identical to a run it finished recently is answered at once from that run's
        records: the JSON's "shared" then says so ({"how": "joined" or "recorded", "seconds_ago", "note"}; null
        for a run measured for this call), and its timings are that run's measurements. run_live: true runs it
        afresh, in the queue like any other call."""
        return h.compare(
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            epsilon=epsilon,
            delta=delta,
            tree=tree,
            custom_tree=custom_tree,
            chat_template=chat_template,
            lookup_branch=lookup_branch,
            sample=sample,
            seed=seed,
            numerics=numerics,
            drafter=drafter,
            run_live=run_live,
        )

    # said in the API's description: a call that never opens its event stream sends no signal when it leaves
    if max_run_seconds is not None:
        compare.__doc__ += (
            f" A call runs for at most {max_run_seconds:g} s of wall time (this server's bound), "
            "then ends with an error."
        )
    gr.api(compare, api_name="compare", concurrency_id="device", concurrency_limit=1)
