"""A tree given by each node's parent: what a drafter that grows a new tree every step (EAGLE-2's dynamic tree)
hands the verifier, and what a captured step that verifies such trees rebuilds on the device.

``parents`` [L] holds each node's parent as a tree position (the root's 0), parents before children.
``ancestry`` and ``children_of`` are tensor ops of fixed shapes (no host read); ``tree_of_parents`` is the same
tree as a ``MedusaTree`` on the host, for the step records and the page.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from .shape import LOOKUP_RANK, MedusaTree


def ancestry(parents: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tree given by each node's parent (``parents`` [L], tree positions, the root's 0, parents before
    children, at most ``depth`` levels below the root) -> (seen [L, L] bool: node i sees j (the root, its
    ancestors, itself), position_ids [L]: each node's depth, retrieve_indices [L, depth + 1]: the path
    from the root to every node, -1 padded). Tensor ops of fixed shapes: the dynamic tree's draft and a
    captured step that verifies a new tree every step (``fused.Program``) build it the same way."""
    L, dev = parents.numel(), parents.device
    seen = torch.eye(L, dtype=torch.bool, device=dev)
    seen[:, 0] = True
    # after d rounds every row holds its ancestors up to d levels up
    for _ in range(depth):
        seen = seen | seen[parents]
    order = torch.arange(L, device=dev)
    # ancestors in level order, depth + 1 columns (a tree of fewer nodes than levels: padded)
    paths = torch.sort(torch.where(seen, order, L), dim=1).values[:, : depth + 1]
    if paths.shape[1] < depth + 1:
        paths = torch.cat([paths, torch.full((L, depth + 1 - L), L, dtype=paths.dtype, device=dev)], dim=1)
    return seen, seen.sum(1) - 1, torch.where(paths == L, -1, paths)


def children_of(parents: torch.Tensor) -> torch.Tensor:
    """[L, L - 1] each node's children in tree order, -1 padded (exact sampling's walk), from ``parents``
    [L] as ``ancestry`` takes them; tensor ops of fixed shapes (``shape.children_tensor`` on the host)."""
    L, dev = parents.numel(), parents.device
    node = torch.arange(L, device=dev)
    # i is the parent of j (the root is nobody's child)
    child = (parents[None, :] == node[:, None]) & (node[None, :] > 0)
    width = max(1, L - 1)
    # each child's rank among its siblings; everything else lands in a spare column, dropped
    slot = torch.where(child, child.long().cumsum(1) - 1, width)
    out = torch.full((L, width + 1), -1, dtype=torch.long, device=dev)
    return out.scatter(1, slot, torch.where(child, node[None, :], -1))[:, :width]


@lru_cache(maxsize=1024)
def tree_of_parents(
    parents: tuple[int, ...], *, width: int, top_k: int, lookup: int = 0, name: str = "eagle-dynamic"
) -> MedusaTree:
    """The tree of ``parents`` (as ``ancestry`` takes them, on the host) as a ``MedusaTree`` on the CPU,
    with ``width`` path columns (depth + 1); its last ``lookup`` nodes are a lookup chain. A node's
    "choice" is its path of sibling ranks (rank = order among its parent's kept children, which is the
    drafter's value order). Trees repeat, so each one is built once."""
    choices: list[tuple[int, ...]] = [()]
    # each node's path from the root (``ancestry`` on the device; plain Python here: no tensor op per step)
    paths: list[list[int]] = [[0]]
    kids = [0] * len(parents)
    start = len(parents) - lookup
    for j in range(1, len(parents)):
        p = parents[j]
        choices.append((LOOKUP_RANK,) * (j - start + 1) if j >= start else choices[p] + (kids[p],))
        paths.append(paths[p] + [j])
        kids[p] += 1
    seen = [set(path) for path in paths]
    position_ids = torch.tensor([len(path) - 1 for path in paths])
    retrieve = torch.tensor([path + [-1] * (width - len(path)) for path in paths])
    attn = torch.tensor([[int(i in row) for i in range(len(parents))] for row in seen])
    return MedusaTree(
        choices=tuple(choices[1:]),
        tree_indices=torch.tensor([0] * len(parents)),
        position_ids=position_ids,
        retrieve_indices=retrieve,
        attn_mask=attn,
        topk=top_k,
        name=f"{name}+lookup-{lookup}" if lookup else name,
        parents=(-1, *parents[1:]),
        lookup=lookup,
    )
