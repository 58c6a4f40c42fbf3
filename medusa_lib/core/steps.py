"""What a decoder yields: one immutable ``Step`` record per step, and a run's ``RunResult``.

The page, the benchmark and the tests all read these records; nothing else reaches inside a decoder
(DESIGN.md, "One data flow"). ``sync`` gives the device-synchronised timestamps the records hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from .draft import Credit
from .tree.shape import MedusaTree


@dataclass(frozen=True, eq=False)
class Step:
    """One decoding step. ``index`` 0 is the prefill (it yields the first token)."""

    index: int
    # new token ids committed by this step
    tokens: tuple[int, ...]
    # wall time of the step, device-synchronised
    seconds: float
    # propose / verify / accept / commit (or prefill)
    phases: Mapping[str, float] = field(default_factory=dict)
    # candidates accepted (tokens = accept_length + 1)
    accept_length: int = 0
    # of those, candidates a lookup chain copied from the context (what its draft credits: ``draft.Credit``)
    lookup_accepted: int = 0
    # the tree verified in this step (Medusa, record_detail)
    tree: MedusaTree | None = None
    # token id of each tree node, on the model's device
    tree_tokens: torch.Tensor | None = None  # [L]
    # row of tree.retrieve_indices that was accepted
    best_path: int | None = None
    # "eos" | "length" | "context" on the last step
    finish_reason: str | None = None
    # on the prefill: the cache and capture the run used, e.g. "static, cuda-graph"
    engine: str | None = None
    # who proposed the tree: its drafter's name (drafters.REGISTRY); None for plain steps
    drafter: str | None = None
    # deepest drafted position the step verified (0: the root alone, no draft; spec_metrics.py)
    draft_depth: int = 0
    # drafted tokens it verified: the tree's nodes besides the root, a lookup branch included
    draft_tokens: int = 0

    @property
    def kind(self) -> str:
        return "prefill" if self.index == 0 else "decode"

    @property
    def accepted_nodes(self) -> tuple[int, ...]:
        """Tree positions of the root and the accepted candidates."""
        if self.tree is None or self.best_path is None:
            return ()
        return tuple(self.tree.retrieve_indices[self.best_path, : self.accept_length + 1].tolist())

    @property
    def tree_token_ids(self) -> list[int]:
        return [] if self.tree_tokens is None else self.tree_tokens.tolist()

    @property
    def candidates(self) -> list[list[int]]:
        """Token ids of every root-to-leaf path (padding dropped)."""
        if self.tree is None or self.tree_tokens is None:
            return []
        toks = self.tree_token_ids
        return [[toks[j] for j in row if j >= 0] for row in self.tree.retrieve_indices.tolist()]


@dataclass(frozen=True)
class RunResult:
    """All steps of one run, with the statistics the UI and the benchmark report."""

    method: str
    steps: tuple[Step, ...]

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.steps for t in s.tokens]

    @property
    def prefill_seconds(self) -> float:
        return self.steps[0].seconds if self.steps else 0.0

    @property
    def decode_steps(self) -> int:
        return max(len(self.steps) - 1, 0)

    @property
    def decode_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.steps[1:])

    @property
    def decode_seconds(self) -> float:
        return sum(s.seconds for s in self.steps[1:])

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: tokens of the decode steps over their time (prefill excluded)."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.decode_tokens / self.decode_steps if self.decode_steps else 0.0

    @property
    def lookup_tokens(self) -> int:
        """Accepted candidates that came from the lookup branch."""
        return sum(s.lookup_accepted for s in self.steps)

    @property
    def finish_reason(self) -> str | None:
        return self.steps[-1].finish_reason if self.steps else None

    @property
    def engine(self) -> str | None:
        """The cache and capture the run used ("dynamic", "static", "static, cuda-graph", ...)."""
        return self.steps[0].engine if self.steps else None


def tree_step(
    index: int,
    tokens: Sequence[int],
    seconds: float,
    phases: Mapping[str, float],
    *,
    tree: MedusaTree,
    tree_tokens: torch.Tensor,
    nodes: Sequence[int],
    accepted: int,
    best: int,
    credit: Credit | None,
    drafter: str | None,
    reason: str | None,
    detail: bool,
) -> Step:
    """The record of one verify step, as both engines write it: ``tree`` (on the CPU) verified with
    ``tree_tokens`` [L], ``nodes`` the root and the accepted candidates (tree positions), ``accepted``
    of them accepted on row ``best``; ``tokens`` what was kept after the cut (which may drop
    candidates). ``credit``: what the draft adds to the record (``draft.Credit``: counts of the accepted
    candidates, cut where the tokens are). ``detail``: keep the tree, its tokens and the row for the inspector."""
    counts = credit(nodes[1 : accepted + 1]) if credit is not None and tokens else {}
    return Step(
        index,
        tuple(tokens),
        seconds,
        phases,
        accept_length=min(accepted, len(tokens) - 1) if tokens else 0,
        tree=tree if detail else None,
        tree_tokens=tree_tokens if detail else None,
        best_path=best if detail else None,
        finish_reason=reason,
        drafter=drafter,
        # 0 for a root-only step (no draft, or near the context limit)
        draft_depth=tree.depth,
        draft_tokens=tree.num_nodes - 1,
        **{field: min(count, len(tokens) - 1) for field, count in counts.items()},
    )


def sync(device: torch.device) -> float:
    """Timestamp after the device has finished its queued work (honest timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First position where two token sequences differ (the shorter one's length if one is a prefix
    of the other), None if they are equal: how exactness is checked everywhere."""
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return min(len(a), len(b)) if first is None and len(a) != len(b) else first


__all__ = ["RunResult", "Step", "first_difference", "sync", "tree_step"]
