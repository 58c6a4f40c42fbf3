"""Named trees and trees written as text: the shipped presets (``trees.json``, the reference's), the generated
ones, and the parser of a tree typed on the page or passed to a CLI."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Mapping, Sequence

from .design import cartesian_choices, chain_choices
from .shape import MedusaTree, TreeError, build_tree, validate_choices

PRESETS_FILE = Path(__file__).with_name("trees.json")


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
