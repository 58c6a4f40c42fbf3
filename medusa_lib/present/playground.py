"""The playground's orchestration, without any UI: three decoders, one after another, as events.

A :class:`Playground` is built once from (model, tokenizer, heads) and shared read-only by all
browser sessions. ``stream(prompt, settings)`` runs plain greedy, Medusa greedy and Medusa
typical one after another on the one device (concurrent runs would distort tokens/s) and
yields an :class:`Event` after every step, carrying the run so far as an immutable
:class:`RunRecord`. Every run builds its own Decoder, hence its own KV cache; with a captured
static engine (``kv.prepare_engine``, on a GPU) a run takes the loaded model's shared static cache and
its graphs while no other run holds them, else a static cache of its own.

The settings live in ``settings.py``, the records in ``records.py``, what the page makes of them in
``page.py`` and ``inspector.py``. The Gradio layer (``ui/``) only renders these.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import time
from contextlib import closing, suppress
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import torch

from ..core.acceptance import race_noise
from ..core.decoding import Decoder, model_info, sampling_probs
from ..core.defaults import heads_defaults
from ..core.fused import ready
from ..core.heads import MedusaHeads
from ..core.kv import StaticKV, describe_engine, prepare_engine
from ..core.lookup import MAX_LOOKUP
from ..core.messages import kind, must_be_switch, shown
from ..core.model import chat_prompt_ids, device_name, input_device, load_model
from ..core.tree import (
    MedusaTree,
    build_tree,
    get_tree,
    parse_choices,
    preset_names,
)
from .drafter import SHIPPED_HEADS, find_eagle, load_eagle_for, load_medusa, make_drafters, untrained_heads
from .numerics import decode_speeds, default_numerics, dtype_name, free_memory, numerics_note
from .page import LABELS, GreedyCheck, column_note, greedy_check, sample_rows, summary_rows
from .records import Detokenizer, Event, Piece, RunRecord, StepView, origins
from .settings import (
    DECODER_METHOD,
    MAX_NEW_TOKENS_LIMIT,
    MAX_PROMPT_CHARS,
    MAX_RUN_SECONDS,
    MAX_TREE_CHARS,
    MAX_TREE_NODES,
    REQUEST_DEFAULTS,
    PlaygroundError,
    RunStopped,
    Settings,
)

StopCheck = Callable[
    [], "str | None"
]  # between two decode steps: None to go on, or the sentence that ends the run (RunStopped)


def deadline(seconds: float | None, *, start: float | None = None) -> StopCheck:
    """A check that ends a run ``seconds`` after ``start`` (now): the server's bound on one call's wall time."""
    if seconds is None:
        return lambda: None
    end = (time.perf_counter() if start is None else start) + seconds
    why = (
        f"The run was stopped after {seconds:g} s, the most this server gives one call (MEDUSA_MAX_RUN_SECONDS); "
        "ask for fewer new tokens or send a shorter prompt."
    )
    return lambda: why if time.perf_counter() > end else None


def any_of(*checks: StopCheck | None) -> StopCheck:
    """The first reason any of ``checks`` gives to stop."""
    live = [c for c in checks if c is not None]
    return lambda: next((why for why in (c() for c in live) if why), None)


PROMPT_TOKENS = {
    "cpu": 2048
}  # the longest prompt a server on this kind of device takes, unless its operator sets one; others: the model's context
LONG_RUN_TOKENS = 1024  # after a run whose prompt + budget reach this, freed memory goes back to the system


def default_prompt_tokens(model) -> tuple[int | None, str]:
    """(the longest prompt a server takes, what its message says about that limit): a fixed figure per
    kind of device, the same at every start. A long prompt is prefilled three times a run (once per
    method) and every decode step then attends over it, so this keeps one paste from holding a CPU
    for minutes. 2,048 tokens is what 2 cores of this project's CPU prefilled in about 3 s in
    bfloat16 (a start-up measurement replaced in issue #26: on a loaded machine it gave anything from
    256 tokens to the whole context). A GPU prefills the whole context of these models in well under
    a second: None, its context decides. None too where the context is shorter than the figure."""
    dev = input_device(model)
    limit = PROMPT_TOKENS.get(dev.type)
    if limit is None or limit >= model_info(model).context_limit:
        return None, "the model's context"
    return limit, f"the fixed limit of a server on a {device_name(dev)}, which prefills the prompt once per method"


def release_memory(model, *, tokens: int, keep_device_cache: bool = False) -> None:
    """After a long run, give the memory its caches and attention buffers held back to the system.

    CUDA's caching allocator keeps freed blocks and glibc keeps freed heap pages, so without this a
    server stays at the peak of its longest prompt (1.05 GB -> 1.6-1.9 GB after a 32,000-character
    prompt on the CPU, issue #17; after a 2,520-token prompt, 1,032 MB without this, 964 MB with it).
    Short runs skip it: they barely grow memory, and reallocating is not free. ``keep_device_cache``
    (a captured static engine is loaded): CUDA's cached blocks stay, so its next run pays no
    cudaMalloc."""
    if tokens < LONG_RUN_TOKENS:
        return
    gc.collect()
    if (
        input_device(model).type == "cuda" and not keep_device_cache
    ):  # with a captured engine, an emptied allocator would make the next run pay cudaMalloc
        torch.cuda.empty_cache()
    elif _malloc_trim is not None:
        _malloc_trim(0)


def _libc_malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc only (Linux); elsewhere freed memory stays with the process
    except (AttributeError, OSError):
        return None


_malloc_trim = _libc_malloc_trim()


def _short_path(path: Path) -> str:
    """A path as the user reads it: relative to the working folder when it lies inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


SHARED_PROMPT_TOKENS = 2048  # prompts the shared static cache holds; a longer prompt's run gets a cache of its own


def _static_length(model, max_prompt_tokens: int | None, max_new_tokens_limit: int) -> int:
    """Slots of the shared static cache: the longest prompt this server takes plus the most new
    tokens, within the context, plus the widest step (a longer run gets a cache of its own)."""
    limit = model_info(model).context_limit
    prompt = min(
        max_prompt_tokens or limit, SHARED_PROMPT_TOKENS
    )  # every step attends over the whole static length: keep it modest
    return min(limit, prompt + max_new_tokens_limit) + MAX_TREE_NODES + 1 + MAX_LOOKUP


class Playground:
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
        eagles: Mapping | None = None,
        eagle_note: str = "",
        variant_kv: Mapping | None = None,
    ):
        self.model, self.tokenizer, self.heads = model, tokenizer, heads
        self.cache = cache  # "dynamic" | "static": the KV cache every run uses (core/kv.py)
        self.static_kv = static_kv  # the loaded model's captured static cache, shared by runs one at a time
        self.variant_kv = dict(
            variant_kv or {}
        )  # numerics -> the captured static cache of that copy (a float32 copy gets its own)
        self.engine = engine or describe_engine(
            cache,
            static_kv.capture if static_kv else "none",
            shapes=static_kv.programs_captured if static_kv else 0,
            seconds=static_kv.capture_seconds if static_kv else 0.0,
        )
        self.heads_note = heads_note
        self.max_new_tokens_limit = max_new_tokens_limit
        self.max_prompt_chars = max_prompt_chars
        self.max_prompt_tokens = (
            max_prompt_tokens  # None: only the model's context limits the prompt (see default_prompt_tokens)
        )
        self.prompt_limit_why = prompt_limit_why  # said in the message of a prompt over max_prompt_tokens
        self.tree_presets: dict = dict(
            getattr(heads, "tree_presets", None) or {}
        )  # trees calibrated for these heads (load_heads)
        self.defaults = heads_defaults(
            heads, input_device(model)
        )  # tree, lookup length, lookup on, for this device kind: the same answer as the benchmark's
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = str(input_device(model))
        self.dtype = dtype_name(model)
        # numerics -> (model, heads): the loaded dtype first, then e.g. a float32 copy, so a page can
        # show the bfloat16 speed-up and the float32 exactness on one prompt (a run names its pair)
        self.variants: dict[str, tuple] = {
            self.dtype: (model, heads),
            **{k: v for k, v in (variants or {}).items() if k != self.dtype},
        }
        self.default_numerics = default_numerics(
            self.variants
        )  # what a run that names none uses: float32 where loaded (exact), numerics.py
        self.numerics_speeds = dict(numerics_speeds or {})  # plain decode tokens/s of each copy, measured at load
        self.numerics_note = numerics_note(
            self.numerics_speeds, device=device_name(input_device(model))
        )  # the line under the page's choice
        self._warm: set[tuple] = set()  # (numerics, drafter) already warmed up
        # the Drafter choice: the EAGLE head per numerics ({}: the Medusa heads only), the default and the line that
        # says why (drafter.py)
        self.drafters = make_drafters(
            dict(eagles or {}),
            defaults=self.defaults,
            device=input_device(model),
            device_label=device_name(input_device(model)),
        )
        if eagle_note and not self.drafters.eagles:
            self.drafters = replace(self.drafters, note=eagle_note)

    def pair(self, settings: Settings | None) -> tuple:
        """The (model, heads) a run uses: its settings' numerics, or the default (float32 where loaded)."""
        numerics = (
            settings.numerics if settings is not None and settings.numerics is not None else self.default_numerics
        )
        return self.variants[numerics]

    def check_numerics(self, numerics) -> None:
        if numerics is None:
            return
        names = ", ".join(self.variants)
        if not isinstance(numerics, str):
            raise PlaygroundError(
                f"Numerics must be the name of one of: {names}, not {kind(numerics)} (got {shown(numerics)})."
            )
        if numerics not in self.variants:
            raise PlaygroundError(f"Numerics must be one of: {names} (got {shown(numerics)}).")

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
        eagle: str | Path | None = "auto",
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
        ``eagle``: the EAGLE head's folder, "auto" (the one beside the Medusa heads, if any) or "none";
        a named folder is checked before the model loads and must load (EagleError)."""
        say = progress or (lambda msg: None)
        if heads == "auto":
            heads = SHIPPED_HEADS if model == "default" else None
        eagle_folder, eagle_named = find_eagle(eagle, heads=heads)
        m, tok = load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code, progress=say)
        path = Path(heads) if heads else None
        h, note = load_medusa(path, m, default_heads=default_heads, shown=_short_path(path) if path else "")
        say(f"Medusa: {h.num_heads} {note}")
        e, kwargs["eagle_note"] = load_eagle_for(eagle_folder, m, named=eagle_named)
        say(f"EAGLE: the head from {_short_path(eagle_folder)}" if e is not None else f"EAGLE: {kwargs['eagle_note']}")
        eagles = {dtype_name(m): e} if e is not None else {}
        loaded = dtype_name(m)
        if numerics_copy and loaded != "float32":
            need = 2 * sum(p.numel() for p in m.parameters()) * 4  # float32 weights, twice over for headroom
            if free_memory(input_device(m)) > need:
                m32, _ = load_model(
                    model, device=str(input_device(m)), dtype="float32", trust_remote_code=trust_remote_code
                )
                h32 = (
                    load_medusa(path, m32, default_heads=default_heads)[0]
                    if note.startswith("trained")
                    else untrained_heads(m32)
                )
                kwargs["variants"] = {"float32": (m32, h32)}
                eagles.update({"float32": load_eagle_for(eagle_folder, m32, named=True)[0]} if e is not None else {})
                kwargs["numerics_speeds"] = speeds = decode_speeds({loaded: (m, h), "float32": (m32, h32)})
                say(
                    f"Numerics: float32 (exact, the comparison's default) and {loaded} "
                    f"({speeds[loaded] / speeds['float32']:.1f}x float32's plain decoding speed here)"
                )
            else:
                say(f"Numerics: {loaded} only (not enough free memory for a float32 copy)")
        if max_prompt_tokens == "auto":
            max_prompt_tokens, kwargs["prompt_limit_why"] = default_prompt_tokens(m)
        say(
            f"Prompts: up to {max_prompt_tokens:,} tokens"
            if max_prompt_tokens
            else "Prompts: up to the model's context"
        )
        static_len = _static_length(m, max_prompt_tokens, kwargs.get("max_new_tokens_limit", MAX_NEW_TOKENS_LIMIT))
        engine = prepare_engine(m, cache=cache, capture=capture, max_len=static_len, say=say)
        kwargs.update(cache=engine.cache, static_kv=engine.static_kv, engine=engine.description)
        if (
            engine.static_kv is not None and "variants" in kwargs
        ):  # the float32 copy gets a captured engine of its own: both numerics time the same engine
            kwargs["variant_kv"] = {
                k: prepare_engine(
                    mv, cache=engine.cache, capture=engine.static_kv.capture, max_len=static_len
                ).static_kv
                for k, (mv, hv) in kwargs["variants"].items()
            }
        pg = cls(m, tok, h, heads_note=note, max_prompt_tokens=max_prompt_tokens, eagles=eagles, **kwargs)
        if (
            engine.static_kv is not None
            and engine.static_kv.capture != "none"
            and not os.environ.get("SPACES_ZERO_GPU")
        ):  # the first view's steps now, not in a user's run (ZeroGPU: no GPU yet)
            say("Capturing the decode steps of the page's first view...")
            for numerics in pg.variants:
                ids, decoders = pg.prepare("Hello", replace(Settings(), numerics=numerics, max_new_tokens=8))
                pg.warmup(ids, decoders.values())
            kv = engine.static_kv
            pg.engine = describe_engine("static", kv.capture, shapes=kv.programs_captured, seconds=kv.capture_seconds)
            say(f"Engine: {pg.engine}.")
        return pg

    # ------------------------------------------------------------------ inputs
    def prompt_limit_note(self) -> str:
        """The line the page shows by the prompt: the longest prompt this server takes."""
        if self.max_prompt_tokens is not None:
            return f"Up to {self.max_prompt_tokens:,} tokens on this server ({self.prompt_limit_why})."
        return f"Up to the model's context, {model_info(self.model).context_limit:,} tokens."

    def tree_names(self) -> list[str]:
        return list(self.tree_presets) + [n for n in preset_names() if n not in self.tree_presets]

    def settings(
        self,
        max_new_tokens,
        temperature,
        epsilon,
        delta,
        tree,
        custom_tree,
        chat_template,
        lookup_branch=True,
        sample=False,
        seed=0,
        numerics=None,
        drafter=None,
    ) -> Settings:
        """``settings_of`` with the values in ``/compare``'s order."""
        return self.settings_of({k: v for k, v in locals().items() if k != "self"})

    def settings_of(self, request: Mapping) -> Settings:
        """Settings from what the page or a ``/compare`` caller sent, by name (``REQUEST_DEFAULTS``:
        what a name left out means). An empty preset means the heads' default tree, a list of paths
        is taken as the custom tree (as JSON text), the lookup switch becomes the heads' branch length
        or 0. Only what these conversions need is checked here (the switch must be true or false, the
        list must be writable as text); ``prepare`` checks the rest."""
        unknown = sorted(set(request) - set(REQUEST_DEFAULTS))
        if unknown:
            raise PlaygroundError(f"Unknown setting {unknown[0]!r}; the settings are: {', '.join(REQUEST_DEFAULTS)}.")
        r = {**REQUEST_DEFAULTS, **request}
        custom_tree = r["custom_tree"]
        if isinstance(custom_tree, list):  # an API caller may send the paths themselves
            try:
                custom_tree = json.dumps(custom_tree)
            except (TypeError, ValueError, RecursionError):  # nested too deep to write back as text
                raise PlaygroundError(
                    "The custom tree is nested too deeply; send a flat list of paths like [[0], [0, 0], [1]]."
                ) from None
        if not isinstance(r["lookup_branch"], bool):
            raise PlaygroundError(must_be_switch("The lookup branch switch (lookup_branch)", r["lookup_branch"]))
        return Settings(
            max_new_tokens=r["max_new_tokens"],
            temperature=r["temperature"],
            posterior_threshold=r["epsilon"],
            posterior_alpha=r["delta"],
            tree=r["tree"] if r["tree"] not in (None, "") else self.defaults.tree,
            custom_tree="" if custom_tree is None else custom_tree,
            chat_template=r["chat_template"],
            lookup=self.defaults.lookup if r["lookup_branch"] else 0,
            sample=r["sample"],
            seed=r["seed"],
            numerics=r["numerics"] if r["numerics"] != "" else None,
            drafter=r["drafter"] if r["drafter"] != "" else None,
        )

    def resolve_tree(self, settings: Settings) -> MedusaTree:
        K = self.heads.num_heads
        custom = settings.custom_tree
        if custom.strip():
            if len(custom) > MAX_TREE_CHARS:
                raise PlaygroundError(
                    f"The custom tree text has {len(custom):,} characters; "
                    f"the limit is {MAX_TREE_CHARS:,}: list fewer nodes."
                )
            choices = parse_choices(custom)
            if len(choices) > MAX_TREE_NODES:
                raise PlaygroundError(
                    f"The custom tree has {len(choices)} nodes; the limit is {MAX_TREE_NODES}: remove some nodes."
                )
            return build_tree(choices, num_heads=K, name="custom")
        if settings.tree not in self.tree_names():
            raise PlaygroundError(
                f"Unknown tree preset {shown(settings.tree)}; choose one of: {', '.join(self.tree_names())}."
            )
        return get_tree(settings.tree, num_heads=K, extra=self.tree_presets)

    def check_prompt(self, prompt: str) -> None:
        """Cheap checks before tokenising: a huge paste is refused without spending CPU on it."""
        if prompt is not None and not isinstance(prompt, str):
            raise PlaygroundError(f"The prompt must be text, not {kind(prompt)}.")
        if not prompt or not prompt.strip():
            raise PlaygroundError("The prompt is empty; type a question or pick an example.")
        if len(prompt) > self.max_prompt_chars:
            raise PlaygroundError(
                f"The prompt has {len(prompt):,} characters; the limit is {self.max_prompt_chars:,}: shorten it."
            )
        bad = next((i for i, ch in enumerate(prompt) if "\ud800" <= ch <= "\udfff"), None)
        if bad is not None:  # half of a UTF-16 pair: no tokenizer can encode it
            raise PlaygroundError(
                f"The prompt has an invalid character at position {bad + 1:,} "
                f"(U+{ord(prompt[bad]):04X}, half of a UTF-16 pair); delete it or paste the text again."
            )

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
            v: Decoder(
                model,
                method=DECODER_METHOD.get(v, v),
                config=replace(settings.config(v), cache=self.cache),
                static_kv=shared,
                heads=heads,
                drafter=drafter,
            )
            for v in settings.views
        }
        next(iter(decoders.values()))._prompt_tensor(
            ids
        )  # the model's context first (DecodeError): the hard limit, whatever the server's
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise PlaygroundError(
                f"The prompt has {len(ids):,} tokens; this server takes at most {self.max_prompt_tokens:,} "
                f"({self.prompt_limit_why}): shorten it."
            )
        return ids, decoders

    def greedy_check(self, plain: RunRecord, medusa: RunRecord, settings: Settings | None = None) -> GreedyCheck:
        """greedy_check (exact sampling against plain sampling, when ``settings.sample``), and where the
        outputs differ, how close the base model's choice was there: the top-2 logit gap (greedy), or
        the gap between the two tokens' scores in the draw (sampling). A tree forward and a one-token
        forward round differently, so a near-tie may flip the choice."""
        sampled = settings is not None and settings.sample
        model = self.pair(settings)[0]
        numerics = dtype_name(model)
        check = replace(
            greedy_check(plain.tokens, medusa.tokens, sampled=sampled),
            numerics=numerics,
            exact_available="float32" in self.variants,
        )
        k = check.first_diff
        if check.equal or k >= min(len(plain.tokens), len(medusa.tokens)):
            return check
        if sampled:
            gap = self.draw_gap(
                plain.prompt_ids,
                plain.tokens[:k],
                plain.tokens[k],
                medusa.tokens[k],
                settings.config(medusa.method),
                draw=k,
                model=model,
            )
        else:
            gap = self.logit_gap(plain.prompt_ids, plain.tokens[:k], model=model)
        tol = 1e-3 if numerics == "float32" else 0.5  # 16-bit logits near 20 are spaced 0.125 apart; 30 layers add more
        return replace(check, logit_gap=gap, tie=gap <= tol)

    @torch.inference_mode()
    def draw_gap(
        self,
        prompt_ids: Sequence[int],
        tokens: Sequence[int],
        a: int,
        b: int,
        config,
        *,
        draw: int,
        signed: bool = False,
        model=None,
    ) -> float:
        """How far apart tokens a and b were in draw number ``draw`` (0-based) of a seeded sampled run
        after prompt + tokens: T x |(log p_a - log E_a) - (log p_b - log E_b)|, in logit units, where
        the draw is argmax(p / E) (``sample_token``) and E is the noise of that position under the
        seed (``race_noise``; ``signed``: without the absolute value, positive where a wins the draw)."""
        model = model or self.model
        ids = torch.tensor([list(prompt_ids) + list(tokens)], device=input_device(model))
        logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
        probs = sampling_probs(logits, temperature=config.temperature, top_p=config.top_p)
        race = race_noise(
            config.seed, len(prompt_ids) + draw, probs.shape[-1], device=probs.device
        )  # the token at that position
        score = probs.log() - race.log()
        gap = float(config.temperature * (score[a] - score[b]))
        return gap if signed else abs(gap)

    @torch.inference_mode()
    def sample_scores(self, record: RunRecord, *, temperature: float, model=None) -> tuple[float, float]:
        """(mean log p, mean entropy) of the model's distribution at T over the tokens a run produced,
        from one forward over prompt + output (not timed). For a true sample the mean log p is
        minus the mean entropy, up to noise; tokens chosen for being likely score higher."""
        n, model = len(record.tokens), model or self.model
        ids = torch.tensor([list(record.prompt_ids) + list(record.tokens)], device=input_device(model))
        logits = (
            model(input_ids=ids, logits_to_keep=n + 1).logits[0, :-1].float()
        )  # the distribution each token was drawn from
        probs = sampling_probs(logits, temperature=temperature, top_p=1.0)
        logp = probs.gather(-1, torch.tensor(record.tokens, device=probs.device)[:, None]).clamp_min(1e-30).log()
        return float(logp.mean()), float(torch.special.entr(probs).sum(-1).mean())

    def sample_fidelity(self, records: dict[str, RunRecord], settings: Settings) -> list[dict]:
        """The sampled comparison's cost panel (``page.sample_rows``); [] when the runs did not sample."""
        if not settings.sample:
            return []
        return sample_rows(
            records,
            {
                v: self.sample_scores(r, temperature=float(settings.temperature), model=self.pair(settings)[0])
                for v, r in records.items()
                if r.tokens
            },
            temperature=float(settings.temperature),
        )

    @torch.inference_mode()
    def logit_gap(self, prompt_ids: Sequence[int], tokens: Sequence[int], *, model=None) -> float:
        """Top-1 minus top-2 logit of the base model after prompt + tokens (one plain forward, no cache)."""
        model = model or self.model
        ids = torch.tensor([list(prompt_ids) + list(tokens)], device=input_device(model))
        top = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float().topk(2).values
        return float(top[0] - top[1])

    # ------------------------------------------------------------------ running
    def warmup(self, ids: Sequence[int], decoders: Iterable[Decoder]) -> None:
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
            if kv.claim():  # never while another run holds it
                try:
                    with torch.inference_mode():
                        for d in decoders:
                            if d.static and d.static_kv is kv:
                                with suppress(Exception):
                                    ready(d, kv)
                finally:
                    kv.release()
        key = (dtype_name(decoders[0].model), next((d.drafter.name for d in decoders if d.drafter), None))
        if key in self._warm:
            return
        for d in decoders:
            warm = replace(d.config, max_new_tokens=2)
            Decoder(d.model, method=d.method, config=warm, drafter=d.drafter, static_kv=d.static_kv).run(ids[:16])
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
        with closing(
            decoder.steps(ids)
        ) as steps:  # closed at once when this run stops early: a shared static cache is free again
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
            reference = next(iter(decoders))  # plain greedy or plain sampling: the speed-ups' reference
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
        plain, medusa, _ = settings.views
        check = self.greedy_check(records[plain], records[medusa], settings)
        drafter = self.drafters.resolve(settings.drafter)
        tree = self.drafters.tree_label(
            drafter, medusa=lambda: self.resolve_tree(settings).name, lookup=self.defaults.lookup
        )
        out = {
            "prompt": prompt,
            "drafter": drafter,
            "tree": tree,
            "numerics": dtype_name(self.pair(settings)[0]),
            "methods": {
                m: {"label": LABELS[m], "drafter": r.drafter, "text": r.text, "token_ids": r.tokens, **r.stats()}
                for m, r in records.items()
            },
            "sampling_match" if settings.sample else "greedy_match": {
                "equal": check.equal,
                "first_diff": check.first_diff,
                "logit_gap": check.logit_gap,
                "tie": check.tie,
                "message": check.message,
            },
            "summary": summary_rows(records),
        }
        if settings.sample:
            out["sampling"] = {
                "temperature": float(settings.temperature),
                "seed": int(settings.seed),
                "rows": self.sample_fidelity(records, settings),
            }
        return out


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
    "release_memory",
    "untrained_heads",
]
