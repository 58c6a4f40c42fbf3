"""EAGLE-2's dynamic draft tree (arXiv 2406.16858, Sec. 4; reference SafeAILab/EAGLE ``topK_genrate``).

The drafter proposes level by level. Level 1 is the drafter's top-k after the root; at every
deeper level the k frontier nodes with the highest *cumulative* draft log-probability
(log q(x_1) + ... + log q(x_d), the "value" of a node) are expanded by their own top-k, and the
best k of those k*k children become the next frontier. After the last level, the best
``num_nodes`` of all drafted candidates form the tree that the base model verifies.

Every shape here is fixed by (top_k, depth, num_nodes), never by the data: candidates
[k + (depth-1) k^2], the tree [num_nodes + 1], its mask [L, L], retrieve_indices [L, depth + 1]
(one row per node: the path from the root to it, -1 padded). Selection, parents, mask, depths and
paths are computed with tensor ops only (top-k, sort, searchsorted, gathers), so a device keeps
them without a host read and a captured verify step can take them as buffers. Only the step
record (``MedusaTree``: choices and parents, for the page and exact sampling's walk) reads the
small parent vector back.

A child's value is its parent's plus a log-probability <= 0, and every candidate's key subtracts
``DEPTH_PENALTY`` per level, so a parent always ranks strictly above its children: the best
``num_nodes`` candidates are always a tree (the parent of a kept node is kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .messages import InputError
from .tree.parents import ancestry, tree_of_parents
from .tree.shape import MedusaTree

# keeps ties (a log-probability of exactly 0) from ranking a child above its parent
DEPTH_PENALTY = 1e-4


class DynamicTreeError(InputError):
    """A dynamic tree that cannot be built. One sentence that says what to change."""


@dataclass(frozen=True)
class DynamicTreeConfig:
    # children drafted per expanded node, and nodes expanded per level
    top_k: int = 8
    # levels below the root (draft forwards per step after the first)
    depth: int = 5
    # nodes verified per step besides the root (fixed: one verify shape)
    num_nodes: int = 24

    def check(self) -> None:
        if not (1 <= self.top_k <= 32):
            raise DynamicTreeError(f"The dynamic tree's top-k must be between 1 and 32 (got {self.top_k}).")
        if not (1 <= self.depth <= 12):
            raise DynamicTreeError(f"The dynamic tree's depth must be between 1 and 12 (got {self.depth}).")
        most = self.top_k + (self.depth - 1) * self.top_k**2
        if not (1 <= self.num_nodes <= min(most, 128)):
            raise DynamicTreeError(
                f"The dynamic tree keeps between 1 and {min(most, 128)} nodes "
                f"with top-k {self.top_k} and depth {self.depth} (got {self.num_nodes})."
            )

    @property
    def num_candidates(self) -> int:
        return self.top_k + (self.depth - 1) * self.top_k**2


class Candidates(NamedTuple):
    """Everything the drafter proposed in one step, level after level (fixed shapes)."""

    # token id of each candidate
    tokens: torch.Tensor  # [C]
    # cumulative draft log-probability (float32)
    scores: torch.Tensor  # [C]
    # candidate index of each one's parent, -1 for the root's children
    parents: torch.Tensor  # [C]
    # level of each candidate (1 = child of the root)
    depths: torch.Tensor  # [C]


class DynamicTree(NamedTuple):
    """The verified tree of one step, on the drafter's device."""

    # root, then the kept candidates in level order
    tokens: torch.Tensor  # [L]
    # tree position of each node's parent (root: 0)
    parents: torch.Tensor  # [L]
    # long, 1 where node i sees node j (root, ancestors, itself)
    attn_mask: torch.Tensor  # [L, L]
    # depth of each node
    position_ids: torch.Tensor  # [L]
    # path from the root to every node, -1 padded
    retrieve_indices: torch.Tensor  # [L, depth + 1]


def expand_level(
    scores: torch.Tensor, logp: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One level of EAGLE-2's expansion: frontier values ``scores`` [k] and the drafter's log-probs
    [k, V] after each frontier node -> (children columns [k*k], children values [k*k], chosen [k]:
    the k best children (indices into the k*k), row of each chosen child's parent [k])."""
    top = torch.topk(logp, top_k, dim=-1)
    # cumulative log q of every child
    values = (scores[:, None] + top.values).flatten()
    chosen = torch.topk(values, top_k).indices
    return top.indices.flatten(), values, chosen, torch.div(chosen, top_k, rounding_mode="floor")


def select_tree(root: torch.Tensor, cand: Candidates, *, num_nodes: int, depth: int) -> DynamicTree:
    """Keep the best ``num_nodes`` candidates (by value, a parent always first) and build the tree
    buffers: tokens, parents, mask, positions and paths, all with fixed shapes."""
    dev = cand.tokens.device
    key = cand.scores - DEPTH_PENALTY * cand.depths.to(cand.scores.dtype)
    # level order: parents before children
    kept = torch.sort(torch.topk(key, num_nodes).indices).values
    parent_cand = cand.parents[kept]
    # tree position of each kept node's parent: 1 + its rank among the kept, 0 for the root
    parent_pos = torch.where(
        parent_cand >= 0, torch.searchsorted(kept, parent_cand.clamp(min=0)) + 1, torch.zeros_like(parent_cand)
    )
    parents = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), parent_pos])
    seen, position_ids, retrieve = ancestry(parents, depth)
    return DynamicTree(
        tokens=torch.cat([root.view(1).to(dev), cand.tokens[kept]]),
        parents=parents,
        attn_mask=seen.long(),
        position_ids=position_ids,
        retrieve_indices=retrieve,
    )


def as_medusa_tree(tree: DynamicTree, *, top_k: int, name: str = "eagle-dynamic") -> MedusaTree:
    """The step's tree as a ``MedusaTree`` (on the CPU), the value verify, accept, commit and the step
    records share (``tree_of_parents``)."""
    return tree_of_parents(
        tuple(tree.parents.cpu().tolist()), width=tree.retrieve_indices.shape[1], top_k=top_k, name=name
    )
