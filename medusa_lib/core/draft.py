"""The contract between the verifier and a drafter: what a drafter hands a Medusa step.

The verifier (``decoding.Decoder`` and the static engine's ``fused.Program``) and the drafters
(``drafters/``, with the modules they use) both import this file and nothing of each other
(``tests/test_layout.py``), as vLLM's proposers and SGLang's draft workers meet the scheduler only
through their outputs. A drafter hands:

- to the dynamic decoder, one ``Draft`` a step from its ``DraftRun``: the tree, its tokens and
  what the draft adds to the step's record (``credit``);
- to a captured, fixed-shape step, one ``StaticDraft`` per program: its tree (``TreeBuffers``, or a
  ``NewTree`` written as parents every step), a draft function with no host read, the key that
  tells two programs apart; a drafter with a state of its own adds it (``DraftState``).

What a draft adds to its step's record (a lookup chain: how many accepted tokens it copied from
the context) passes through the verifier unread: ``credit`` maps the accepted nodes to the counts.
docs/engine.md, "Writing a drafter".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Protocol, Sequence

import torch

from .tree.masks import TreeBuffers
from .tree.shape import MedusaTree

# the accepted nodes of a step (tree positions, the root left out) -> Step fields that count them
Credit = Callable[[Sequence[int]], Mapping[str, int]]


class Draft(NamedTuple):
    """One step's proposal under the root, for the dynamic decoder."""

    # its shape (on the CPU)
    tree: MedusaTree
    # [L] token of every node, the root first
    tokens: torch.Tensor
    # the prebuilt buffers of a fixed tree (None: built for this step)
    buffers: TreeBuffers | None = None
    # what the draft adds to the step's record (None: nothing)
    credit: Credit | None = None


class DraftRun:
    """One run's drafter state. ``verified(features [n, d], tokens [n], start, rows=)``: the base model's
    features at positions start .. start + n - 1 and the token after each (the last one is the next
    root), taken from the rows ``rows`` of the latest base forward (None: all of its rows);
    ``propose(root, history=, seq_len=)``: the next Draft, or None for a root-only step; ``close()``
    when the run ends, however it ends."""

    def verified(self, features: torch.Tensor, tokens: torch.Tensor, start: int, rows=None) -> None:
        self.hidden, self.root = features[-1], tokens[-1]

    def close(self) -> None:
        pass

    def propose(self, root: torch.Tensor, *, history: torch.Tensor, seq_len: int) -> Draft | None:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class NewTree:
    """A new tree every step of a fixed size and depth, which the draft writes as parents (an EAGLE head's
    dynamic tree): ``parents`` [L] in place, each node's parent as a tree position, the root's 0, parents
    first (``tree.parents.ancestry``), at most ``depth`` levels deep, each node's children a top-``top_k``.
    ``describe(row)`` gives the tree of a parents row read back with the step, on the CPU, for the records
    (``tree.parents.tree_of_parents``)."""

    parents: torch.Tensor
    depth: int
    top_k: int
    describe: Callable[[tuple[int, ...]], MedusaTree]


@dataclass(frozen=True, eq=False)
class DraftState:
    """What a draft with a state of its own (an EAGLE head's K/V) adds to a ``StaticDraft``.

    verified(features [W, d], tokens [W], root position [1], accepted n [1])  the step tells it the accepted
             path before the draft: the features of the path's nodes from the root and the token after each
             (the first n + 1 are real);
    start(features [n, d], tokens [n])  the run's prompt, eagerly, the token after each position;
    fresh(max_len)  the same draft with a state of its own for one program, allocated for a cache of
             ``max_len`` slots before any compile or capture (a state belongs to one program).
    """

    verified: Callable
    start: Callable
    fresh: Callable[[int], "StaticDraft"]


@dataclass(frozen=True, eq=False)
class StaticDraft:
    """What a captured, fixed-shape step holds of a drafter (``fused.Program``).

    Every captured drafter gives:
        tree   the one tree every step verifies (``TreeBuffers``), or a ``NewTree`` written every step;
        draft  (hidden [d], root [1], history [H], seq_len [1]) -> (tokens [L], mark [1], live [L] or None),
               all on the device, no host read: the tree's tokens, a number the step carries back to the
               host for ``credit``, and which nodes may be accepted this step (None: all);
        key    what makes two programs the same (a program keeps it alive).
    It may add:
        dead   its draft may leave nodes dead this step (``live`` False: never accepted, as if absent);
        credit ``credit(mark)``: what the step's record adds, from the accepted nodes (``Draft.credit``);
        state  a state of its own (``DraftState``).
    """

    tree: TreeBuffers | NewTree
    draft: Callable
    key: tuple
    dead: bool = False
    credit: Callable[[int], Credit] | None = None
    state: DraftState | None = None

    @property
    def buffers(self) -> TreeBuffers | None:
        """The fixed tree's buffers (None: a new tree every step)."""
        return self.tree if isinstance(self.tree, TreeBuffers) else None

    @property
    def num_nodes(self) -> int:
        """L, tree tokens verified per step."""
        return self.tree.num_nodes if isinstance(self.tree, TreeBuffers) else self.tree.parents.numel()

    @property
    def depth(self) -> int:
        return self.tree.depth


class Proposer(Protocol):
    """What the verifier asks of a drafter (``drafters.Drafter``): ``bind(decoder)`` a copy placed on a
    decoder's devices, whose ``open()`` starts one run's ``DraftRun`` and whose ``static(decoder)`` gives
    its ``StaticDraft`` (None: the dynamic cache only, said by ``static_note``). ``depth``: its deepest
    node; ``buffers``: its fixed tree (None: a new tree every step); ``name``: who drafted, in the records."""

    name: str
    static_note: str
    depth: int
    buffers: TreeBuffers | None

    def bind(self, dec) -> "Proposer": ...

    def open(self) -> DraftRun: ...

    def static(self, dec) -> StaticDraft | None: ...


def no_context(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    """A static draft's result with nothing for the record and no node dead: (tokens, mark [1] = 0, None)."""
    return tokens, torch.zeros(1, dtype=torch.long, device=tokens.device), None


__all__ = ["Credit", "Draft", "DraftRun", "DraftState", "NewTree", "Proposer", "StaticDraft", "no_context"]
