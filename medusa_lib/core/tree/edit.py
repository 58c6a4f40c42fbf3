"""Editing a tree by hand, as the Tree lab's editor does: the node the greedy tree would add next, a tree's
leaves, and a tree without one of them. Each returns the choices in ``build_tree``'s order and refuses an
impossible edit in one sentence (``TreeError``)."""

from __future__ import annotations

from typing import Iterable, Sequence

from .design import path_probability
from .shape import TOPK, TreeError, validate_choices


def _sorted(choices: Iterable[Sequence[int]]) -> list[list[int]]:
    # build_tree's order
    return sorted((list(c) for c in choices), key=lambda c: (len(c), c))


def add_best_node(
    choices: Sequence[Sequence[int]], accuracy: Sequence[Sequence[float]], *, num_heads: int | None = None
) -> list[list[int]]:
    """``choices`` plus the frontier node (a child of the root or of a node, not yet in the tree)
    whose path has the largest product of accuracies: the next node the greedy tree would add
    (ties go to the smaller ranks, as in ``greedy_choices``). An empty ``choices`` gets head 1's best node."""
    have = {tuple(c) for c in (validate_choices(choices, num_heads=num_heads) if choices else [])}
    depth = min(len(accuracy), num_heads) if num_heads is not None else len(accuracy)
    frontier = [
        p + (r,)
        for p in [()] + sorted(have)
        if len(p) < depth
        for r in range(min(TOPK, len(accuracy[len(p)])))
        if p + (r,) not in have
    ]
    if not frontier:
        raise TreeError(
            "Every node the heads can propose is already in the tree; remove a leaf or start from a smaller preset."
        )
    best = min(frontier, key=lambda c: (-path_probability(c, accuracy), list(c)))
    return _sorted([*have, best])


def leaves(choices: Sequence[Sequence[int]]) -> list[list[int]]:
    """The nodes of a tree with no child, in tree order."""
    nodes = {tuple(c) for c in validate_choices(choices)}
    parents = {c[:-1] for c in nodes}
    return _sorted(c for c in nodes if c not in parents)


def remove_leaf(choices: Sequence[Sequence[int]], leaf: Sequence[int]) -> list[list[int]]:
    """``choices`` without ``leaf``, which must be a node with no child; a tree keeps one node at least."""
    leaf = list(leaf)
    nodes = validate_choices(choices)
    if leaf not in nodes:
        raise TreeError(f"Node {leaf} is not in the tree; pick one of its leaves.")
    if leaf not in leaves(nodes):
        raise TreeError(f"Node {leaf} has children; remove them first, or pick a leaf.")
    if len(nodes) == 1:
        raise TreeError("A tree keeps at least one node; add another before removing this one.")
    return _sorted(c for c in nodes if c != leaf)
