"""The playground's orchestration, without any UI: three decoders, one after another, as events.

A :class:`Playground` is built once from (model, tokenizer, heads) and shared read-only by all
browser sessions. ``stream(prompt, settings)`` runs plain greedy, Medusa greedy and Medusa
typical one after another on the one device (concurrent runs would distort tokens/s) and
yields an :class:`Event` after every step, carrying the run so far as an immutable
:class:`RunRecord`. Every run builds its own Decoder, hence its own KV cache; with a captured
static engine (``engine.prepare_engine``, on a GPU) a run takes the loaded model's shared static cache and
its graphs while no other run holds them, else a static cache of its own.

The settings live in ``settings.py``, the records in ``records.py``, what the page makes of them in
``page.py`` and ``inspector.py``; ``Playground.load`` (a playground from names) in ``startup.py``. The Gradio
layer (``ui/``) only renders these.
"""

from __future__ import annotations

from contextlib import closing, suppress
from dataclasses import replace
from typing import Iterable, Iterator, Mapping, Sequence

import torch

from ..core.chat import chat_prompt_ids
from ..core.compose import make_decoder
from ..core.decoding import Decoder
from ..core.defaults import HeadsDefaults, heads_defaults
from ..core.device import device_name
from ..core.heads import MedusaHeads
from ..core.kv import StaticKV, describe_engine
from ..core.model import input_device
from ..core.static_run import ready
from .checks import ExactnessChecks
from .drafter import make_drafters
from .drafter_files import load_drafters
from .inputs import RequestInputs
from .limits import StopCheck
from .memory import release_memory
from .numerics import default_numerics, dtype_name, numerics_note
from .page import column_note
from .records import Detokenizer, Event, Piece, RunRecord, StepView, origins
from .report import compare_json, outcome_of
from .settings import (
    DECODER_METHOD,
    MAX_NEW_TOKENS_LIMIT,
    MAX_PROMPT_CHARS,
    PlaygroundError,
    RunStopped,
    Settings,
)
from .startup import Startup


class Playground(Startup, RequestInputs, ExactnessChecks):
    """Model, tokenizer and heads, created once and shared read-only; runs are independent."""

    def __init__(
        self,
        model,
        tokenizer,
        heads: MedusaHeads,
        *,
        heads_note: str = "",
        max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT,
        max_prompt_chars: int = MAX_PROMPT_CHARS,
        max_prompt_tokens: int | None = None,
        prompt_limit_why: str = "the limit its operator set",
        variants: Mapping[str, tuple] | None = None,
        cache: str = "dynamic",
        static_kv: StaticKV | None = None,
        engine: str | None = None,
        numerics_speeds: Mapping[str, float] | None = None,
        drafters: Mapping | None = None,
        drafter_notes: Mapping | None = None,
        variant_kv: Mapping | None = None,
    ):
        self.model, self.tokenizer, self.heads = model, tokenizer, heads
        # "dynamic" | "static": the KV cache every run uses (core/kv.py)
        self.cache = cache
        # the loaded model's captured static cache, shared by runs one at a time
        self.static_kv = static_kv
        # numerics -> the captured static cache of that copy (a float32 copy gets its own)
        self.variant_kv = dict(variant_kv or {})
        self.engine = engine or (static_kv.describe() if static_kv else describe_engine(cache, "none"))
        self.heads_note = heads_note
        self.max_new_tokens_limit = max_new_tokens_limit
        self.max_prompt_chars = max_prompt_chars
        # None: only the model's context limits the prompt (see default_prompt_tokens)
        self.max_prompt_tokens = max_prompt_tokens
        # said in the message of a prompt over max_prompt_tokens
        self.prompt_limit_why = prompt_limit_why
        # trees calibrated for these heads (load_heads)
        self.tree_presets: dict = dict(getattr(heads, "tree_presets", None) or {})
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = str(input_device(model))
        self.dtype = dtype_name(model)
        # numerics -> (model, heads): the loaded dtype first, then e.g. a float32 copy, so a page can
        # show the bfloat16 speed-up and the float32 exactness on one prompt (a run names its pair)
        self.variants: dict[str, tuple] = {
            self.dtype: (model, heads),
            **{k: v for k, v in (variants or {}).items() if k != self.dtype},
        }
        # what a run that names none uses: float32 where loaded (exact), numerics.py
        self.default_numerics = default_numerics(self.variants)
        # numerics -> what the start-up measurement chose on this machine (present/fit.py; none until it runs)
        self.fits: dict = {}
        # the compiled engine being built between runs (compiling.py), None when there is none
        self.pending = None
        # tree, lookup length, lookup on, for this device kind and the default numerics: the benchmark's answer too
        self.defaults = self.defaults_for(None)
        # plain decode tokens/s of each copy, measured at load
        self.numerics_speeds = dict(numerics_speeds or {})
        # the line under the page's choice
        self.numerics_note = numerics_note(self.numerics_speeds, device=device_name(input_device(model)))
        # (numerics, drafter) already warmed up
        self._warm: set[tuple] = set()
        # the Drafter choice: what each drafter loaded per numerics ({name: {numerics: state}}; those that
        # need nothing are always there: drafter_files.py), the default and the line that says why (drafter.py)
        loaded, missing = load_drafters(self.variants, folder=None)
        loaded.update(drafters or {})
        missing = {n: why for n, why in {**missing, **(drafter_notes or {})}.items() if n not in loaded}
        self.drafters = make_drafters(
            loaded,
            defaults=self.defaults,
            device=input_device(model),
            device_label=device_name(input_device(model)),
            missing=missing,
            numerics=self.default_numerics,
        )

    # ------------------------------------------------------------------ inputs
    def defaults_for(self, numerics: str | None) -> HeadsDefaults:
        """The heads' defaults for a run in ``numerics`` (None: the default numerics): the tree calibrated on
        this device kind in those numerics, else this kind's first (a few dictionary reads)."""
        numerics = numerics or self.default_numerics
        return heads_defaults(self.heads, self.device, numerics, fit=self.fits.get(numerics))

    def prompt_ids(self, prompt: str, *, chat_template: bool = True) -> list[int]:
        """Token ids of a prompt that passed ``check_prompt``, through the chat template if asked."""
        return chat_prompt_ids(self.tokenizer, prompt, chat_template=chat_template)

    def prepare(self, prompt: str, settings: Settings) -> tuple[list[int], dict[str, Decoder]]:
        """Check everything before anything runs; raise one clear sentence (an InputError) on bad input.
        Returns the prompt's ids and a decoder per column (``settings.views``, in run order)."""
        self.check_prompt(prompt)
        settings.check(max_new_tokens_limit=self.max_new_tokens_limit)
        self.check_numerics(settings.numerics)
        model, heads = self.pair(settings)
        name = self.drafters.resolve(settings.drafter)
        tree = lambda: self.resolve_tree(settings)  # noqa: E731
        drafter = self.drafters.make(
            name, numerics=dtype_name(model), heads=heads, tree=tree, lookup=self.defaults.lookup
        )
        ids = self.prompt_ids(prompt, chat_template=settings.chat_template)
        shared = (
            self.static_kv
            if model is self.model
            else self.variant_kv.get(settings.numerics if settings.numerics is not None else self.default_numerics)
        )
        decoders = {
            v: make_decoder(
                model,
                method=DECODER_METHOD.get(v, v),
                config=replace(settings.config(v), cache=self.cache),
                static_kv=shared,
                heads=heads,
                drafter=drafter,
            )
            for v in settings.views
        }
        # the smaller limit speaks, so a long prompt is told the figure it must get under: the server's (2,048 on
        # a CPU) before the model's context (DecodeError); an operator's limit at or beyond the context, never
        first, limit = next(iter(decoders.values())), self.max_prompt_tokens
        if limit is not None and limit < first.info.context_limit and len(ids) > limit:
            raise PlaygroundError(
                f"The prompt has {len(ids):,} tokens; this server takes at most {limit:,} "
                f"({self.prompt_limit_why}): shorten it."
            )
        first._prompt_tensor(ids)
        return ids, decoders

    # ------------------------------------------------------------------ running
    def warmup(self, ids: Sequence[int], decoders: Iterable[Decoder], *, say=None) -> None:
        """Run each method for two tokens once per numerics and drafter, through the engine the run
        will use (the shared static cache too), so the first timed run pays no one-off costs; on a
        capturing engine, first capture the whole-step programs of these decoders not captured yet
        (milliseconds each on a GPU, before any timed run, and only while no run holds the cache),
        so no column runs eagerly beside captured ones. A capture that fails is left to the run,
        which then takes the dynamic cache and says so (``Decoder.steps``)."""
        decoders = list(decoders)
        for kv in {
            id(d.static_kv): d.static_kv
            for d in decoders
            if d.static and d.static_kv is not None and d.static_kv.capture != "none"
        }.values():
            # never while another run holds it
            if kv.claim():
                try:
                    with torch.inference_mode():
                        for d in decoders:
                            if d.static and d.static_kv is kv:
                                with suppress(Exception):
                                    ready(d, kv, say=say)
                finally:
                    kv.release()
        key = (dtype_name(decoders[0].model), next((d.drafter.name for d in decoders if d.drafter), None))
        if key in self._warm:
            return
        for d in decoders:
            warm = replace(d.config, max_new_tokens=2)
            make_decoder(d.model, method=d.method, config=warm, drafter=d.drafter, static_kv=d.static_kv).run(ids[:16])
        self._warm.add(key)

    def run_method(
        self, view: str, decoder: Decoder, ids: Sequence[int], *, note: str = "", stop: StopCheck | None = None
    ) -> Iterator[Event]:
        """One column's run (``view``: what the column runs, e.g. plain-sample on the plain decoder; ``note``: its
        line under the title). ``stop`` is asked before every step; a reason ends the run with RunStopped (its
        caches closed at once)."""
        detok = Detokenizer(self.tokenizer)
        record = RunRecord(view, tuple(ids), note=note, drafter=decoder.drafter_name)
        yield Event("start", view, record)
        elapsed, committed = 0.0, 0
        # closed at once when this run stops early: a shared static cache is free again
        with closing(decoder.steps(ids)) as steps:
            for step in steps:
                if stop is not None and (why := stop()):
                    raise RunStopped(why)
                elapsed += step.seconds
                pieces = tuple(Piece(t, detok.push(t), o, step.index) for t, o in zip(step.tokens, origins(step)))
                shown_step = StepView(step, pieces, elapsed, len(ids) + committed - 1)
                committed += len(step.tokens)
                record = replace(record, views=record.views + (shown_step,))
                yield Event("step", view, record)
        record = replace(record, done=True)
        yield Event("end", view, record)

    def run(
        self, ids: Sequence[int], decoders: Mapping[str, Decoder], *, stop: StopCheck | None = None
    ) -> Iterator[Event]:
        """Prepared decoders (``prepare``), one after another; an Event after every step. ``stop`` is
        asked between steps (a cancelled call, a client gone, a wall-time bound: ``deadline``) and a
        reason ends the run with RunStopped. When the run ends or is stopped, memory its caches held
        goes back to the system (``release_memory``)."""
        try:
            self.warmup(ids, decoders.values())
            # plain greedy or plain sampling: the speed-ups' reference
            reference = next(iter(decoders))
            for view, decoder in decoders.items():
                yield from self.run_method(
                    view, decoder, ids, note=column_note(view, decoder.config, reference=reference), stop=stop
                )
        finally:
            release_memory(
                next(iter(decoders.values())).model,
                tokens=len(ids) + max(d.config.max_new_tokens for d in decoders.values()),
                keep_device_cache=self.static_kv is not None,
            )

    def stream(self, prompt: str, settings: Settings = Settings(), *, stop: StopCheck | None = None) -> Iterator[Event]:
        """The three columns (``settings.views``), one after another; an Event after every step."""
        ids, decoders = self.prepare(prompt, settings)
        yield from self.run(ids, decoders, stop=stop)

    def compare(self, prompt: str, settings: Settings = Settings(), *, stop: StopCheck | None = None) -> dict:
        """Run all three and return texts + statistics as a JSON-able dict (the API endpoint). The
        exactness check is "greedy_match" (Medusa greedy vs plain greedy), or "sampling_match"
        (Medusa exact sampling vs plain sampling, same seed) with "sampling", the cost panel's rows."""
        records = {ev.method: ev.record for ev in self.stream(prompt, settings, stop=stop) if ev.kind == "end"}
        return compare_json(outcome_of(self, prompt, settings, records))


__all__ = ["Playground"]
