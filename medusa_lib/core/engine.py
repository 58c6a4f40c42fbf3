"""Which engine a model decodes with: the cache of every run and, with a capture, the StaticKV runs share.

``resolve_engine`` turns ``auto`` and the operator's flags into (cache, capture), or refuses a pair
that cannot run on the device in one sentence (``EngineError``), cheaply, before a model loads;
``prepare_engine`` builds the shared ``kv.StaticKV`` for a loaded model (or says why it falls back);
``kv.describe_engine`` says it in words. docs/engine.md,
"The KV cache: dynamic or static, and captured steps".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .config import CACHES, CAPTURES
from .kv import StaticKV, describe_engine
from .messages import InputError, cause
from .model import CACHE_DIR, input_device, model_name
from .packing import is_prepacked


class EngineError(InputError):
    """An engine setting that cannot run. One sentence that says what to change."""


def default_engine(device: torch.device | str) -> tuple[str, str]:
    """(cache, capture) for ``auto``: on CUDA a static cache whose every step shape is compiled by
    Inductor and recorded as one CUDA graph (``compile``; a shape whose compile fails replays its
    eager kernels instead); on a CPU today's dynamic cache, eager (measured faster there:
    docs/performance.md#static-cache-and-capture-on-cpu)."""
    return ("static", "compile") if torch.device(device).type == "cuda" else ("dynamic", "none")


def static_refusal(model: nn.Module) -> str | None:
    """Why the static path cannot run this model (one sentence), or None when it can."""
    name = model_name(model)
    devices = {str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
    if len(devices) > 1:
        return (
            f"{name} is spread over several devices (device_map), and a static cache with captured steps "
            "needs one device; it runs with the dynamic cache."
        )
    if not getattr(model.config.get_text_config(decoder=True), "num_hidden_layers", None):
        return (
            f"{name}'s config does not give num_hidden_layers, which the static cache is sized by; "
            "it runs with the dynamic cache."
        )
    return None


@dataclass(frozen=True)
class Engine:
    """What a server or a benchmark decodes with: the cache of every run and, with a capture, the
    StaticKV that runs of the loaded model share one at a time."""

    cache: str
    static_kv: StaticKV | None
    # for the info line: the engine, or the sentence saying why it fell back
    description: str


def resolve_engine(device: torch.device, *, cache: str = "auto", capture: str = "auto") -> tuple[str, str]:
    """(cache, capture) for a model on ``device``: ``auto`` resolved (``default_engine``), a pair that
    cannot run there refused with one sentence (EngineError). Cheap: a server checks its flags with it
    before it loads the model."""
    auto_cache, auto_capture = default_engine(device)
    cache = auto_cache if cache in ("auto", "", None) else cache
    capture = (auto_capture if cache == "static" else "none") if capture in ("auto", "", None) else capture
    if cache not in CACHES or capture not in CAPTURES:
        raise EngineError(
            f"The engine must be a cache of {', '.join(CACHES)} and a capture of {', '.join(CAPTURES)} "
            f"(got {cache!r}, {capture!r})."
        )
    if capture == "cuda-graph" and torch.device(device).type != "cuda":
        raise EngineError("CUDA-graph capture needs a GPU; use --capture none or compile on a CPU.")
    if cache == "dynamic" and capture != "none":
        raise EngineError(
            f"A {capture} capture records fixed-shape steps, which only the static cache has; "
            "use --cache static or --capture none."
        )
    return cache, capture


def prepare_engine(
    model: nn.Module,
    *,
    cache: str = "auto",
    capture: str = "auto",
    max_len: int,
    say: Callable[[str], None] = lambda msg: None,
) -> Engine:
    """Resolve ``auto`` (``default_engine``) and, with a capture, build the shared StaticKV of
    ``max_len`` slots (the longest prompt + new tokens + the widest step). Each decoder's whole-step programs
    (fused.py) are captured before its first run on it (``static_run.ready``; servers and the bench
    warm every method up at start, so no timed run captures). A model the static path refuses
    falls back with one sentence said; a capture that fails gives that run the dynamic cache."""
    dev = input_device(model)
    cache, capture = resolve_engine(dev, cache=cache, capture=capture)
    # the fallback's sentence is what the info line shows
    note = static_refusal(model) if cache == "static" else None
    if note:
        cache, capture = "dynamic", "none"
    elif capture == "compile" and is_prepacked(model):
        # inductor cannot lower oneDNN's opaque packed weights
        note = (
            "torch.compile cannot compile the pre-packed CPU weights (packing.py); runs use the static cache eagerly "
            "(load the model with prepack=False, bench --no-prepack, to compile)."
        )
        capture = "none"
    if capture == "none":
        description = note or describe_engine(cache, "none")
        say(note or f"Engine: {description}.")
        return Engine(cache, None, description)
    if capture == "compile":
        # Inductor's kernels and graphs on disk beside the model's cache, so a later start reuses them (too late
        # once anything in this process has compiled: Inductor fixes its folder at its first use).
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(CACHE_DIR / "inductor"))
    try:
        kv = StaticKV(model, max_len=max_len, capture=capture)
        kv.bind()
    except Exception as e:
        # a model or platform the static cache cannot handle: said once
        # on a GPU eager static steps cost more than dynamic ones
        cache = "dynamic" if dev.type == "cuda" else "static"
        note = f"The {capture} engine failed ({cause(e, 120)}), so runs use the {cache} cache eagerly."
        say(note)
        return Engine(cache, None, note)
    description = describe_engine("static", capture, device=dev)
    say(f"Engine: {description}.")
    return Engine("static", kv, description)
