"""Medusa candidate trees: a package, one concept a file.

- ``shape``: ``MedusaTree`` (a tree's static buffers on the CPU), trees built from choices, the root
  alone, a lookup chain beside a tree;
- ``parents``: a tree given by each node's parent (a drafter's new tree every step);
- ``masks``: tree attention as float masks (one builder for every caller) and ``TreeBuffers``, a tree
  on a decoder's devices;
- ``design``: chains, cartesian products, the greedy tree from head accuracies, expected tokens per step;
- ``edit``: the Tree lab editor's edits (the next best node, leaves, a leaf removed);
- ``presets``: the named trees and the parser of a tree written as text.

Callers inside the library import from the module they use; ``medusa_lib.core.tree`` keeps every public
name importable, as the README and docs show them.
"""

from .design import cartesian_choices, chain_choices, expected_tokens_per_step, greedy_choices, path_probability
from .edit import add_best_node, leaves, remove_leaf
from .masks import TreeBuffers, additive_mask, prefix_mask, tree_attention_bias
from .parents import ancestry, children_of, tree_of_parents
from .presets import (
    GENERATED_PRESETS,
    MAX_NESTING,
    PRESETS_FILE,
    get_tree,
    nesting_depth,
    parse_choices,
    preset_choices,
    preset_names,
)
from .shape import (
    LOOKUP_RANK,
    TOPK,
    MedusaTree,
    TreeError,
    TreeLevel,
    build_tree,
    children_tensor,
    root_only_tree,
    validate_choices,
    with_lookup,
)

__all__ = [
    "GENERATED_PRESETS",
    "LOOKUP_RANK",
    "MAX_NESTING",
    "PRESETS_FILE",
    "TOPK",
    "MedusaTree",
    "TreeBuffers",
    "TreeError",
    "TreeLevel",
    "add_best_node",
    "additive_mask",
    "ancestry",
    "build_tree",
    "cartesian_choices",
    "chain_choices",
    "children_of",
    "children_tensor",
    "expected_tokens_per_step",
    "get_tree",
    "greedy_choices",
    "leaves",
    "nesting_depth",
    "parse_choices",
    "path_probability",
    "preset_choices",
    "preset_names",
    "prefix_mask",
    "remove_leaf",
    "root_only_tree",
    "tree_attention_bias",
    "tree_of_parents",
    "validate_choices",
    "with_lookup",
]
