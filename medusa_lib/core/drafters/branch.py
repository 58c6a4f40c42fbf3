"""The lookup branch as a composition: any drafter, plus a chain of tokens copied from the context.

Prompt lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``) drafts the tokens
that followed an earlier occurrence of the text's last few tokens. ``LookupBranch(drafter, c)``
verifies them as one more path under the same root (``tree.with_lookup``); acceptance is
unchanged, so greedy output still equals plain greedy decoding. Both engines run it like any
drafter, and they read it one way: the chain holds the match (up to c tokens), or is absent. A
captured step (one shape) verifies all c nodes but leaves those past the match dead, never
accepted (``lookup.lookup_chain``, ``StaticDraft.dead``), so its tokens, accepted paths and
typical acceptance are the dynamic decoder's. Near the context limit both engines take root-only
steps once the tree or the chain would pass it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from ..config import MAX_LOOKUP
from ..draft import Credit, NewTree
from ..lookup import lookup_chain, ngram_proposal
from ..tree.parents import tree_of_parents
from ..tree.shape import root_only_tree, with_lookup
from .base import Draft, Drafter, DrafterError, DraftRun, StaticDraft


class _BranchRun(DraftRun):
    def __init__(self, drafter: "LookupBranch", inner: DraftRun):
        self.d, self.inner = drafter, inner

    def verified(self, features, tokens, start, rows=None):
        self.inner.verified(features, tokens, start, rows=rows)

    def close(self):
        self.inner.close()

    def propose(self, root, *, history, seq_len):
        d, draft = self.d, self.inner.propose(root, history=history, seq_len=seq_len)
        # the chain's last node must fit in the context too
        chain = ngram_proposal(history[:seq_len], length=d.length)[: max(0, d.limit - seq_len - 1)]
        c = chain.numel()
        if not c:
            return draft
        if draft is None:
            # the drafter proposed nothing (REST found no match): the chain under the root alone
            draft = Draft(root_only_tree(), root.view(1).to(chain.device))
        tokens = torch.cat([draft.tokens, chain.to(draft.tokens.device)])
        credit = chain_credit(draft.tree.num_nodes, c)
        if d.trees:
            return Draft(d.trees[c].cpu, tokens, d.trees[c], credit)
        return Draft(with_lookup(draft.tree, c), tokens, None, credit)


def chain_credit(start: int, matched: int) -> Credit:
    """What a lookup chain adds to its step's record: of the accepted nodes, how many hold the context's match
    (the chain's first ``matched`` nodes, from tree position ``start``; a fixed chain's filling past the match
    does not count)."""
    return lambda nodes: {"lookup_accepted": sum(start <= x < start + matched for x in nodes)}


class LookupBranch(Drafter):
    """``inner``'s tree with a lookup chain of ``length`` nodes beside it, under the same root."""

    listed = False
    branch = False

    def __init__(self, inner: Drafter, length: int):
        if not (isinstance(length, int) and not isinstance(length, bool) and 1 <= length <= MAX_LOOKUP):
            raise DrafterError(f"A lookup chain copies 1 to {MAX_LOOKUP} tokens a step (got {length}).")
        self.inner, self.length = inner, length

    # the unit is the inner drafter's: the records and the page name who drafted the tree
    name = property(lambda self: self.inner.name)
    label = property(lambda self: self.inner.label)
    drafted_by = property(lambda self: self.inner.drafted_by)
    static_note = property(lambda self: self.inner.static_note)

    @property
    def positions(self) -> int:
        return max(self.depth, self.length)

    def tree_label(self) -> str:
        return self.inner.tree_label()

    def _bind(self, dec) -> None:
        self.inner = self.inner.bind(dec)
        self.limit = dec.info.context_limit
        fixed = self.inner.buffers
        # beside a fixed tree: that tree with a chain of every length (a match may be shorter)
        self.trees = {}
        if fixed is not None:
            self.trees = {c: dec.build(with_lookup(fixed.cpu, c)) for c in range(1, self.length + 1)}
        # the shape a captured step verifies; a chain that would pass the context limit: root-only steps
        self.buffers = self.trees.get(self.length)
        self.depth = self.buffers.depth if self.buffers is not None else max(self.inner.depth, self.length)

    def open(self) -> DraftRun:
        return _BranchRun(self, self.inner.open())

    def static(self, dec) -> StaticDraft | None:
        inner = self.inner.static(dec)
        if inner is None:
            return None
        length, L = self.length, inner.num_nodes
        drafted = torch.ones(L, dtype=torch.bool, device=dec.device)
        j = torch.arange(length, device=dec.device)
        key = ("lookup", length, inner.key)
        depth = self.depth

        # beside a new tree every step, its parents, then the chain's (under the root, each node under the
        # one before), one path per node; a program's own inner draft (``fresh``) gets its own branch
        def around(inner: StaticDraft) -> StaticDraft:
            new = inner.tree if inner.buffers is None else None
            parents = None
            if new is not None:
                below = torch.tensor([0, *range(L, L + length - 1)], device=new.parents.device)
                parents = torch.cat([new.parents, below])

            def draft(hidden, root, history, seq_len):
                tokens, _, _ = inner.draft(hidden, root, history, seq_len)
                if parents is not None:
                    parents[:L].copy_(new.parents)
                chain, matched = lookup_chain(history, seq_len, length)
                live = torch.cat([drafted, j < matched]).to(tokens.device)
                return torch.cat([tokens, chain.to(tokens.device)]), matched, live

            # the step carries the chain's match back (the draft's mark)
            credit = partial(chain_credit, L)
            if new is None:
                return StaticDraft(self.buffers, draft, key, dead=True, credit=credit)
            describe = partial(tree_of_parents, width=depth + 1, top_k=new.top_k, lookup=length)
            state = inner.state
            if state is not None:
                state = replace(state, fresh=lambda max_len: around(inner.state.fresh(max_len)))
            return StaticDraft(
                NewTree(parents, depth, new.top_k, describe), draft, key, dead=True, credit=credit, state=state
            )

        return around(inner)


__all__ = ["LookupBranch", "chain_credit"]
