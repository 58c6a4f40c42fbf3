"""Event handlers: turn the playground's events into Gradio updates.

A browser session's finished runs live in its gr.State (a dict method -> RunRecord); the
Playground (model, tokenizer, heads) is shared read-only. The one thing kept between calls is,
per session, the columns its run or replay last sent (``LiveColumns``), so that Stop can show them.
Each handler yields tuples in the order of its *_OUTPUTS list (outputs.py); the race replay is replay.py's.
Any exception ends as one sentence in the status line (and as the API's error), never a traceback.
"""

from __future__ import annotations

import html
import time
from typing import Any, Callable, Iterator

import gradio as gr
import pandas as pd
import torch

from medusa_lib.core.messages import InputError, is_number
from medusa_lib.present import (
    DRAFTED_BY,
    DRAFTER_NAMES,
    LABELS,
    MAX_RUN_SECONDS,
    PATH_COLUMNS,
    Playground,
    RunRecord,
    any_of,
    deadline,
    mask_data,
    path_rows,
    sample_of_mode,
    tree_nodes,
    why_it_ended,
)
from medusa_lib.present.report import compare_json
from medusa_lib.present.settings import REQUEST_NAMES, Settings
from medusa_lib.present.shared import SharedRuns

from .figures import empty_figure, mask_figure, threshold_figure, tree_figure
from .live import COLUMN, DeviceTurn, LiveColumns, caller_gone, log
from .outputs import (
    INSPECT_OUTPUTS,
    PAGE_INPUTS,
    RUN_OUTPUTS,
    best_step,
    by_name,
    empty_paths,
    method_of,
    pack,
)
from .render import drafter_note_html, literal_markdown, stopped_column
from .replay import RaceReplay
from .run_frames import FIRST_CHOICE, PageFrames, for_watcher
from .sharing import Sharing, run_live_of

# seconds between page updates while decoding (each update costs CPU the decoder wants)
STREAM_EVERY = 0.2
OUT_OF_MEMORY = "The device ran out of memory; lower Max new tokens or pick a smaller tree, then run again."
UNEXPECTED = (
    "The run failed unexpectedly ({name}); the server logged the details and keeps serving: "
    "try other settings, and please report it."
)


def out_of_memory(e: Exception) -> bool:
    """CUDA raises torch.OutOfMemoryError; the CPU allocator raises a RuntimeError that says so."""
    text = str(e).lower()
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(e, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)
    )


def cannot_run(e: Exception) -> str:
    """The one sentence a failed run gets: a bad input's own (an InputError from medusa_lib), out of
    memory, or, for anything else, a sentence naming the error while its traceback goes to the log."""
    if out_of_memory(e):
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return OUT_OF_MEMORY
    if isinstance(e, InputError):
        return str(e)
    log.error("a run failed", exc_info=e)
    return UNEXPECTED.format(name=type(e).__name__)


class Handlers(RaceReplay):
    def __init__(
        self,
        playground: Playground,
        *,
        max_run_seconds: float | None = MAX_RUN_SECONDS,
        device: DeviceTurn | None = None,
        runs: SharedRuns | None = None,
    ):
        self.pg = playground
        self.live = LiveColumns()
        # every run of every route, one at a time on its one thread
        self.device = device or DeviceTurn()
        # an API call's wall-time bound (None: none)
        self.max_run_seconds = max_run_seconds
        # identical requests computed once: the runs running now and those recorded
        self.sharing = Sharing(playground, self.device, max_run_seconds=max_run_seconds, runs=runs)
        # what a page shows of a run: rendered once, by its producer, on the device's thread
        self.sharing.render_for = lambda settings: PageFrames(self, settings, every=STREAM_EVERY)

    def api_stop(self, **words: str) -> Callable[[], str | None]:
        """What ends a call's run between steps, whatever its route (the page's Run, the race replay, ``/run``,
        ``/compare``): its caller cancelled or left, or the server's bound on one call's wall time (``words``:
        what its sentence calls the run and advises). Made on gradio's thread for the call, where the call's
        task is found."""
        return any_of(caller_gone(), deadline(self.max_run_seconds, **words))

    # ---------------------------------------------------------------- settings
    def threshold(self, epsilon: float, delta: float):
        return threshold_figure(epsilon=float(epsilon), delta=float(delta), vocab_size=self.pg.vocab_size)

    def drafter_choice(self, drafter: str) -> tuple:
        """The Drafter choice: the tree preset and the custom tree apply only to a drafter whose tree they shape
        (the Medusa heads); what the other drafters draft is said instead."""
        takes_tree, note = self.pg.drafters.takes_tree(drafter), self.pg.drafters.note_of(drafter)
        return (
            gr.update(interactive=takes_tree),
            gr.update(interactive=takes_tree),
            gr.update(value=drafter_note_html(note, "eagle-tree-note"), visible=bool(note)),
        )

    # ---------------------------------------------------------------- inspector
    def inspector(self, records: dict | None, label: str, step: float) -> tuple:
        method = method_of(label, records)
        rec = (records or {}).get(method)
        label = LABELS[method]
        title = f"{label}: candidate tree"
        if rec is None or len(rec.views) < 2:
            msg = "Run the playground to inspect a Medusa step." if rec is None else no_step_message(rec)
            return empty_figure(msg, title=title), empty_figure(msg, title="Tree attention mask"), empty_paths()
        # the slider's value from any client: NaN, infinity or text shows the first step, as the slider's start
        i = min(max(int(step) if is_number(step) else 1, 1), len(rec.views) - 1)
        view = rec.views[i]
        s = view.step
        # EAGLE's tree is a new shape every step
        by = f", drafted by {DRAFTED_BY[s.drafter]}" if s.drafter in DRAFTER_NAMES else ""
        tree = tree_figure(
            tree_nodes(view, self.pg.tokenizer),
            title=(
                f"{label}, step {i}{by}: {s.tree.num_nodes if s.tree else 1} tree tokens, "
                f"{s.accept_length} accepted (+1 bonus)"
            ),
        )
        z, cols, rows = mask_data(view, self.pg.tokenizer)
        mask = mask_figure(z, cols, rows, title=f"Tree attention mask, step {i} (row attends to column)")
        return tree, mask, pd.DataFrame(path_rows(rec, self.pg.tokenizer), columns=PATH_COLUMNS)

    def inspector_update(self, records: dict, label: str) -> dict:
        rec = records.get(method_of(label, records))
        n = max(len(rec.views) - 1, 1) if rec else 1
        step = best_step(rec) if rec else 1
        tree, mask, table = self.inspector(records, label, step)
        return {
            "insp_step": gr.Slider(minimum=1, maximum=max(n, 2), value=step, step=1, interactive=n > 1),
            "tree_plot": tree,
            "mask_plot": mask,
            "path_table": table,
        }

    def switch_inspector(self, records: dict | None, label: str) -> tuple:
        return pack(["insp_step", *INSPECT_OUTPUTS], **self.inspector_update(records or {}, label))

    # ---------------------------------------------------------------- the run
    def run(self, *values: Any, request: gr.Request = None, **named: Any) -> Iterator[tuple]:
        """The three columns one after another, each streaming into its column: in the greedy mode plain
        greedy, Medusa greedy and typical acceptance (sampling at the temperature); in the sampling mode
        plain sampling, Medusa exact sampling and typical acceptance, all at that temperature and seed.
        ``values``: the page's inputs in ``PAGE_INPUTS``'s order; ``named``: any of them by name (those
        left out take their defaults: the greedy mode, ``Request``'s settings). They go on as one value, by name.

        A request identical to one running now joins it, one identical to a run finished recently is answered
        from its records (``sharing.py``; Run live runs it afresh), and the status says which. Everything is
        checked before anything changes on the page: a refused input gets its sentence and the previous run's
        results stay (columns, summary, replay) until a new run really starts."""
        page = by_name(PAGE_INPUTS, values, named)
        # here, on gradio's thread for this call: it finds the call's task
        stop = self.api_stop()
        yield from self.live.track(request, RUN_OUTPUTS, self._watch(page, stop, since=time.perf_counter()))

    def run_event(self, request: gr.Request, *values: Any) -> Iterator[tuple]:
        """``run`` as the page's Run button and the prompt's Enter call it: gradio hands ``gr.Request`` only to a
        positional parameter annotated with it (never to ``*values``), so it comes first, the inputs after it."""
        yield from self.run(*values, request=request)

    def read_page(self, page: dict) -> tuple[str, Settings, bool, str]:
        """The page's inputs by name as (prompt, settings, run live, the inspector's choice); a bad value raises
        its sentence (PlaygroundError)."""
        page = {"mode": "greedy", **page}
        prompt, insp_label = page.pop("prompt", None), page.pop("insp_label", None)
        live = run_live_of(page.pop("run_live", False))
        page["sample"] = sample_of_mode(page.pop("mode"))
        return prompt, self.pg.settings_of(page), live, insp_label

    def page_request(self, data: list) -> tuple[str, Settings, bool]:
        """The page's inputs as sent (``PAGE_INPUTS``' order), read as (prompt, settings, run live): the queue's door
        reads a call with it (``Sharing.door``)."""
        return self.read_page(by_name(PAGE_INPUTS, data, {}))[:3]

    def read_request(self, prompt, request: dict) -> tuple[str, Settings, bool]:
        """``/compare``'s inputs by name as (prompt, settings, run live); a bad value raises its sentence."""
        request = dict(request)
        run_live = request.pop("run_live", False)
        settings = self.pg.settings_of(request)
        return prompt, settings, run_live_of(run_live)

    def compare_request(self, data: list) -> tuple[str, Settings, bool]:
        """``/compare``'s inputs as sent (the prompt, ``REQUEST_NAMES``, run_live), as the queue's door reads them."""
        return self.read_request(data[0], by_name((*REQUEST_NAMES, "run_live"), data[1:], {}))

    def _watch(self, page: dict, stop: Callable[[], str | None], *, since: float) -> Iterator[tuple]:
        """A run of the page's inputs, by name, as page frames: the run is the device's (new, joined or recorded:
        ``Sharing.take``); this only renders what it records. ``stop`` ends this caller's watching between two
        frames (its caller cancelled or left, or the server's bound on one call's wall time); the run goes on
        for anyone else watching it."""
        out = lambda **kw: pack(RUN_OUTPUTS, **kw)  # noqa: E731
        yield out(status="Checking the settings&hellip;")
        try:
            prompt, settings, live, insp_label = self.read_page(page)
            run, how = self.sharing.take(prompt, settings, live=live, since=since, page=True)
        except Exception as e:
            # one sentence, the server keeps serving
            yield out(status=self.refuse(e))
            return
        shared = run.shared(how) if how != "new" else None
        try:
            yield from self._frames(run, settings, insp_label, stop, shared)
        finally:
            run.leave(page=True)

    def _frames(
        self, run, settings: Settings, insp_label: str, stop: Callable[[], str | None], shared: dict | None
    ) -> Iterator[tuple]:
        """The page updates of ``run`` for this session: what the run's producer rendered once (``run_frames``),
        from the first (a late watcher catches up in one update) to the last, with this session's note."""
        out = lambda **kw: pack(RUN_OUTPUTS, **kw)  # noqa: E731
        joined = f" ({shared['note'][0].lower()}{shared['note'][1:-1]})" if shared else ""
        if not run.ended:
            yield out(status=f"Waiting for the device{joined}&hellip;" if joined else "Waiting for the device&hellip;")
        shown: dict[str, str] = {}
        try:
            for batch in run.follow(stop):
                if not batch.frames:
                    continue
                upd: dict[str, Any] = {}
                for frame in batch.frames:
                    upd.update(frame)
                upd = for_watcher(upd, label=insp_label, joined=joined)
                shown.update({k: v for k, v in upd.items() if k in COLUMN.values()})
                yield out(**upd)
                # Each update a session is sent costs the server CPU (gradio diffs and sends it) that the decode
                # wants: however many pages watch, together they get about one update every STREAM_EVERY seconds.
                time.sleep(STREAM_EVERY * max(run.pages - 1, 0))
            if run.error is not None:
                raise run.error
        except Exception as e:
            # out of memory mid-run, a caller gone, or a bug: the sentence, and the column that was running says
            # it stopped
            yield out(status=self.refuse(e), **{k: stopped_column(v) for k, v in shown.items()})
            return
        final = run.final if insp_label == FIRST_CHOICE else None
        if final is None:
            final = PageFrames(self, settings, every=STREAM_EVERY).final(run.outcome, insp_label)
            # a run no page watched (an API call's): the next pages answered from it reuse this one
            if insp_label == FIRST_CHOICE:
                run.final = final
        final = for_watcher(final, label=FIRST_CHOICE)
        if shared:
            told = f"**{shared['note']}** Tick **Run live** to measure it again. "
            final["status"] = final["status"].replace("Done. ", f"Done. {told}", 1)
        yield out(**final)

    @staticmethod
    def refuse(e: Exception) -> str:
        """Status line (and toast) for a run that cannot go on."""
        msg = cannot_run(e)
        # gr.Warning renders HTML: a quoted value (a custom tree, a preset name) must show as text
        gr.Warning(html.escape(msg, quote=False))
        # the status is Markdown: a quoted value shows as typed
        return f"**Cannot run:** {literal_markdown(msg)}"

    def stop(self, col_plain: str, col_greedy: str, col_typical: str, request: gr.Request = None) -> tuple:
        """Stop: the event's ``cancels`` end the session's run or replay; this waits until it has ended
        (its last frame is sent by then) and shows the columns it last sent, those still running as stopped."""
        shown = self.live.last_columns(
            request, {"col_plain": col_plain, "col_greedy": col_greedy, "col_typical": col_typical}
        )
        return (
            "Stopped. Press **Run** to start again.",
            *(stopped_column(shown[n]) for n in ("col_plain", "col_greedy", "col_typical")),
        )

    # ---------------------------------------------------------------- API
    def compare(self, prompt, *values: Any, **named: Any) -> dict:
        """The ``/compare`` API: the settings in its order (``REQUEST_NAMES``, then ``run_live``) or by name; the
        run's JSON, or one sentence as the caller's error; the server keeps serving. An identical request running now
        is joined, one finished recently answers at once (the JSON's ``shared`` says so); ``run_live`` runs afresh."""
        request = by_name((*REQUEST_NAMES, "run_live"), values, named)
        # first: the bound counts from the call's start
        since, stop = time.perf_counter(), self.api_stop()
        try:
            prompt, settings, live = self.read_request(prompt, request)
            run, how = self.sharing.take(prompt, settings, live=live, since=since)
        except Exception as e:
            raise gr.Error(cannot_run(e), print_exception=False) from None
        shared = run.shared(how) if how != "new" else None
        try:
            for _ in run.follow(stop):
                pass
            if run.error is not None:
                raise run.error
            return compare_json(run.outcome, shared=shared)
        except Exception as e:
            raise gr.Error(cannot_run(e), print_exception=False) from None
        finally:
            run.leave()


def no_step_message(record: RunRecord) -> str:
    """The inspector's text for a run that ended at its prefill: there is no Medusa step to show."""
    advice = " Raise Max new tokens and run again." if record.result.finish_reason == "length" else ""
    return (
        f"This run ended after the prefill's first token ({why_it_ended(record)}): no Medusa step to inspect.{advice}"
    )
