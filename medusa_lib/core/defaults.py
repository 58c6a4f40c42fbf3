"""Which tree and which lookup-branch length to use with given heads: one answer for the page,
the ``/compare`` API and the benchmark.

Heads calibrated by ``python -m medusa_lib.pipeline.calibrate`` name their default tree and the
lookup length it was calibrated with (``config.json``: ``default_tree``, ``lookup``; ``lookup: 0``
means calibrated without the branch). Heads without a calibration get a 16-node tree that a CPU
verifies cheaply, or a chain as deep as the heads when they predict fewer than 3 tokens ahead.
"""

from __future__ import annotations

from dataclasses import dataclass

from .lookup import DEFAULT_LOOKUP
from .tree import get_tree, preset_names

FALLBACK_TREE = "topk-4x3x2-16"  # 16 nodes: cheap enough on a CPU, wide enough to show a tree


@dataclass(frozen=True)
class HeadsDefaults:
    tree: str  # preset name: the heads' calibrated default, else FALLBACK_TREE, else chain-<depth>
    lookup: int  # the lookup branch's length when it is on
    lookup_on: bool  # on unless the heads were calibrated without it

    @property
    def lookup_length(self) -> int:
        """The branch length a run uses when nobody says otherwise (0 = off)."""
        return self.lookup if self.lookup_on else 0


def heads_defaults(heads) -> HeadsDefaults:
    """The defaults for ``heads`` (a MedusaHeads; calibration read by ``load_heads``)."""
    calibrated = getattr(heads, "default_tree", None)
    known = set(getattr(heads, "tree_presets", None) or ()) | set(preset_names())
    if calibrated and calibrated in known:
        tree = calibrated
    elif get_tree(FALLBACK_TREE).depth <= heads.num_heads:
        tree = FALLBACK_TREE
    else:
        tree = f"chain-{min(heads.num_heads, 4)}"
    lookup = getattr(heads, "lookup", None)
    return HeadsDefaults(tree=tree, lookup=lookup or DEFAULT_LOOKUP, lookup_on=lookup != 0)
