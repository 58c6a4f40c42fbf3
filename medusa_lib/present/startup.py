"""A Playground from names (``Playground.load``): the model, the Medusa heads' folder, each drafter's option,
the device, the numerics and the engine, as the app's flags give them.

Every file that can be read without the model is read first (``drafter_files.py``), so a damaged one is said
in seconds; then the model loads (with a float32 copy where memory allows), the heads and every drafter
load for each copy, the engine is prepared (a capture compiled or recorded here, never in a run), the
start-up machine fit runs (``fit.py``) and a compiled engine may be left to build between runs
(``compiling.py``).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Self

from ..core.device import resolve_device
from ..core.engine import prepare_engine, resolve_engine
from ..core.file_checks import model_sizes
from ..core.hub_gguf import weights_note
from ..core.model import input_device, load_model, model_config_file
from .compiling import pending_engine
from .drafter import DRAFTERS
from .drafter_files import SHIPPED_HEADS, check_files, check_options, load_drafters, load_medusa, untrained_heads
from .fit import fit_playground
from .limits import default_prompt_tokens, static_length
from .numerics import decode_speeds, dtype_name, free_memory
from .settings import MAX_NEW_TOKENS_LIMIT


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


class Startup:
    """The Playground's start-up (a mixin): ``load`` builds one from names, through its constructor, then
    fits it to this machine and warms its first view's steps."""

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
    ) -> Self:
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
        offered are the core's registry, each loaded for every copy (``drafter_files.load_drafters``).
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


__all__ = ["Startup", "heads_folder"]
