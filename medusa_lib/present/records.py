"""A run as the page sees it: immutable records made after every step, and the text of each token.

``Playground.run_method`` wraps each decoder ``Step`` into ``Piece``s (one per token, with its
text and where it came from), a ``StepView`` and a new ``RunRecord``, sent as an ``Event``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.steps import RunResult, Step


@dataclass(frozen=True)
class Piece:
    """One generated token as the page shows it."""

    token_id: int
    # decoded text this token adds ('' for special tokens or a partial UTF-8 byte)
    text: str
    # "base": the model's own token (prefill, plain step, Medusa root/bonus); "head": an accepted head
    # proposal; "lookup": an accepted lookup-branch token
    origin: str
    step: int


@dataclass(frozen=True)
class StepView:
    """A Step plus what the page needs around it."""

    step: Step
    pieces: tuple[Piece, ...]
    # device-synchronised seconds from the start of the prefill to the end of this step
    elapsed: float
    # tokens in the KV cache before this step's tree (prompt + committed - root)
    prefix_len: int


@dataclass(frozen=True)
class RunRecord:
    """One method's run so far (immutable; a new one is made after every step)."""

    method: str
    prompt_ids: tuple[int, ...]
    views: tuple[StepView, ...] = ()
    done: bool = False
    # who drafted its trees: a registered drafter's name ("medusa", "eagle", ...), None (plain decoding)
    drafter: str | None = None
    # what the column runs, in one line (page.column_note): shown under its title, in the run and the replay
    note: str = ""

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def result(self) -> RunResult:
        return RunResult(self.method, tuple(v.step for v in self.views))

    @property
    def tokens(self) -> list[int]:
        return [p.token_id for v in self.views for p in v.pieces]

    @property
    def pieces(self) -> list[Piece]:
        return [p for v in self.views for p in v.pieces]

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)

    @property
    def elapsed(self) -> float:
        return self.views[-1].elapsed if self.views else 0.0

    def stats(self) -> dict:
        r = self.result
        return {
            "tokens": len(r.tokens),
            "wall_seconds": round(self.elapsed, 4),
            "prefill_seconds": round(r.prefill_seconds, 4),
            "decode_seconds": round(r.decode_seconds, 4),
            # null: only the prefill ran, nothing to time
            "tokens_per_second": round(r.tokens_per_second, 2) if r.decode_steps else None,
            "tokens_per_step": round(r.tokens_per_step, 3) if r.decode_steps else None,
            "steps": r.decode_steps,
            "lookup_tokens": r.lookup_tokens,
            "finish_reason": r.finish_reason,
        }


@dataclass(frozen=True)
class Event:
    # "start" | "step" | "end"
    kind: str
    method: str
    record: RunRecord


class Detokenizer:
    """Token ids -> text pieces, one token at a time (decode the whole answer, emit the new suffix)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        # an incomplete UTF-8 sequence: wait for its next byte
        if text.endswith("\ufffd"):
            return ""
        common = len(self.text) if text.startswith(self.text) else len(_common_prefix(self.text, text))
        piece, self.text = text[common:], text
        return piece


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def origins(step: Step) -> list[str]:
    """Per token of a step: its accepted candidates first ("draft": the drafter's proposals, or
    "lookup": the lookup branch's tokens when that path won), then the base model's bonus token."""
    n = len(step.tokens)
    accepted = min(step.accept_length, n)
    return ["lookup" if step.lookup_accepted else "draft"] * accepted + ["base"] * (n - accepted)
