"""The Tree lab's editor: a tree from its paths text and back, and the tree drawn before any run.

The edited tree goes through the Custom tree box's checks (``Playground.resolve_tree``); its nodes and mask
take the shapes the step inspector draws (``inspector.tree_nodes``, ``inspector.mask_data``), without tokens.
The editor's operations on a tree (add the next best node, remove a leaf, a preset's paths) are the core's
(``core/lab.py``, ``core/tree/presets.py``) and are offered from here.
"""

from __future__ import annotations

import json
from typing import Sequence

from ..core.tree.edit import add_best_node, leaves, remove_leaf
from ..core.tree.presets import preset_choices
from ..core.tree.shape import MedusaTree, validate_choices
from .inspector import tree_layout
from .settings import Settings


def editor_tree(pg, text: str) -> MedusaTree:
    """The edited tree from its paths text, with the Custom tree box's checks and sentences."""
    if not isinstance(text, str) or not text.strip():
        # the empty tree's sentence
        validate_choices([])
    return pg.resolve_tree(Settings(custom_tree=text))


def choices_text(choices: Sequence[Sequence[int]]) -> str:
    """A tree as the paths text the editor and the Custom tree box take."""
    return json.dumps([list(c) for c in choices])


def node_label(choice: Sequence[int]) -> str:
    """A tree node before any run: which head and rank it is (h2 r0 = head 2's top token)."""
    return f"h{len(choice)} r{choice[-1]}"


def editor_nodes(tree: MedusaTree) -> list[dict]:
    """The nodes of a tree for the inspector's drawing (``inspector.tree_nodes``' fields), without tokens:
    kind "node"."""
    y = tree_layout(tree.parents)
    return [
        {
            "node": j,
            "depth": int(tree.position_ids[j]),
            "y": y[j],
            "parent": tree.parents[j],
            "token_id": None,
            "label": "root" if j == 0 else node_label(tree.choices[j - 1]),
            "rank": tree.choices[j - 1][-1] if j else None,
            "accepted": False,
            "kind": "root" if j == 0 else "node",
        }
        for j in range(tree.num_nodes)
    ]


def editor_mask(tree: MedusaTree) -> tuple[list[list[int]], list[str], list[str]]:
    """The tree attention mask as ``inspector.mask_data`` gives it (1 visible, 0 hidden), prefix column first."""
    labels = [f"{j}:{'root' if j == 0 else node_label(tree.choices[j - 1])}" for j in range(tree.num_nodes)]
    z = [[1] + row for row in tree.attn_mask.tolist()]
    return z, ["prefix (the context)"] + labels, labels


__all__ = [
    "add_best_node",
    "choices_text",
    "editor_mask",
    "editor_nodes",
    "editor_tree",
    "leaves",
    "node_label",
    "preset_choices",
    "remove_leaf",
]
