"""A decoder's settings: one frozen dataclass, checked before a run, and the methods it runs.

``DecodeConfig.check`` raises a ``DecodeError``, one sentence that says what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .messages import InputError

METHODS = ("plain", "medusa-greedy", "medusa-typical", "medusa-sample")
# the KV caches a decoder runs on (kv.py) and how a static one's steps are made fast
CACHES = ("dynamic", "static")
CAPTURES = ("none", "compile", "cuda-graph")
# the lookup branch (lookup.py): the length used when heads ship no calibrated one (the simulated
# best of 2-4 on held-out answers), and the longest a decoder takes
DEFAULT_LOOKUP = 4
MAX_LOOKUP = 8


def is_lookup_length(n) -> bool:
    """A valid lookup-branch length: a whole number from 0 (off) to MAX_LOOKUP (booleans are not)."""
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_LOOKUP


class DecodeError(InputError):
    """Settings a decoder cannot run with. One sentence that says what to change."""


@dataclass(frozen=True)
class DecodeConfig:
    # stop after this many new tokens
    max_new_tokens: int = 128
    # 0 = greedy; plain sampling and typical acceptance use softmax(logits / T)
    temperature: float = 0.0
    # nucleus sampling for plain sampling and the sampled root
    top_p: float = 1.0
    # sampling seed (a run is reproducible)
    seed: int = 0
    # epsilon of typical acceptance (hard threshold)
    posterior_threshold: float = 0.09
    # delta of typical acceptance (entropy-dependent threshold)
    posterior_alpha: float = 0.3
    # typical: sample the root/bonus token instead of argmax (medusa-sample always samples)
    sample_root: bool = False
    stop_on_eos: bool = True
    # keep tree tokens/paths in the step records (for the inspector)
    record_detail: bool = True
    # Medusa: length of the lookup branch (n-gram proposals from the context, lookup.py); 0 = off
    lookup: int = 0
    # "dynamic": DynamicCache; "static": StaticCache and fixed-shape steps (kv.py)
    cache: str = "dynamic"

    def check(self) -> None:
        if not (1 <= self.max_new_tokens <= 32768):
            raise DecodeError(f"max_new_tokens must be between 1 and 32768 (got {self.max_new_tokens}).")
        if not (0 <= self.temperature < math.inf):
            raise DecodeError(f"temperature must be 0 (greedy) or a finite positive number (got {self.temperature}).")
        if not (0 < self.top_p <= 1):
            raise DecodeError(f"top_p must be in (0, 1] (got {self.top_p}).")
        if not (0 <= self.posterior_threshold <= 1):
            raise DecodeError(
                f"epsilon (posterior_threshold) must be between 0 and 1 (got {self.posterior_threshold})."
            )
        if not (0 <= self.posterior_alpha <= 1):
            raise DecodeError(f"delta (posterior_alpha) must be between 0 and 1 (got {self.posterior_alpha}).")
        if not is_lookup_length(self.lookup):
            raise DecodeError(
                "lookup (the lookup branch's length) must be a whole number "
                f"from 0 (off) to {MAX_LOOKUP} (got {self.lookup})."
            )
        if self.cache not in CACHES:
            raise DecodeError(f"cache must be one of {', '.join(CACHES)} (got {self.cache!r}).")
