"""The Medusa heads as a drafter: a fixed tree filled from one hidden state (Cai et al. 2024).

Each head k proposes its top-k tokens for position t + k from h_t (root- and path-conditioned
heads also read the root and the tokens of their branch: ``MedusaHeads.draft``); the tree's nodes
are [root, head-1 top-k, ...][tree_indices]. The page's tree preset and custom tree shape it.
"""

from __future__ import annotations

from ..defaults import device_kind, record_kind
from ..heads import MedusaHeads
from ..tree.shape import MedusaTree
from .base import Draft, Drafter, DrafterError, DraftRun, Loaded, StaticDraft, no_context


class _HeadsRun(DraftRun):
    def __init__(self, drafter: "MedusaDrafter"):
        self.d = drafter

    def propose(self, root, *, history, seq_len):
        # seeded by the last accepted node's hidden state
        tokens = self.d.draft(self.hidden, root)
        return Draft(self.d.buffers.cpu, tokens, self.d.buffers)


class MedusaDrafter(Drafter):
    """Medusa heads on a fixed tree."""

    name = "medusa"
    label = "Medusa heads"
    drafted_by = "the Medusa heads"
    order = 0
    plural = True
    levels = "head"
    tree_controls = True
    # what the page's "How to read this page" says about it
    teach = (
        "A Medusa head reads only h_t, the base model's hidden state at the last token (the embedded heads "
        "add the embeddings of their own branch's tokens, never a feature of the model after them), and must "
        "guess position t+k without knowing which tokens the model will pick before it."
    )

    def __init__(self, heads: MedusaHeads | None, tree: MedusaTree | None):
        if heads is None or not isinstance(tree, MedusaTree):
            raise DrafterError("Medusa decoding needs Medusa heads and a tree.")
        self.heads, self.tree, self.depth = heads, tree, tree.depth

    @classmethod
    def load(cls, model, *, heads=None, folder=None, option=None) -> Loaded:
        return Loaded(heads)

    @classmethod
    def for_run(cls, state, *, heads, tree, lookup):
        return cls(heads, tree())

    @classmethod
    def recorded(cls, state, *, defaults, device):
        """The heads' calibration of their default tree, when made on this kind of device."""
        record = getattr(defaults, "calibration", None) or {}
        if not record or defaults.note or record_kind(record) != device_kind(device):
            return None, {}, ""
        tree = (record.get("trees") or {}).get(defaults.tree) or {}
        return (float(tree["speedup"]) if tree.get("speedup") else None), {}, "the heads' calibration"

    def tree_label(self) -> str:
        return self.tree.name

    def _bind(self, dec) -> None:
        self.heads.check_fits(dec.model)
        if self.tree.depth > self.heads.num_heads:
            raise DrafterError(
                f"The tree is {self.tree.depth} levels deep but the heads only predict {self.heads.num_heads} "
                f"tokens ahead; use a tree of depth <= {self.heads.num_heads}."
            )
        self.buffers = dec.build(self.tree)
        self.lm_head, self.embed = dec.lm_head, dec.embed

    def draft(self, hidden, root):
        """[L] the heads' tokens for every node of the tree, read from one hidden state [d] under ``root``."""
        return self.heads.draft(hidden, self.lm_head, self.buffers.out, root, self.embed)

    def open(self) -> DraftRun:
        return _HeadsRun(self)

    def static(self, dec) -> StaticDraft:
        # a cached_property (a lock inside): computed now, never inside a captured step
        self.buffers.out.levels
        h = self.heads
        shared = h.proposal_ids is not None and h.config.shared_lm_head
        # built now: a graph reads its weight
        proj = h.proposal_projection(self.lm_head) if shared else None
        draft = lambda hidden, root, history, seq_len: no_context(self.draft(hidden, root))  # noqa: E731
        return StaticDraft(self.buffers, draft, ("medusa", h, proj))


__all__ = ["MedusaDrafter"]
