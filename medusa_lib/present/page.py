"""Pure helpers that turn run records into what the page shows: the greedy-equality check, the
summary rows and their notes, the race-replay clock, the typical-acceptance threshold curve and
the example prompts. (The step inspector's data lives in ``inspector.py``.)
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from ..core.acceptance import typical_threshold_of_entropy
from ..core.config import DecodeConfig
from ..core.drafters import REGISTRY
from ..core.steps import first_difference
from .records import RunRecord

# how the page names each drafter of a record (Step.drafter), and "drafted by ..."
DRAFTER_NAMES = {name: cls.label for name, cls in REGISTRY.items()}
DRAFTED_BY = {name: cls.drafted_by for name, cls in REGISTRY.items()}
LABELS = {
    "plain": "Plain (greedy)",
    "medusa-greedy": "Medusa greedy",
    "medusa-typical": "Medusa typical",
    "plain-sample": "Plain (sampling)",
    "medusa-sample": "Medusa exact sampling",
}
# The reference of the speed-ups: plain greedy, or plain sampling in the sampled comparison.
PLAIN_VIEWS = ("plain", "plain-sample")
# how a sentence names the reference
REFERENCE_NAMES = {"plain": "plain greedy", "plain-sample": "plain sampling"}


@dataclass(frozen=True)
class GreedyCheck:
    equal: bool
    # first token position (0-based) where the two outputs differ
    first_diff: int | None
    plain_tokens: int
    medusa_tokens: int
    # At first_diff: greedy, top-1 minus top-2 logit; sampled, the two tokens' race scores x T
    # (set by Playground.exact_check).
    logit_gap: float | None = None
    # the gap is within floating-point noise of a tree forward vs a one-token forward
    tie: bool = False
    # Medusa exact sampling against plain sampling (same seed), not greedy against greedy
    sampled: bool = False
    # the dtype the run used ("bfloat16", "float32"): only float32 keeps both identities through near-ties
    numerics: str = ""
    # a float32 copy is loaded, so a 16-bit tie can point to it
    exact_available: bool = False

    @property
    def names(self) -> tuple[str, str]:
        return ("Medusa exact sampling", "plain sampling") if self.sampled else ("Medusa greedy", "plain greedy")

    @property
    def headline(self) -> str:
        medusa, plain = self.names
        same = (", same seed" if self.sampled else "") + (f" ({self.numerics})" if self.numerics else "")
        if self.equal:
            which = "the one token is" if self.plain_tokens == 1 else f"all {self.plain_tokens} tokens"
            return f"{medusa} = {plain}{same}: {which} identical."
        return (
            f"{medusa} differs from {plain}{same} from token {self.first_diff} on "
            f"(0-based; {self.medusa_tokens} vs {self.plain_tokens} tokens)."
        )

    @property
    def reason(self) -> str:
        if self.equal or self.logit_gap is None:
            return ""
        why = "a floating-point tie, not a bug" if self.tie else "more than floating-point noise: worth a bug report"
        if self.tie and self.numerics in ("bfloat16", "float16"):
            why += f": {self.numerics} rounding" + (
                ". Switch Numerics to float32 for the exact result" if self.exact_available else ""
            )
        # the draw is argmax(p / E): two tokens whose log p - log E nearly tie can swap
        if self.sampled:
            return (
                f"There the draw's two best candidates were {self.logit_gap:.4f} apart "
                f"(log p - log E, times T, in logit units): {why}."
            )
        return f"There the base model's two best logits differ by {self.logit_gap:.4f}: {why}."

    @property
    def message(self) -> str:
        return f"{self.headline} {self.reason}".strip()


def column_note(view: str, config: DecodeConfig, *, reference: str) -> str:
    """One line under a column's title: what it runs and how its text relates to the reference
    column's (``reference``: plain greedy, or plain sampling in the sampling mode), against which its
    speed-up is measured."""
    t, seed = config.temperature, config.seed
    ref = REFERENCE_NAMES[reference]
    if view in PLAIN_VIEWS:
        how = "one token per forward pass" + (
            f", drawn at T = {t:g} from seed {seed}" if t > 0 else ", the model's top choice"
        )
        return f"{how}: the reference of the speed-ups."
    if view == "medusa-greedy":
        return "keeps a guess only where it is the model's own top choice: exactly plain greedy's text."
    if view == "medusa-sample":
        return (
            f"draws at T = {t:g} from seed {seed} and keeps a guess only where the draw is that guess: "
            "exactly plain sampling's text."
        )
    if t <= 0:
        return "at T = 0 typical acceptance is greedy: the same text as Medusa greedy."
    return (
        f"samples at T = {t:g} from seed {seed} and keeps any guess the model finds likely enough: "
        f"not {ref}'s text (not the same output); speed-up against {ref}."
    )


def greedy_check(plain: Sequence[int], medusa: Sequence[int], *, sampled: bool = False) -> GreedyCheck:
    """Did Medusa greedy (or exact sampling) produce exactly plain greedy's (sampling's) tokens? If not, where
    do they first differ?"""
    first = first_difference(plain, medusa)
    return GreedyCheck(first is None, first, len(plain), len(medusa), sampled=sampled)


# speedup: tokens/s over plain's
SUMMARY_COLUMNS = [
    "method",
    "drafter",
    "tokens",
    "wall (s)",
    "prefill (s)",
    "tokens/s",
    "tokens/step",
    "steps",
    "speedup",
]


# how the page shows a rate summary_rows could not measure (None)
NOT_TIMED = "\u2014"


def summary_rows(records: Mapping[str, RunRecord]) -> list[dict]:
    """One row per method, in run order: wall time (prefill + decode), prefill, decode tokens/s,
    tokens/step, steps, speedup = tokens/s over plain's (plain sampling's, when the runs sampled).
    A rate that cannot be measured is None (JSON null): that of a run without decode steps, and
    the speedup when plain has none or did not run."""
    plain = next((records[v] for v in PLAIN_VIEWS if v in records), None)
    base = plain.result.tokens_per_second if plain is not None else 0.0
    rows = []
    for method in records:
        rec, r = records[method], records[method].result
        timed = r.decode_steps > 0
        rows.append(
            {
                "method": LABELS[method],
                # who drafted the trees ('' for plain decoding)
                "drafter": DRAFTER_NAMES.get(rec.drafter or "", ""),
                "tokens": len(r.tokens),
                "wall (s)": round(rec.elapsed, 3),
                "prefill (s)": round(r.prefill_seconds, 3),
                "tokens/s": round(r.tokens_per_second, 1) if timed else None,
                "tokens/step": round(r.tokens_per_step, 2) if timed else None,
                "steps": r.decode_steps,
                "speedup": round(r.tokens_per_second / base, 2) if timed and base > 0 else None,
            }
        )
    return rows


SAMPLE_COLUMNS = ["method", "tokens/step", "tokens/s", "mean log p", "mean entropy", "log p + entropy"]


def sample_rows(
    records: Mapping[str, RunRecord], scores: Mapping[str, tuple[float, float]], *, temperature: float
) -> list[dict]:
    """What typical acceptance costs, measured on this prompt: per sampled run, its speed and how
    its tokens score under the model at T (``scores``: mean log p, mean entropy per token, from
    ``Playground.sample_scores``). For a true sample from the model, mean log p = -(mean entropy)
    up to noise, so "log p + entropy" is near 0; a positive value means the run picked tokens
    likelier than a sample would: its text drifted from the model's distribution toward its mode."""
    rows = []
    for method, rec in records.items():
        if method not in scores:
            continue
        r, (logp, entropy) = rec.result, scores[method]
        timed = r.decode_steps > 0
        rows.append(
            {
                "method": LABELS[method],
                "tokens/step": round(r.tokens_per_step, 2) if timed else None,
                "tokens/s": round(r.tokens_per_second, 1) if timed else None,
                "mean log p": round(logp, 3),
                "mean entropy": round(entropy, 3),
                "log p + entropy": round(logp + entropy, 3),
            }
        )
    return rows


def why_it_ended(record: RunRecord) -> str:
    """A run's finish reason in words (for runs that ended at their prefill, where budget = 1)."""
    return {
        "length": "Max new tokens is 1",
        "eos": "the model ended its answer at once",
        "context": "the context is full",
    }.get(record.result.finish_reason, "it stopped")


def untimed_note(records: Mapping[str, RunRecord]) -> str:
    """Why some rates show NOT_TIMED: which runs ended at their prefill, and what to change ('' if none did)."""
    ended = [m for m in records if records[m].result.decode_steps == 0]
    if not ended:
        return ""
    reasons = sorted({why_it_ended(records[m]) for m in ended})
    names = ", ".join(LABELS[m] for m in ended)
    advice = (
        " Raise Max new tokens to 2 or more to measure them."
        if any(records[m].result.finish_reason == "length" for m in ended)
        else ""
    )
    return (
        f"{names} made only the prefill's token ({'; '.join(reasons)}), so there is no decode step to time: "
        f"tokens/s, tokens/step and speedup show {NOT_TIMED}.{advice}"
    )


def visible_steps(record: RunRecord, t: float) -> int:
    """How many of the record's steps had finished t seconds after its start (race replay)."""
    return bisect.bisect_right([v.elapsed for v in record.views], t)


def threshold_curve(
    *, epsilon: float, delta: float, vocab_size: int, points: int = 200
) -> tuple[np.ndarray, np.ndarray]:
    """Typical acceptance's threshold min(epsilon, delta * exp(-H)) over entropy H in [0, log V]
    (the decoders' formula)."""
    h = np.linspace(0.0, math.log(max(vocab_size, 2)), points)
    return h, typical_threshold_of_entropy(torch.from_numpy(h), epsilon=epsilon, delta=delta).numpy()


def load_examples(path: str | Path) -> list[dict]:
    """Example prompts: a JSON list of {"label", "prompt"}; [] if the file is missing or malformed."""
    try:
        items = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return (
        [e for e in items if isinstance(e, dict) and isinstance(e.get("prompt"), str)]
        if isinstance(items, list)
        else []
    )
