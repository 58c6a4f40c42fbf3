"""Medusa candidate trees: the static buffers of tree attention.

A tree is a list of *choices*. The choice ``[r1, r2, ..., rd]`` is the node reached by
taking head-1's rank-r1 token, then head-2's rank-r2 token, and so on (Medusa paper,
arXiv 2401.10774, Sec. 2.1.2; reference code FasterDecoding/Medusa, ``medusa_choices``).
Node 0 is the root: the base model's own next token. The buffers built here follow the
reference ``generate_medusa_buffers`` exactly (checked against its worked example and all
of its presets in the tests), with one change: padded slots of ``retrieve_indices`` stay -1
and are masked explicitly by the decoders instead of being mapped to token id 0.
``TreeBuffers`` holds one tree's buffers on the devices a decoder reads them from.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Mapping, Sequence

import torch

from .messages import InputError, shown

# candidates read from each head (reference TOPK)
TOPK = 10
PRESETS_FILE = Path(__file__).with_name("trees.json")


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


def prefix_mask(bias: torch.Tensor, prefix: int | torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """[1, 1, L, len(cols)] the float mask of a tree step after ``prefix`` cached tokens over the cache
    slots ``cols``: 0 over the prefix, the tree's ``bias`` [L, L] after it, dtype-min beyond. The one
    mask builder of both caches' steps, the prefill chunks and the Tree lab's forwards."""
    n, rel, low = bias.shape[0], cols - prefix, torch.finfo(bias.dtype).min
    tree_part = bias.index_select(1, rel.clamp(0, n - 1))
    return torch.where(rel < 0, 0.0, torch.where(rel < n, tree_part, low)).to(bias.dtype)[None, None]


def tree_attention_bias(tree: MedusaTree, dtype: torch.dtype) -> torch.Tensor:
    """[L, L] additive mask: 0 where a node may attend, dtype-min elsewhere (float, never bool)."""
    return torch.zeros(tree.attn_mask.shape, dtype=dtype, device=tree.attn_mask.device).masked_fill(
        tree.attn_mask == 0, torch.finfo(dtype).min
    )


@dataclass(frozen=True, eq=False)
class TreeBuffers:
    """One tree's buffers, each on the device that reads it (built once per decoder, not per step).

    tree  on the model's input device: position ids of the verify forward
    out   on the logits' device: retrieve_indices for acceptance, levels for the heads' draft
    cpu   on the CPU: what step records hold, and the accepted nodes for cache compaction
    bias  [L, L] the float additive tree attention mask in the model dtype, on the input device
    """

    tree: MedusaTree
    out: MedusaTree
    cpu: MedusaTree
    bias: torch.Tensor

    @classmethod
    def build(
        cls, tree: MedusaTree, *, device: torch.device | str, out_device: torch.device | str, dtype: torch.dtype
    ) -> TreeBuffers:
        on_device = tree.to(device)
        return cls(
            tree=on_device, out=tree.to(out_device), cpu=tree.to("cpu"), bias=tree_attention_bias(on_device, dtype)
        )

    @cached_property
    def num_nodes(self) -> int:
        """L, tree tokens verified per step."""
        return self.tree.num_nodes

    @cached_property
    def depth(self) -> int:
        return self.tree.depth

    @cached_property
    def paths(self) -> torch.Tensor:
        """[P, D+1] retrieve_indices on the logits' device, padding clamped to 0 (see ``valid``)."""
        return self.out.retrieve_indices.clamp(min=0)

    @cached_property
    def valid(self) -> torch.Tensor:
        """[P, D+1] which path slots are nodes (padded slots never pass)."""
        return self.out.retrieve_indices >= 0

    @cached_property
    def children(self) -> torch.Tensor:
        """[L, W] each node's children on the logits' device, -1 padded (exact sampling's walk)."""
        return children_tensor(self.cpu.children, device=self.out.retrieve_indices.device)


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


# the "rank" of a lookup-branch node in MedusaTree.choices
LOOKUP_RANK = -1


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


def expected_tokens_per_step(choices: Sequence[Sequence[int]], accuracy: Sequence[Sequence[float]]) -> float:
    """1 + sum over nodes of the product of head accuracies along the node's path."""
    total = 1.0
    for c in choices:
        p = 1.0
        for k, r in enumerate(c):
            p *= float(accuracy[k][r]) if k < len(accuracy) and r < len(accuracy[k]) else 0.0
        total += p
    return total


@cache
def _load_presets() -> dict[str, list[list[int]]]:
    return json.loads(PRESETS_FILE.read_text())


def preset_names() -> list[str]:
    """Names of the shipped tree presets (reference presets plus generated ones)."""
    return list(_load_presets()) + list(GENERATED_PRESETS)


GENERATED_PRESETS = {
    "chain-1": lambda: chain_choices(1),
    "chain-2": lambda: chain_choices(2),
    "chain-3": lambda: chain_choices(3),
    "chain-4": lambda: chain_choices(4),
    "topk-2x2": lambda: cartesian_choices([2, 2]),
    "topk-3x2x1": lambda: cartesian_choices([3, 2, 1]),
    "topk-4x3x2-16": lambda: cartesian_choices([4, 3, 2], max_nodes=16),
}


def preset_choices(name: str, extra: Mapping[str, Sequence[Sequence[int]]] | None = None) -> list[list[int]]:
    """Choices of a named tree: ``extra`` (e.g. trees calibrated for the loaded heads), the reference presets,
    or a generated one."""
    if extra and name in extra:
        return [list(c) for c in extra[name]]
    presets = _load_presets()
    if name in presets:
        return [list(c) for c in presets[name]]
    if name in GENERATED_PRESETS:
        return GENERATED_PRESETS[name]()
    raise TreeError(f"Unknown tree preset {name!r}; choose one of: {', '.join(list(extra or ()) + preset_names())}.")


def get_tree(
    name: str, *, num_heads: int | None = None, extra: Mapping[str, Sequence[Sequence[int]]] | None = None
) -> MedusaTree:
    """Build a named preset, checked against the number of heads."""
    return build_tree(preset_choices(name, extra), num_heads=num_heads, name=name)


# a tree is a list of lists: text nested deeper than this is refused before parsing
MAX_NESTING = 16


def nesting_depth(text: str) -> int:
    """How deep the JSON brackets of ``text`` nest (outside strings), without parsing it: deep text is
    refused the same way on every Python (3.11's parser overflows near 1,000 levels, 3.12's does not)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_choices(text: str) -> list[list[int]]:
    """Parse a tree written as JSON (``[[0], [0, 0], [1]]``); raise TreeError on bad text."""
    if nesting_depth(text) > MAX_NESTING:
        raise TreeError("The tree text is nested too deeply; write it as a flat list of paths like [[0], [0, 0], [1]].")
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise TreeError(
            f"The tree text is not valid JSON ({e.msg if hasattr(e, 'msg') else e}); write it like [[0], [0, 0], [1]]."
        ) from None
    if not isinstance(value, list):
        raise TreeError("The tree text must be a JSON list of nodes, like [[0], [0, 0], [1]].")
    return validate_choices(value)
