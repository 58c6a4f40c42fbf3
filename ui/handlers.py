"""Event handlers: turn the playground's events into Gradio updates.

A browser session's finished runs live in its gr.State (a dict method -> RunRecord); the
Playground (model, tokenizer, heads) is shared read-only. The one thing kept between calls is,
per session, the columns its run or replay last sent (``LiveColumns``), so that Stop can show them.
Each handler yields tuples in the order of its *_OUTPUTS list; gr.skip() leaves a component as it is.
Any exception ends as one sentence in the status line (and as the API's error), never a traceback.
"""

from __future__ import annotations

import html
import time
from dataclasses import replace
from typing import Any, Callable, Iterator, Sequence

import gradio as gr
import pandas as pd
import torch

from medusa_lib.core.messages import InputError, is_number
from medusa_lib.present import (
    DRAFTED_BY,
    DRAFTER_NAMES,
    LABELS,
    MAX_RUN_SECONDS,
    NOT_TIMED,
    PATH_COLUMNS,
    SUMMARY_COLUMNS,
    Playground,
    RunRecord,
    RunStopped,
    any_of,
    deadline,
    mask_data,
    path_rows,
    sample_of_mode,
    summary_rows,
    tree_nodes,
    untimed_note,
    visible_steps,
    why_it_ended,
)
from medusa_lib.present.settings import REQUEST_NAMES

from .figures import empty_figure, mask_figure, threshold_figure, timeline_figure, tree_figure
from .live import COLUMN, DeviceTurn, LiveColumns, caller_gone, log
from .render import badge_html, column_html, drafter_note_html, literal_markdown, sampling_html, stopped_column

# The page's inputs of a run, by name, in the order ui.py wires their components and the undocumented /run takes
# them: the prompt, the settings (``Request``'s names; the Mode choice stands for ``sample``), the inspector's choice.
PAGE_INPUTS = (
    "prompt",
    "max_new_tokens",
    "temperature",
    "epsilon",
    "delta",
    "tree",
    "custom_tree",
    "chat_template",
    "lookup_branch",
    "seed",
    "numerics",
    "insp_label",
    "mode",
    "drafter",
)
RUN_OUTPUTS = [
    "status",
    "col_plain",
    "col_greedy",
    "col_typical",
    "timeline",
    "badge",
    "summary",
    "sampling",
    "session",
    "insp_step",
    "tree_plot",
    "mask_plot",
    "path_table",
]
REPLAY_OUTPUTS = ["status", "col_plain", "col_greedy", "col_typical", "timeline"]
INSPECT_OUTPUTS = ["tree_plot", "mask_plot", "path_table"]
# the inspector's choice -> the views it shows
INSPECTED = {
    "Medusa greedy / exact sampling": ("medusa-greedy", "medusa-sample"),
    LABELS["medusa-typical"]: ("medusa-typical",),
}
INSPECT_CHOICES = list(INSPECTED)
# seconds between page updates while decoding (each update costs CPU the decoder wants)
STREAM_EVERY = 0.2
REPLAY_FPS = 12
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


def by_name(names: Sequence[str], values: Sequence, named: dict[str, Any]) -> dict[str, Any]:
    """Values sent in ``names``' order, then others by name, as one dict by name."""
    if len(values) > len(names):
        raise TypeError(f"{len(values)} values sent; at most {len(names)} are taken, in the order {', '.join(names)}.")
    return {**dict(zip(names, values)), **named}


def pack(names: list[str], **values: Any) -> tuple:
    return tuple(values[n] if n in values else gr.skip() for n in names)


def empty_summary() -> pd.DataFrame:
    return pd.DataFrame(columns=SUMMARY_COLUMNS)


def summary_frame(records: dict[str, RunRecord]) -> pd.DataFrame:
    """The summary table; a rate that could not be measured (None: no decode step, or no plain run) shows as
    NOT_TIMED."""
    rows = [{k: NOT_TIMED if v is None else v for k, v in row.items()} for row in summary_rows(records)]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def empty_paths() -> pd.DataFrame:
    return pd.DataFrame(columns=PATH_COLUMNS)


def method_of(label: str, records: dict | None = None) -> str:
    """The run the inspector's choice shows: the middle column's (greedy, or exact sampling) or typical's."""
    views = INSPECTED.get(label, INSPECTED[INSPECT_CHOICES[0]])
    return next((v for v in views if v in (records or {})), views[0])


def best_step(record: RunRecord) -> int:
    """The step to open the inspector on: the first with the longest accepted path."""
    if len(record.views) < 2:
        return 1
    return max(range(1, len(record.views)), key=lambda i: (record.views[i].step.accept_length, -i))


class Handlers:
    def __init__(
        self,
        playground: Playground,
        *,
        max_run_seconds: float | None = MAX_RUN_SECONDS,
        device: DeviceTurn | None = None,
    ):
        self.pg = playground
        self.live = LiveColumns()
        # every run of every route, one at a time on its one thread
        self.device = device or DeviceTurn()
        # an API call's wall-time bound (None: none)
        self.max_run_seconds = max_run_seconds

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

        Everything is checked before anything changes on the page: a refused input gets its sentence
        and the previous run's results stay (columns, summary, replay) until a new run really starts."""
        page = by_name(PAGE_INPUTS, values, named)
        # here, on gradio's thread for this call: it finds the call's task
        stop = self.api_stop()
        yield from self.live.track(request, RUN_OUTPUTS, self.device.stream(self._run(page, stop)))

    def run_event(self, request: gr.Request, *values: Any) -> Iterator[tuple]:
        """``run`` as the page's Run button and the prompt's Enter call it: gradio hands ``gr.Request`` only to a
        positional parameter annotated with it (never to ``*values``), so it comes first, the inputs after it."""
        yield from self.run(*values, request=request)

    def _run(self, page: dict, stop: Callable[[], str | None] | None = None) -> Iterator[tuple]:
        """A run of the page's inputs, by name, on the device's thread; ``stop`` ends it between two steps
        (its caller cancelled or left, or the server's bound on one call's wall time)."""
        page = {"mode": "greedy", **page}
        prompt, insp_label = page.pop("prompt", None), page.pop("insp_label", None)
        out = lambda **kw: pack(RUN_OUTPUTS, **kw)  # noqa: E731
        yield out(status="Checking the settings&hellip;")
        try:
            page["sample"] = sample_of_mode(page.pop("mode"))
            settings = self.pg.settings_of(page)
            ids, decoders = self.pg.prepare(prompt, settings)
        except Exception as e:
            # one sentence, the server keeps serving
            yield out(status=self.refuse(e))
            return
        records: dict[str, RunRecord] = {}
        views = settings.views
        yield out(
            status="Starting&hellip;",
            **{COLUMN[v]: column_html(v, None) for v in views},
            timeline=timeline_figure({}),
            badge=badge_html(None),
            summary=empty_summary(),
            sampling=sampling_html(None),
            session=None,
        )
        last = 0.0
        try:
            for ev in self.pg.run(ids, decoders, stop=stop):
                records[ev.method] = ev.record
                now = time.perf_counter()
                if ev.kind == "step" and now - last < STREAM_EVERY:
                    continue
                last = now
                state = "done" if ev.kind == "end" else "running"
                # plain runs first: it has finished by then
                upd: dict[str, Any] = {
                    COLUMN[ev.method]: column_html(
                        ev.method, ev.record, state=state, reference=reference_of(records, ev.method)
                    ),
                    "timeline": timeline_figure(records),
                }
                if ev.kind == "start":
                    by = f", drafted by {DRAFTED_BY[ev.record.drafter]}" if ev.record.drafter in DRAFTER_NAMES else ""
                    upd["status"] = (
                        f"Running **{LABELS[ev.method]}**{by} ({views.index(ev.method) + 1} of 3; "
                        "the three run one after another for fair timing)&hellip;"
                    )
                if ev.kind == "end" and ev.method == method_of(insp_label, records):
                    upd.update(self.inspector_update(records, insp_label))
                yield out(**upd)
            plain, medusa = records[views[0]], records[views[1]]
            # may run one more forward
            check = self.pg.greedy_check(plain, medusa, settings)
            # one forward per run when sampling
            rows = self.pg.sample_fidelity(records, settings)
            note = untimed_note(records)
            t, seed = settings.temperature, settings.seed
            done = (
                f"Sampled at T = {t:g}, seed {seed}; speedups are against plain sampling. "
                if settings.sample
                else (
                    f"Greedy mode: Medusa typical sampled at T = {t:g}, seed {seed}; "
                    "speedups are against plain greedy. "
                )
                if t > 0
                else ""
            )
            # the server offers a choice: say which ran
            if medusa.drafter in DRAFTER_NAMES and len(self.pg.drafters.available) > 1:
                done = f"Medusa columns drafted by {DRAFTED_BY[medusa.drafter]}. " + done
            final = out(
                status="Done. "
                + done
                + (
                    note
                    if note
                    else "Press **Race replay** to watch the three runs side by side at their measured speed."
                ),
                badge=badge_html(check, plain=plain, medusa=medusa, tokenizer=self.pg.tokenizer),
                summary=summary_frame(records),
                sampling=sampling_html(rows, temperature=float(settings.temperature)),
                session=records,
                **self.inspector_update(records, insp_label),
            )
        except Exception as e:
            # out of memory mid-run, or a bug: the sentence, and the column that was running says it stopped
            cut = {
                COLUMN[m]: column_html(m, r, state="stopped", reference=reference_of(records, m))
                for m, r in records.items()
                if not r.done
            }
            yield out(status=self.refuse(e), **cut)
            return
        yield final

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

    # ---------------------------------------------------------------- race replay
    def replay(self, records: dict | None, speed: str, request: gr.Request = None) -> Iterator[tuple]:
        """Replay the recorded runs together, each step appearing at its measured time."""
        # here, on gradio's thread
        stop = self.api_stop(what="replay", advice="pick a faster replay speed")
        yield from self.live.track(request, REPLAY_OUTPUTS, self.device.stream(self._replay(records, speed, stop)))

    def _replay(
        self, records: dict | None, speed: str, stop: Callable[[], str | None] | None = None
    ) -> Iterator[tuple]:
        out = lambda **kw: pack(REPLAY_OUTPUTS, **kw)  # noqa: E731
        if not records or len(records) < 3:
            gr.Warning("Run the three methods first: the race replay uses their recorded step times.")
            yield out(status="**Nothing to replay yet:** press Run first.")
            return
        try:
            factor = float(str(speed).rstrip("x") or 1)
            total = max(r.elapsed for r in records.values())
            start, t = time.perf_counter(), 0.0
            while True:
                cols = {}
                for m, rec in records.items():
                    k = visible_steps(rec, t)
                    part = replace(rec, views=rec.views[:k], done=k == len(rec.views))
                    cols[COLUMN[m]] = column_html(
                        m, part, state="done" if part.done else "replay", reference=reference_of(records, m)
                    )
                # The status is written on the first and the last frame only: a frame still in flight
                # when Stop is pressed must not overwrite Stop's message (the timeline shows the clock).
                status = {}
                if t == 0 or t >= total:
                    drafter = next((r.drafter for r in records.values() if r.drafter in DRAFTER_NAMES), None)
                    by = (
                        f" (Medusa columns drafted by {DRAFTED_BY[drafter]})"
                        if drafter and len(self.pg.drafters.available) > 1
                        else ""
                    )
                    status["status"] = f"Race replay at {speed}: {total:.2f} s of recorded runs{by}" + (
                        " (done)." if t >= total else f", shown in {total / factor:.1f} s."
                    )
                yield out(timeline=timeline_figure(records, upto=min(t, total), x_max=total * 1.02), **status, **cols)
                if t >= total:
                    break
                if stop is not None and (why := stop()):
                    raise RunStopped(why)
                time.sleep(1 / REPLAY_FPS)
                t = (time.perf_counter() - start) * factor
        except Exception as e:
            # a bug: one sentence, the replay stops
            yield out(status=self.refuse(e))

    # ---------------------------------------------------------------- API
    def compare(self, prompt, *values: Any, **named: Any) -> dict:
        """The ``/compare`` API: the settings in its order (``REQUEST_NAMES``) or by name; the run's JSON, or one
        sentence as the caller's error; the server keeps serving."""
        request = by_name(REQUEST_NAMES, values, named)
        # first: the bound counts from the call's start
        stop = self.api_stop()
        try:
            settings = self.pg.settings_of(request)
            return self.device.call(self.pg.compare, prompt, settings, stop=stop)
        except Exception as e:
            raise gr.Error(cannot_run(e), print_exception=False) from None


def reference_of(records: dict[str, RunRecord], method: str) -> RunRecord | None:
    """The run a column's speed-up is measured against: the first column's (plain), for every other column."""
    first = next(iter(records), None)
    return records[first] if first is not None and method != first else None


def no_step_message(record: RunRecord) -> str:
    """The inspector's text for a run that ended at its prefill: there is no Medusa step to show."""
    advice = " Raise Max new tokens and run again." if record.result.finish_reason == "length" else ""
    return (
        f"This run ended after the prefill's first token ({why_it_ended(record)}): no Medusa step to inspect.{advice}"
    )
