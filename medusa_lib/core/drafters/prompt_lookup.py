"""Prompt lookup decoding as a drafter of its own: the lookup chain under the root alone.

No weights: the tokens that followed the latest earlier occurrence of the context's last 4, 3 or
2 tokens (``lookup.ngram_match``), verified as one chain of fixed length (``branch.LookupBranch``
beside the root-only tree). Exact like every drafter.
"""

from __future__ import annotations

from ..config import DEFAULT_LOOKUP, MAX_LOOKUP
from ..tree.shape import root_only_tree
from .base import Draft, Drafter, DrafterError, DraftRun, Loaded, StaticDraft, no_context
from .branch import LookupBranch


class _RootRun(DraftRun):
    def __init__(self, drafter: "RootOnly"):
        self.d = drafter

    def propose(self, root, *, history, seq_len):
        return Draft(self.d.buffers.cpu, root.view(1).to(self.d.device), self.d.buffers)


class RootOnly(Drafter):
    """The root alone: nothing drafted (a chain beside it is the whole proposal)."""

    listed = False

    def _bind(self, dec) -> None:
        self.buffers, self.device = dec.build(root_only_tree()), dec.device

    def open(self) -> DraftRun:
        return _RootRun(self)

    def static(self, dec) -> StaticDraft:
        return StaticDraft(self.buffers, lambda hidden, root, history, seq_len: no_context(root.view(1)), ("root",))


class LookupDrafter(LookupBranch):
    """Prompt lookup (Saxena 2023): a chain of ``length`` tokens copied from the context."""

    name = "lookup"
    label = "Prompt lookup"
    drafted_by = "prompt lookup"
    order = 2
    listed = True
    # what the page's "How to read this page" says about it
    teach = (
        "*Prompt lookup* needs no weights at all: it drafts one chain, the tokens that followed the last "
        "earlier place where the text's last few tokens appeared (the lookup branch on its own), so the tree "
        "controls do not apply either."
    )
    static_note = RootOnly.static_note

    def __init__(self, length: int = DEFAULT_LOOKUP):
        if not (isinstance(length, int) and not isinstance(length, bool) and 1 <= length <= MAX_LOOKUP):
            raise DrafterError(f"The prompt lookup drafter copies 1 to {MAX_LOOKUP} tokens a step (got {length}).")
        super().__init__(RootOnly(), length)

    @classmethod
    def load(cls, model, *, heads=None, folder=None, option=None) -> Loaded:
        return Loaded(True)

    @classmethod
    def for_run(cls, state, *, heads, tree, lookup):
        return cls(lookup or DEFAULT_LOOKUP)

    @classmethod
    def about(cls, states: dict) -> str:
        return (
            "Prompt lookup copies the tokens that followed the latest earlier occurrence of the text's last "
            "4, 3 or 2 tokens, verified as one chain (no weights, exact like every drafter): the tree preset, "
            "the custom tree and the lookup switch apply to the Medusa heads only."
        )

    def tree_label(self) -> str:
        return f"prompt-lookup chain (up to {self.length} tokens)"


__all__ = ["LookupDrafter", "RootOnly"]
