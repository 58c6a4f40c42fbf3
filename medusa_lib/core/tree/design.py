"""Tree design: which nodes a tree should hold. Chains, cartesian products of top-k's, and the paper's greedy
tree from measured head accuracies, with the tokens per step a tree is expected to give."""

from __future__ import annotations

import heapq
from typing import Sequence

from .shape import TOPK, TreeError


def chain_choices(depth: int) -> list[list[int]]:
    """Top-1 chain: head-1 top token, then head-2 top token, ... (depth nodes)."""
    if depth < 1:
        raise TreeError("A chain tree needs depth >= 1.")
    return [[0] * d for d in range(1, depth + 1)]


def cartesian_choices(topk_per_head: Sequence[int], *, max_nodes: int | None = None) -> list[list[int]]:
    """Every combination of head-k's top-``topk_per_head[k]`` tokens, optionally capped at ``max_nodes``.

    When capped, nodes with the smallest rank sum (then depth) are kept; a parent always sorts
    before its children, so the kept set is a valid tree.
    """
    if not topk_per_head or any(k < 1 or k > TOPK for k in topk_per_head):
        raise TreeError(f"Give each head a top-k between 1 and {TOPK}, e.g. [3, 2, 2].")
    nodes: list[list[int]] = []
    level: list[list[int]] = [[]]
    for k in topk_per_head:
        level = [p + [r] for p in level for r in range(k)]
        nodes.extend(level)
    if max_nodes is not None:
        if max_nodes < 1:
            raise TreeError("max_nodes must be at least 1.")
        nodes = sorted(nodes, key=lambda c: (sum(c), len(c), c))[:max_nodes]
    return nodes


def greedy_choices(accuracy: Sequence[Sequence[float]], num_nodes: int) -> tuple[list[list[int]], float]:
    """The paper's greedy tree (App. C; reference ``gen_results.py``).

    ``accuracy[k][r]`` = P(head k+1's rank-r token is right). Starting from the root, repeatedly
    add the frontier node whose path has the largest product of accuracies. Returns the choices
    and the expected tokens per step, 1 + sum of the chosen nodes' products.
    """
    depth = len(accuracy)
    if depth == 0 or num_nodes < 1:
        raise TreeError("A greedy tree needs per-head accuracies and at least one node.")
    frontier: list[tuple[float, list[int]]] = []
    for r in range(min(TOPK, len(accuracy[0]))):
        heapq.heappush(frontier, (-float(accuracy[0][r]), [r]))
    chosen: list[list[int]] = []
    expected = 1.0
    while frontier and len(chosen) < num_nodes:
        neg_p, c = heapq.heappop(frontier)
        chosen.append(c)
        expected += -neg_p
        if len(c) < depth:
            for r in range(min(TOPK, len(accuracy[len(c)]))):
                heapq.heappush(frontier, (neg_p * float(accuracy[len(c)][r]), c + [r]))
    return chosen, expected


def path_probability(c: Sequence[int], accuracy: Sequence[Sequence[float]]) -> float:
    """The product of head accuracies along the node ``c``'s path (0 past what ``accuracy`` covers): how often
    the node is accepted, under the paper's independence assumption."""
    p = 1.0
    for k, r in enumerate(c):
        p *= float(accuracy[k][r]) if k < len(accuracy) and r < len(accuracy[k]) else 0.0
    return p


def expected_tokens_per_step(choices: Sequence[Sequence[int]], accuracy: Sequence[Sequence[float]]) -> float:
    """1 + sum over nodes of the product of head accuracies along the node's path."""
    total = 1.0
    for c in choices:
        total += path_probability(c, accuracy)
    return total
