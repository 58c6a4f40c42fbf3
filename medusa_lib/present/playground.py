"""The playground's orchestration, without any UI: three decoders, one after another, as events.

A :class:`Playground` is built once from (model, tokenizer, heads) and shared read-only by all
browser sessions. ``stream(prompt, settings)`` runs plain greedy, Medusa greedy and Medusa
typical one after another on the one device (concurrent runs would distort tokens/s) and
yields an :class:`Event` after every step, carrying the run so far as an immutable
:class:`RunRecord`. Every run builds its own Decoder, hence its own KV cache; with a captured
static engine (``engine.prepare_engine``, on a GPU) a run takes the loaded model's shared static cache and
its graphs while no other run holds them, else a static cache of its own.

The settings live in ``settings.py``, the records in ``records.py``, what the page makes of them in
``page.py`` and ``inspector.py``. The Gradio layer (``ui/``) only renders these.
"""

from __future__ import annotations

import ctypes
import gc
import os
from contextlib import closing, suppress
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import torch

from ..core.chat import chat_prompt_ids
from ..core.compose import make_decoder
from ..core.decoding import Decoder
from ..core.defaults import HeadsDefaults, heads_defaults
from ..core.device import device_name, resolve_device
from ..core.engine import prepare_engine, resolve_engine
from ..core.file_checks import model_sizes
from ..core.heads import MedusaHeads
from ..core.hub_gguf import weights_note
from ..core.kv import StaticKV, describe_engine
from ..core.model import input_device, load_model, model_config_file
from ..core.static_run import ready
from .checks import ExactnessChecks
from .compiling import pending_engine
from .drafter import (
    DRAFTERS,
    SHIPPED_HEADS,
    check_files,
    check_options,
    load_drafters,
    load_medusa,
    make_drafters,
    untrained_heads,
)
from .fit import fit_playground
from .inputs import RequestInputs
from .limits import PROMPT_TOKENS, StopCheck, any_of, deadline, default_prompt_tokens, static_length
from .numerics import decode_speeds, default_numerics, dtype_name, free_memory, numerics_note
from .page import column_note
from .records import Detokenizer, Event, Piece, RunRecord, StepView, origins
from .report import compare_json, outcome_of
from .settings import (
    DECODER_METHOD,
    MAX_NEW_TOKENS_LIMIT,
    MAX_PROMPT_CHARS,
    MAX_RUN_SECONDS,
    PlaygroundError,
    RunStopped,
    Settings,
)

# after a run whose prompt + budget reach this, freed memory goes back to the system
LONG_RUN_TOKENS = 1024


def release_memory(model, *, tokens: int, keep_device_cache: bool = False) -> None:
    """After a long run, give the memory its caches and attention buffers held back to the system.

    CUDA's caching allocator keeps freed blocks and glibc keeps freed heap pages, so without this a
    server stays at the peak of its longest prompt (docs/serving.md has the figures). Short runs skip
    it: they barely grow memory, and reallocating is not free. ``keep_device_cache`` (a captured
    static engine is loaded): CUDA's cached blocks stay, so its next run pays no cudaMalloc."""
    if tokens < LONG_RUN_TOKENS:
        return
    gc.collect()
    # with a captured engine, an emptied allocator would make the next run pay cudaMalloc
    if input_device(model).type == "cuda" and not keep_device_cache:
        torch.cuda.empty_cache()
    elif _malloc_trim is not None:
        _malloc_trim(0)


def _libc_malloc_trim():
    try:
        # glibc only (Linux); elsewhere freed memory stays with the process
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None


_malloc_trim = _libc_malloc_trim()


def _short_path(path: Path) -> str:
    """A path as the user reads it: relative to the working folder when it lies inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def heads_folder(heads: str | Path | None, *, model: str) -> str | Path | None:
    """The Medusa heads ``Playground.load`` reads for ``model``: ``heads``, where "auto" means the shipped heads
    for the default model and none (untrained heads) for another."""
    if heads == "auto":
        return SHIPPED_HEADS if model == "default" else None
    return heads


class Playground(RequestInputs, ExactnessChecks):
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
        # need nothing are always there), the default and the line that says why (drafter.py)
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

    @classmethod
    def load(
        cls,
        *,
        model: str = "default",
        heads: str | Path | None = "auto",
        default_heads: str | Path | None = SHIPPED_HEADS,
        device: str = "auto",
        dtype: str = "auto",
        trust_remote_code: bool = False,
        progress: Callable[[str], None] | None = None,
        max_prompt_tokens: int | str | None = "auto",
        numerics_copy: bool = True,
        cache: str = "auto",
        capture: str = "auto",
        options: Mapping[str, str | Path | None] | None = None,
        machine_fit: str = "off",
        compile_in_background: bool = False,
        **kwargs,
    ) -> "Playground":
        """Load model + heads, by default what the page loads: the default model with the shipped heads
        (``heads="auto"``: ``SHIPPED_HEADS`` for the default model, none for another) and the EAGLE head
        beside them. A missing *default* heads folder falls back to untrained heads (with a
        note); heads the user named explicitly must load (HeadsError otherwise). Model code from the
        Hub runs only with ``trust_remote_code=True`` (the operator's --trust-remote-code).
        ``max_prompt_tokens="auto"``: the fixed limit of the device's kind (``default_prompt_tokens``).
        ``numerics_copy``: a 16-bit model also gets a float32 copy (with the same heads) when memory
        allows, because only float32 keeps Medusa greedy == plain greedy through near-ties.
        ``cache``/``capture``: the engine (``auto``: ``kv.default_engine`` of the device); a capture
        is compiled or recorded here, at load, for the default tree's step shapes, never in a run.
        ``options`` (or a keyword named after a drafter, e.g. ``eagle="none"``): what the operator
        named for a drafter that takes an option (``Drafter.option``: the app's ``--<name>`` flag),
        e.g. the EAGLE head's folder, "auto" (the one beside the Medusa heads, if any) or "none"; it
        is checked before the model loads, and a named folder must load (EagleError). The drafters
        offered are the core's registry, each loaded for every copy (``drafter.load_drafters``).
        ``machine_fit``: "auto" chooses the tree, lookup length and EAGLE node budget from this machine's
        measured costs (cached per machine; ``fit.fit_playground``), "again" measures anew, "off" (the
        library's default) keeps the shipped calibrations' choices. ``compile_in_background`` (a server's
        choice): where the engine compiles its steps (``capture`` "compile"), runs start at once on the
        engine that needs no compiling and the compiled one is built between runs (``pending``; the server
        drives it, ``compiling.py``)."""
        say = progress or (lambda msg: None)
        options = {**(options or {}), **{n: kwargs.pop(n) for n in list(kwargs) if n in DRAFTERS}}
        heads = heads_folder(heads, model=model)
        check_options(options, folder=heads)
        # every file that can be read without the model, read now: a damaged one is said in seconds
        path = Path(heads) if heads else None
        left_out = check_files(
            path,
            options,
            default_heads=default_heads,
            shown=_short_path(path) if path else "",
            sizes=model_sizes(model_config_file(model)),
        )
        for why in left_out.values():
            say(f"note: {why}")
        # Inductor cannot lower oneDNN's pre-packed CPU weights: a CPU that compiles its steps keeps stock ones
        target = resolve_device(device)
        compiles = resolve_engine(target, cache=cache, capture=capture)[1] == "compile"
        prepack = not (compiles and target.type == "cpu")
        m, tok = load_model(
            model, device=device, dtype=dtype, trust_remote_code=trust_remote_code, prepack=prepack, progress=say
        )
        h, note = load_medusa(path, m, default_heads=default_heads, shown=_short_path(path) if path else "")
        # the default model from the Hub's original weights (its pinned Q4_1 file was refused or unreachable)
        if weights_note(m):
            note = f"{note}; {weights_note(m)}"
        say(f"Medusa: {h.num_heads} {note}")
        loaded = dtype_name(m)
        if numerics_copy and loaded != "float32":
            # float32 weights, twice over for headroom
            need = 2 * sum(p.numel() for p in m.parameters()) * 4
            if free_memory(input_device(m)) > need:
                m32, _ = load_model(
                    model,
                    device=str(input_device(m)),
                    dtype="float32",
                    trust_remote_code=trust_remote_code,
                    prepack=prepack,
                )
                h32 = (
                    load_medusa(path, m32, default_heads=default_heads)[0]
                    if note.startswith("trained")
                    else untrained_heads(m32)
                )
                kwargs["variants"] = {"float32": (m32, h32)}
                kwargs["numerics_speeds"] = speeds = decode_speeds({loaded: (m, h), "float32": (m32, h32)})
                say(
                    f"Numerics: float32 (exact, the comparison's default) and {loaded} "
                    f"({speeds[loaded] / speeds['float32']:.1f}x float32's plain decoding speed here)"
                )
            else:
                say(f"Numerics: {loaded} only (not enough free memory for a float32 copy)")
        copies = {loaded: (m, h), **kwargs.get("variants", {})}
        kwargs["drafters"], kwargs["drafter_notes"] = load_drafters(
            copies, folder=heads, options=options, say=say, left_out=left_out
        )
        if max_prompt_tokens == "auto":
            max_prompt_tokens, kwargs["prompt_limit_why"] = default_prompt_tokens(m)
        say(
            f"Prompts: up to {max_prompt_tokens:,} tokens"
            if max_prompt_tokens
            else "Prompts: up to the model's context"
        )
        static_len = static_length(m, max_prompt_tokens, kwargs.get("max_new_tokens_limit", MAX_NEW_TOKENS_LIMIT))
        zero_gpu = os.environ.get("SPACES_ZERO_GPU") and input_device(m).type == "cuda"
        if zero_gpu and capture in ("auto", "", None) and cache in ("auto", "static", "", None):
            # The GPU comes per request there: a compile per request would take minutes, a graph of the eager
            # kernels milliseconds.
            capture = "cuda-graph"
            say("ZeroGPU: each decode step is recorded in one CUDA graph of eager kernels, nothing compiled.")
        compiled: dict = {}
        if compile_in_background and compiles and not zero_gpu:
            # the compiled engines, built later between runs; runs start on the one that needs no compiling
            compiled = {
                k: prepare_engine(mk, cache="static", capture="compile", max_len=static_len).static_kv
                for k, (mk, _) in copies.items()
            }
            on_gpu = input_device(m).type == "cuda"
            cache, capture = ("static", "cuda-graph") if on_gpu else ("dynamic", "none")
        engine = prepare_engine(m, cache=cache, capture=capture, max_len=static_len, say=say)
        kwargs.update(cache=engine.cache, static_kv=engine.static_kv, engine=engine.description)
        # the float32 copy gets a captured engine of its own: both numerics time the same engine
        if engine.static_kv is not None and "variants" in kwargs:
            kwargs["variant_kv"] = {
                k: prepare_engine(
                    mv, cache=engine.cache, capture=engine.static_kv.capture, max_len=static_len
                ).static_kv
                for k, (mv, hv) in kwargs["variants"].items()
            }
        pg = cls(m, tok, h, heads_note=note, max_prompt_tokens=max_prompt_tokens, **kwargs)
        fit_playground(pg, machine_fit, say=say)
        if compiled and all(kv is not None for kv in compiled.values()):
            pg.pending = pending_engine(
                pg, compiled, lambda numerics: replace(pg.starting_request(), numerics=numerics, max_new_tokens=8)
            )
            say(
                f"Engine: runs use the {pg.engine} now; {pg.pending.total} compiled step programs are built "
                "between runs, then swapped in."
            )
        # the first view's steps now, not in a user's run (ZeroGPU: no GPU yet)
        if (
            engine.static_kv is not None
            and engine.static_kv.capture != "none"
            and not os.environ.get("SPACES_ZERO_GPU")
        ):
            say(
                "Compiling the decode steps of the page's first view (Inductor's on-disk cache makes later starts "
                "shorter)..."
                if engine.static_kv.capture == "compile"
                else "Capturing the decode steps of the page's first view..."
            )
            for numerics in pg.variants:
                first_view = replace(pg.starting_request(), numerics=numerics, max_new_tokens=8)
                ids, decoders = pg.prepare("Hello", pg.settings_of(first_view))
                pg.warmup(ids, decoders.values(), say=say)
            kv = engine.static_kv
            pg.engine = kv.describe()
            say(f"Engine: {pg.engine}.")
        return pg

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


__all__ = [
    "MAX_RUN_SECONDS",
    "RunStopped",
    "any_of",
    "deadline",
    "PROMPT_TOKENS",
    "LONG_RUN_TOKENS",
    "default_prompt_tokens",
    "Playground",
    "device_name",
    "heads_folder",
    "release_memory",
    "untrained_heads",
]
