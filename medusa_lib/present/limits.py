"""What one call may take on this server: the checks that stop a run, and the longest prompt.

A run is asked between two decode steps whether to go on (a ``StopCheck``): a cancelled call, a
client gone, or the wall-time bound (``deadline``). The longest prompt is a fixed figure per kind
of device (``default_prompt_tokens``; docs/serving.md gives the figure's history), and the shared
static cache is sized by it (``static_length``).
"""

from __future__ import annotations

import time
from typing import Callable

from ..core.config import MAX_LOOKUP
from ..core.device import device_name
from ..core.model import input_device, model_info
from .settings import MAX_TREE_NODES

# between two decode steps: None to go on, or the sentence that ends the run (RunStopped)
StopCheck = Callable[[], "str | None"]


def deadline(
    seconds: float | None,
    *,
    start: float | None = None,
    what: str = "run",
    advice: str = "ask for fewer new tokens or send a shorter prompt",
) -> StopCheck:
    """A check that ends a run ``seconds`` after ``start`` (now): the server's bound on one call's wall time.
    ``what`` ended and ``advice``, what to change, make its sentence (a replay: a faster replay speed)."""
    if seconds is None:
        return lambda: None
    end = (time.perf_counter() if start is None else start) + seconds
    why = (
        f"The {what} was stopped after {seconds:g} s, the most this server gives one call "
        f"(MEDUSA_MAX_RUN_SECONDS); {advice}."
    )
    return lambda: why if time.perf_counter() > end else None


def any_of(*checks: StopCheck | None) -> StopCheck:
    """The first reason any of ``checks`` gives to stop."""
    live = [c for c in checks if c is not None]
    return lambda: next((why for why in (c() for c in live) if why), None)


# the longest prompt a server on this kind of device takes, unless its operator sets one; others: the model's context
PROMPT_TOKENS = {"cpu": 2048}
# prompts the shared static cache holds; a longer prompt's run gets a cache of its own
SHARED_PROMPT_TOKENS = 2048


def default_prompt_tokens(model) -> tuple[int | None, str]:
    """(the longest prompt a server takes, what its message says about that limit): a fixed figure per
    kind of device, the same at every start. A long prompt is prefilled three times a run (once per
    method) and every decode step then attends over it, so this keeps one paste from holding a CPU
    for minutes. The CPU's figure is what a few cores prefill in seconds; it is fixed because a
    start-up measurement varied with the machine's load (docs/serving.md). A GPU prefills the whole
    context of these models in well under a second: None, its context decides. None too where the
    context is shorter than the figure."""
    dev = input_device(model)
    limit = PROMPT_TOKENS.get(dev.type)
    if limit is None or limit >= model_info(model).context_limit:
        return None, "the model's context"
    return limit, f"the fixed limit of a server on a {device_name(dev)}, which prefills the prompt once per method"


def static_length(model, max_prompt_tokens: int | None, max_new_tokens_limit: int) -> int:
    """Slots of the shared static cache: the longest prompt this server takes plus the most new
    tokens, within the context, plus the widest step (a longer run gets a cache of its own)."""
    limit = model_info(model).context_limit
    # every step attends over the whole static length: keep it modest
    prompt = min(max_prompt_tokens or limit, SHARED_PROMPT_TOKENS)
    return min(limit, prompt + max_new_tokens_limit) + MAX_TREE_NODES + 1 + MAX_LOOKUP
