"""Acceptance as serving engines report it: the mean acceptance length and the acceptance rate per draft position.

A *draft* is a decode step that verified drafted tokens under its root; a step of the root alone (a
lookup drafter that found no match, a step near the context limit, plain decoding) is not one. With
a_s the drafted tokens accepted on draft s, over the drafts:

    mean acceptance length      1 + sum_s a_s / drafts            (the bonus token counted)
    acceptance rate at i        #{s: a_s >= i} / drafts,  i = 1 .. D (the deepest position it can draft)
    given the one before        #{s: a_s >= i} / #{s: a_s >= i - 1}  (drafts at i = 1)
    draft acceptance rate       sum_s a_s / drafted tokens        (a tree's every node is a drafted token)

so the mean acceptance length is 1 + the sum of the per-position rates. These are vLLM's
(vllm/v1/spec_decode/metrics.py: ``SpecDecodingStats.observe_draft`` counts a draft's accepted
tokens into positions 0 .. a_s - 1; ``SpecDecodingLogging.log`` prints "Mean acceptance length"
1 + accepted / num_drafts, "Per-position acceptance rate" accepted_per_pos / num_drafts and "Avg
Draft acceptance rate" accepted / draft tokens; its scheduler observes only requests that drafted).
SGLang's "accept len" (accepted + 1 per verify, over verifies) is the mean acceptance length when
every step drafts; llama.cpp's "draft acceptance rate" (accepted / generated drafted tokens) is the
draft acceptance rate. An accepted path is a chain, so in a tree position i is depth i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Acceptance:
    """The counts behind the rates (they add up over runs).

    steps        full decode steps counted (a run's last, cut step is not: the cut may drop accepted tokens)
    drafts       of those, the steps that verified a draft (vLLM's num_drafts)
    accepted     drafted tokens accepted on the drafts (num_accepted_tokens)
    drafted      drafted tokens verified on the drafts (num_draft_tokens); None where not recorded
    accepted_at  [D] drafts whose accepted path reached position i = 1 .. D (num_accepted_tokens_per_pos)
    """

    steps: int
    drafts: int
    accepted: int
    drafted: int | None
    accepted_at: tuple[int, ...]

    @property
    def depth(self) -> int:
        return len(self.accepted_at)

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens a drafting step makes (None: no draft)."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def rates(self) -> tuple[float, ...]:
        """Per position i = 1 .. D, the share of drafts that accepted >= i drafted tokens."""
        return tuple(n / self.drafts for n in self.accepted_at) if self.drafts else ()

    @property
    def given_previous(self) -> tuple[float | None, ...]:
        """Per position, accepted at i given accepted at i - 1 (None where no draft reached i - 1)."""
        if not self.drafts:
            return ()
        before = (self.drafts, *self.accepted_at[:-1])
        return tuple(n / b if b else None for n, b in zip(self.accepted_at, before))

    @property
    def draft_acceptance_rate(self) -> float | None:
        """accepted / drafted tokens (llama.cpp's "draft acceptance rate", vLLM's "Avg Draft acceptance rate")."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def drafted_share(self) -> float | None:
        """Share of the steps that drafted."""
        return self.drafts / self.steps if self.steps else None

    def as_dict(self, digits: int = 4) -> dict:
        """The counts and the rates, for a JSON file."""

        def r(x):
            return None if x is None else round(x, digits)

        return {
            "steps": self.steps,
            "drafts": self.drafts,
            "accepted_tokens": self.accepted,
            "draft_tokens": self.drafted,
            "accepted_tokens_per_position": list(self.accepted_at),
            "mean_acceptance_length": r(self.mean_acceptance_length),
            "acceptance_rate_per_position": [r(x) for x in self.rates],
            "acceptance_rate_given_previous": [r(x) for x in self.given_previous],
            "draft_acceptance_rate": r(self.draft_acceptance_rate),
        }


def acceptance(
    accept_lengths: Sequence[int],
    draft_depths: Sequence[int] | None = None,
    draft_tokens: Sequence[int] | None = None,
    *,
    depth: int | None = None,
) -> Acceptance:
    """The acceptance of full decode steps: ``accept_lengths[s]`` drafted tokens accepted on step s,
    ``draft_depths[s]`` its deepest drafted position (0: no draft), ``draft_tokens[s]`` the drafted
    tokens it verified. Without ``draft_depths`` every step counts as a draft (SGLang's count; the
    bench's records before the depths were recorded). Positions 1 .. D are reported, D the deepest
    draft (else the longest accepted path) or ``depth`` when deeper: the deepest position the drafter
    can reach (``draft_positions``), as vLLM's per-position counters run to num_speculative_tokens."""
    a = [int(x) for x in accept_lengths]
    d = [int(x) for x in draft_depths] if draft_depths is not None else None
    t = [int(x) for x in draft_tokens] if draft_tokens is not None else None
    if (d is not None and len(d) != len(a)) or (t is not None and len(t) != len(a)):
        raise ValueError("accept_lengths, draft_depths and draft_tokens must hold one number per step each.")
    drafted = [i for i in range(len(a)) if d is None or d[i] > 0]
    if any(a[i] < 0 or (d is not None and a[i] > d[i]) for i in range(len(a))):
        raise ValueError("A step accepts between 0 and its draft's depth of drafted tokens.")
    depth = max(depth or 0, max(d, default=0) if d is not None else max(a, default=0))
    return Acceptance(
        steps=len(a),
        drafts=len(drafted),
        accepted=sum(a[i] for i in drafted),
        drafted=sum(t[i] for i in drafted) if t is not None else None,
        accepted_at=tuple(sum(a[i] >= k for i in drafted) for k in range(1, depth + 1)),
    )


def step_lists(steps: Iterable) -> dict[str, list[int]]:
    """Per full decode step of a run (``Step`` records: not the prefill, not a last step that was cut),
    what ``acceptance`` reads: {"accept_lengths", "draft_depths", "draft_tokens"}."""
    full = [s for s in steps if s.index > 0 and s.finish_reason is None]
    return {
        "accept_lengths": [s.accept_length for s in full],
        "draft_depths": [s.draft_depth for s in full],
        "draft_tokens": [s.draft_tokens for s in full],
    }


def step_acceptance(steps: Iterable, *, depth: int | None = None) -> Acceptance:
    """The acceptance of a run's ``Step`` records (its full decode steps); ``depth`` as ``acceptance``'s."""
    return acceptance(**step_lists(steps), depth=depth)


def draft_positions(decoder) -> int:
    """The deepest draft position a ``Decoder``'s steps can reach (``Drafter.positions``: its depth,
    or its lookup chain's length when that is longer; 0 for plain decoding)."""
    drafter = getattr(decoder, "drafter", None)
    return drafter.positions if drafter is not None else 0


def format_rates(rates: Sequence[float | None], *, sep: str = " / ") -> str:
    """Rates as the page and the bench print them: two decimals, "-" where undefined."""
    return sep.join("-" if x is None else f"{x:.2f}" for x in rates)


__all__ = ["Acceptance", "acceptance", "draft_positions", "format_rates", "step_acceptance", "step_lists"]
