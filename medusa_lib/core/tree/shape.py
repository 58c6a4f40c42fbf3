"""A tree's shape: ``MedusaTree``, the static buffers of one candidate tree, and the trees built from choices.

A tree is a list of *choices*. The choice ``[r1, r2, ..., rd]`` is the node reached by
taking head-1's rank-r1 token, then head-2's rank-r2 token, and so on (Medusa paper,
arXiv 2401.10774, Sec. 2.1.2; reference code FasterDecoding/Medusa, ``medusa_choices``).
Node 0 is the root: the base model's own next token. ``build_tree`` follows the reference
``generate_medusa_buffers`` exactly (checked against its worked example and all of its presets in
the tests), with one change: padded slots of ``retrieve_indices`` stay -1 and are masked
explicitly by the decoders instead of being mapped to token id 0. A tree given by each node's
parent instead (a drafter that grows a new tree every step) is ``parents.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

import torch

from ..messages import InputError, shown

# candidates read from each head (reference TOPK)
TOPK = 10
# the "rank" of a lookup-branch node in MedusaTree.choices
LOOKUP_RANK = -1


class TreeError(InputError):
    """An impossible tree. The message is one sentence that says what to change."""


def children_tensor(children: Sequence[Sequence[int]], *, device=None) -> torch.Tensor:
    """[L, W] each node's children (tree order), -1 padded: what ``walk`` descends through."""
    width = max(1, max(map(len, children)))
    return torch.tensor([list(k) + [-1] * (width - len(k)) for k in children], dtype=torch.long, device=device)


@dataclass(frozen=True)
class TreeLevel:
    """The nodes of one depth k, for heads that propose level by level (path-conditioned heads).

    Head k runs once per *parent* (a node of depth k - 1 with children; the root for k = 1) and
    its rank-r token becomes the child with last rank r.

    ancestors [m, k-1]  tree positions of each parent's branch below the root (depth 1 .. k-1)
    nodes     [n]       tree positions of the nodes of depth k
    rows      [n]       which parent (row of ``ancestors``) each node hangs from
    ranks     [n]       the node's rank among its parent head's top tokens
    topk                ranks read from each parent's head (max rank + 1)
    """

    ancestors: torch.Tensor
    nodes: torch.Tensor
    rows: torch.Tensor
    ranks: torch.Tensor
    topk: int


@dataclass(frozen=True, eq=False)
class MedusaTree:
    """Static buffers of one tree (CPU tensors; ``to(device)`` makes a device copy).

    choices          sorted by (depth, ranks); node j >= 1 is choices[j-1]
    tree_indices     [L]  index into [root, head1 top-k, head2 top-k, ...]
    position_ids     [L]  depth of each node (root 0); add the cache length at run time
    retrieve_indices [P, D+1]  one root-to-leaf path per row, tree positions, -1 padded
    attn_mask        [L, L]  1 where node i may attend node j (root, ancestors, itself)
    lookup           the last ``lookup`` nodes are a lookup branch (:func:`with_lookup`): a chain
                     under the root filled with an n-gram match from the context, not by the heads;
                     their choices hold rank ``LOOKUP_RANK`` and their tree_indices 0
    """

    choices: tuple[tuple[int, ...], ...]
    tree_indices: torch.Tensor
    position_ids: torch.Tensor
    retrieve_indices: torch.Tensor
    attn_mask: torch.Tensor
    topk: int = TOPK
    name: str = "custom"
    # parent node of each node (root: -1)
    parents: tuple[int, ...] = field(default=())
    # trailing lookup-branch nodes (not drafted by the heads)
    lookup: int = 0

    @property
    def num_nodes(self) -> int:
        """Tree tokens verified per step, root included (L)."""
        return int(self.tree_indices.numel())

    @property
    def depth(self) -> int:
        """Deepest node = number of Medusa heads the tree needs."""
        # A list, not a generator with default=: torch.compile traces it.
        return max([0] + [len(c) for c in self.choices])

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """The child nodes of each node, in tree order (exact sampling descends through them)."""
        kids: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                kids[parent].append(node)
        return tuple(map(tuple, kids))

    @cached_property
    def levels(self) -> tuple[TreeLevel, ...]:
        """One :class:`TreeLevel` per depth 1 .. D, on the device of the tree's buffers."""
        dev = self.tree_indices.device
        # the heads fill these
        drafted = self.choices[: len(self.choices) - self.lookup]
        index = {c: j + 1 for j, c in enumerate(drafted)}
        out = []
        for k in range(1, max((len(c) for c in drafted), default=0) + 1):
            level = [c for c in drafted if len(c) == k]
            parents = sorted({c[:-1] for c in level}, key=lambda p: index.get(p, 0))
            row = {p: i for i, p in enumerate(parents)}
            out.append(
                TreeLevel(
                    ancestors=torch.tensor(
                        [[index[p[:d]] for d in range(1, k)] for p in parents], dtype=torch.long, device=dev
                    ).view(len(parents), k - 1),
                    nodes=torch.tensor([index[c] for c in level], dtype=torch.long, device=dev),
                    rows=torch.tensor([row[c[:-1]] for c in level], dtype=torch.long, device=dev),
                    ranks=torch.tensor([c[-1] for c in level], dtype=torch.long, device=dev),
                    topk=max(c[-1] for c in level) + 1,
                )
            )
        return tuple(out)

    def to(self, device: torch.device | str) -> "MedusaTree":
        return MedusaTree(
            choices=self.choices,
            tree_indices=self.tree_indices.to(device),
            position_ids=self.position_ids.to(device),
            retrieve_indices=self.retrieve_indices.to(device),
            attn_mask=self.attn_mask.to(device),
            topk=self.topk,
            name=self.name,
            parents=self.parents,
            lookup=self.lookup,
        )

    def __repr__(self) -> str:
        return (
            f"MedusaTree(name={self.name!r}, nodes={self.num_nodes}, depth={self.depth}, "
            f"paths={self.retrieve_indices.shape[0]})"
        )


def validate_choices(
    choices: Sequence[Sequence[int]], *, num_heads: int | None = None, topk: int = TOPK
) -> list[list[int]]:
    """Check a tree and return it as a list of int lists; raise TreeError with one clear sentence."""
    if choices is None or len(choices) == 0:
        raise TreeError("The tree is empty: give at least one node such as [[0]] (head-1's top token).")
    out: list[list[int]] = []
    for c in choices:
        if isinstance(c, (str, bytes)) or not isinstance(c, Sequence) or len(c) == 0:
            raise TreeError(f"Tree node {shown(c)} is not a non-empty list of ranks such as [0, 1].")
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in c):
            raise TreeError(f"Tree node {shown(list(c))} must contain whole-number ranks only.")
        out.append([int(r) for r in c])
    seen: set[tuple[int, ...]] = set()
    for c in out:
        t = tuple(c)
        if t in seen:
            raise TreeError(f"Tree node {shown(c)} appears twice; list every node once.")
        seen.add(t)
    for c in out:
        bad = [r for r in c if r < 0 or r >= topk]
        if bad:
            raise TreeError(
                f"Tree node {shown(c)} uses rank {shown(bad[0])}, but ranks must be between 0 and {topk - 1} "
                f"(top-{topk} per head)."
            )
    for c in out:
        if len(c) > 1 and tuple(c[:-1]) not in seen:
            raise TreeError(f"Tree node {shown(c)} has no parent: add {shown(c[:-1])} to the tree.")
    depth = max(len(c) for c in out)
    if num_heads is not None and depth > num_heads:
        raise TreeError(
            f"The tree is {depth} levels deep but the heads only predict {num_heads} tokens ahead; "
            f"use a tree of depth <= {num_heads}."
        )
    return out


def build_tree(
    choices: Sequence[Sequence[int]], *, num_heads: int | None = None, topk: int = TOPK, name: str = "custom"
) -> MedusaTree:
    """Build the tree-attention buffers for ``choices`` (reference ``generate_medusa_buffers``)."""
    checked = validate_choices(choices, num_heads=num_heads, topk=topk)
    nodes = sorted(checked, key=lambda x: (len(x), x))
    # tree position of each node
    index = {tuple(c): j + 1 for j, c in enumerate(nodes)}
    L = len(nodes) + 1

    attn_mask = torch.eye(L, dtype=torch.long)
    # every node sees the root
    attn_mask[:, 0] = 1
    tree_indices = torch.zeros(L, dtype=torch.long)
    position_ids = torch.zeros(L, dtype=torch.long)
    parents = [-1] + [index.get(tuple(c[:-1]), 0) for c in nodes]
    for j, c in enumerate(nodes, start=1):
        # ancestors below the root
        for d in range(1, len(c)):
            attn_mask[j, index[tuple(c[:d])]] = 1
        # token = rank c[-1] of head len(c)
        tree_indices[j] = c[-1] + topk * (len(c) - 1) + 1
        position_ids[j] = len(c)

    # Root-to-leaf paths: walk nodes from the end, skip any node already on a recorded path.
    paths: list[list[int]] = []
    on_path: set[tuple[int, ...]] = set()
    for c in reversed(nodes):
        if tuple(c) in on_path:
            continue
        paths.append([0] + [index[tuple(c[: d + 1])] for d in range(len(c))])
        on_path.update(tuple(c[: d + 1]) for d in range(len(c)))
    width = max(len(p) for p in paths)
    retrieve_indices = torch.tensor([p + [-1] * (width - len(p)) for p in paths], dtype=torch.long)

    return MedusaTree(
        choices=tuple(tuple(c) for c in nodes),
        tree_indices=tree_indices,
        position_ids=position_ids,
        retrieve_indices=retrieve_indices,
        attn_mask=attn_mask,
        topk=topk,
        name=name,
        parents=tuple(parents),
    )


def root_only_tree() -> MedusaTree:
    """The degenerate tree of the root alone: a plain decoding step (used near the context limit)."""
    zero = torch.zeros(1, dtype=torch.long)
    return MedusaTree(
        choices=(),
        tree_indices=zero,
        position_ids=zero.clone(),
        retrieve_indices=torch.zeros(1, 1, dtype=torch.long),
        attn_mask=torch.ones(1, 1, dtype=torch.long),
        name="root",
        parents=(-1,),
    )


def with_lookup(tree: MedusaTree, length: int) -> MedusaTree:
    """``tree`` plus a lookup branch: a chain of ``length`` nodes under the root, appended after the
    tree's own nodes (their positions do not move), for tokens proposed by an n-gram match in the
    context (``lookup.ngram_proposal``). Each chain node sees the root, the chain above it and
    itself; it adds one root-to-leaf path (the last row of ``retrieve_indices``, so under greedy
    acceptance ties between equally long paths go to the heads' paths; typical acceptance breaks
    ties by log-probability)."""
    if length < 1:
        return tree
    L = tree.num_nodes
    n = L + length
    attn_mask = torch.zeros(n, n, dtype=torch.long, device=tree.attn_mask.device)
    attn_mask[:L, :L] = tree.attn_mask
    chain = torch.arange(L, n, device=attn_mask.device)
    attn_mask[L:, 0] = 1
    attn_mask[L:, L:] = torch.tril(torch.ones(length, length, dtype=torch.long, device=attn_mask.device))
    ri = tree.retrieve_indices
    width = max(ri.shape[1], length + 1)
    retrieve = torch.full((ri.shape[0] + 1, width), -1, dtype=torch.long, device=ri.device)
    retrieve[:-1, : ri.shape[1]] = ri
    retrieve[-1, 0] = 0
    retrieve[-1, 1 : length + 1] = chain.to(ri.device)
    return MedusaTree(
        choices=tree.choices + tuple((LOOKUP_RANK,) * d for d in range(1, length + 1)),
        tree_indices=torch.cat(
            [tree.tree_indices, torch.zeros(length, dtype=torch.long, device=tree.tree_indices.device)]
        ),
        position_ids=torch.cat([tree.position_ids, torch.arange(1, length + 1, device=tree.position_ids.device)]),
        retrieve_indices=retrieve,
        attn_mask=attn_mask,
        topk=tree.topk,
        name=f"{tree.name}+lookup-{length}",
        parents=tree.parents + (0,) + tuple(range(L, n - 1)),
        lookup=length,
    )
