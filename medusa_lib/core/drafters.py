"""Drafters: who proposes the tree that a Medusa step verifies, behind one interface.

The verifier (``decoding.Decoder`` and the static engine's ``fused.Program``) never learns which
drafter it runs, as in vLLM's proposers and SGLang's draft workers. A drafter is bound to one
decoder's devices (``bind``), opens one run's state (``open``), is told what each step verified
(``DraftRun.verified``: the features of the committed positions and the token after each) and
proposes the next tree under a root (``DraftRun.propose``). ``static`` says what a captured,
fixed-shape step may hold of it (None: the dynamic cache only, said by ``static_note``).
docs/engine.md, "Writing a drafter", walks through the prompt lookup drafter below.
"""

from __future__ import annotations

import copy
from typing import Callable, NamedTuple

import torch

from .dynamic_tree import DynamicTreeConfig, as_medusa_tree
from .eagle import EagleHead, EagleRun
from .heads import MedusaHeads
from .lookup import MAX_LOOKUP, ngram_proposal
from .messages import InputError
from .tree import MedusaTree, TreeBuffers, root_only_tree, with_lookup


class DrafterError(InputError):
    """A drafter that cannot run with these settings. One sentence that says what to change."""


class Draft(NamedTuple):
    """One step's proposal under the root."""

    tree: MedusaTree  # its shape (on the CPU)
    tokens: torch.Tensor  # [L] token of every node, the root first
    buffers: TreeBuffers | None = None  # the prebuilt buffers of a fixed tree (None: built for this step)
    lookup: int = 0  # trailing nodes copied from the context (a lookup chain)


class StaticDraft(NamedTuple):
    """What a captured, fixed-shape step holds of a drafter (``fused.Program``)."""

    buffers: TreeBuffers  # the one tree every step verifies, a lookup chain included
    draft: Callable  # (hidden [d], root [1]) -> tokens [L - lookup], with no host read
    lookup: int  # trailing nodes matched in the history on the device
    top1: tuple[int, ...]  # drafted nodes that fill the lookup chain past its match
    key: tuple  # what makes two programs the same (a program keeps it alive)


class DraftRun:
    """One run's drafter state. ``verified(features [n, d], tokens [n], start, rows=)``: the base model's
    features at positions start .. start + n - 1 and the token after each (the last one is the next
    root), taken from the rows ``rows`` of the latest base forward (None: all of its rows);
    ``propose(root, history=, seq_len=)``: the next Draft, or None for a root-only step; ``close()``
    when the run ends, however it ends."""

    def verified(self, features: torch.Tensor, tokens: torch.Tensor, start: int, rows=None) -> None:
        self.hidden, self.root = features[-1], tokens[-1]

    def close(self) -> None:
        pass

    def propose(self, root: torch.Tensor, *, history: torch.Tensor, seq_len: int) -> Draft | None:
        raise NotImplementedError


class Drafter:
    """A drafter's settings. ``name`` goes into the step records; ``depth`` is its deepest node;
    ``branch``: a lookup branch may sit beside its tree; ``buffers``: its fixed tree (None: a new
    tree every step)."""

    name = ""
    depth = 0
    branch = True
    buffers: TreeBuffers | None = None
    static_note = "This drafter has no static form, so the run uses the dynamic cache."

    def bind(self, dec) -> "Drafter":
        """A copy checked against ``dec``'s model and placed on its devices."""
        bound = copy.copy(self)
        bound._bind(dec)
        return bound

    def _bind(self, dec) -> None:
        pass

    def open(self) -> DraftRun:
        raise NotImplementedError

    def static(self, dec, lookup: int) -> StaticDraft | None:
        return None


# ---------------------------------------------------------------------- the Medusa heads
class _HeadsRun(DraftRun):
    def __init__(self, drafter: "MedusaDrafter"):
        self.d = drafter

    def propose(self, root, *, history, seq_len):
        tokens = self.d.draft(self.hidden, root)  # seeded by the last accepted node's hidden state
        return Draft(self.d.buffers.cpu, tokens, self.d.buffers)


class MedusaDrafter(Drafter):
    """Medusa heads on a fixed tree: [root, head-1 top-k, ...][tree_indices] from h_t (root- and
    path-conditioned heads also read the root and their branch: ``MedusaHeads.draft``)."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads | None, tree: MedusaTree | None):
        if heads is None or not isinstance(tree, MedusaTree):
            raise DrafterError("Medusa decoding needs Medusa heads and a tree.")
        self.heads, self.tree, self.depth = heads, tree, tree.depth

    def _bind(self, dec) -> None:
        self.heads.check_fits(dec.model)
        if self.tree.depth > self.heads.num_heads:
            raise DrafterError(
                f"The tree is {self.tree.depth} levels deep but the heads only predict {self.heads.num_heads} "
                f"tokens ahead; use a tree of depth <= {self.heads.num_heads}."
            )
        self.buffers = dec.build(self.tree)
        self.lm_head, self.embed = dec.lm_head, dec.embed
        position = {c: j + 1 for j, c in enumerate(self.tree.choices)}
        self.top1 = tuple(position[(0,) * d] for d in range(1, self.tree.depth + 1) if (0,) * d in position)

    def draft(self, hidden: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        """[L] the heads' tokens for every node of the tree, read from one hidden state [d] under ``root``."""
        return self.heads.draft(hidden, self.lm_head, self.buffers.out, root, self.embed)

    def open(self) -> DraftRun:
        return _HeadsRun(self)

    def static(self, dec, lookup: int) -> StaticDraft:
        self.buffers.out.levels  # a cached_property (a lock inside): computed now, never inside a captured step
        h = self.heads
        shared = h.proposal_ids is not None and h.config.shared_lm_head
        proj = h.proposal_projection(self.lm_head) if shared else None  # built now: a graph reads its weight
        bufs = dec.lookup_trees[lookup] if lookup else self.buffers
        return StaticDraft(bufs, self.draft, lookup, self.top1, (h, proj))


# ---------------------------------------------------------------------- EAGLE
class _EagleRun(DraftRun):
    def __init__(self, drafter: "EagleDrafter"):
        self.d, self.run, self.pending = drafter, EagleRun(drafter.head, drafter.tree), []
        self.inputs, self.hooks = {}, []
        for k in drafter.head.config.fuse_layers or ():  # EAGLE-3 reads what enters these layers of every forward
            hook = lambda module, args, kwargs, k=k: self.inputs.__setitem__(  # noqa: E731
                k, (args[0] if args else kwargs["hidden_states"])[0].detach()
            )
            self.hooks.append(drafter.layers[k].register_forward_pre_hook(hook, with_kwargs=True))

    def verified(self, features, tokens, start, rows=None):  # pairs (f_t, x_{t+1}); read before the next draft
        if self.hooks:  # the fused layer inputs at the same rows of the same forward: [n, layers, d]
            fused = torch.stack([self.inputs[k] for k in self.d.head.config.fuse_layers], dim=-2)
            features = fused if rows is None else fused[rows.to(fused.device)]
        self.pending.append((features, tokens, start))

    def close(self):
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def propose(self, root, *, history, seq_len):
        if self.pending:  # the verified features replace what the drafter drafted there
            features, tokens = (torch.cat([p[i] for p in self.pending]) for i in (0, 1))
            self.run.extend(features, tokens, self.pending[0][2])
            self.pending = []
        tree = self.run.draft(root)
        return Draft(as_medusa_tree(tree, top_k=self.d.tree.top_k), tree.tokens)


class EagleDrafter(Drafter):
    """The EAGLE head (``eagle.py``): a new EAGLE-2 dynamic tree every step from features and tokens."""

    name = "eagle"
    static_note = (
        "The EAGLE drafter runs with the dynamic cache only (its tree changes every step); "
        "this run uses the dynamic cache."
    )

    def __init__(self, head: EagleHead, tree: DynamicTreeConfig | None = None):
        self.head, self.tree = head, tree if isinstance(tree, DynamicTreeConfig) else head.config.tree
        self.tree.check()
        self.depth = self.tree.depth

    def _bind(self, dec) -> None:
        self.head.check_fits(dec.model)
        self.layers = dec.model.base_model.layers

    def open(self) -> DraftRun:
        return _EagleRun(self)


# ---------------------------------------------------------------------- prompt lookup
class _LookupRun(DraftRun):
    def __init__(self, drafter: "LookupDrafter"):
        self.d = drafter

    def propose(self, root, *, history, seq_len):
        chain = ngram_proposal(history[:seq_len], length=self.d.length)
        if not chain.numel():
            return None  # nothing to copy: a plain step
        c = chain.numel()
        tokens = torch.cat([root.view(1).to(self.d.device), chain.to(self.d.device)])
        return Draft(self.d.chains[c].cpu, tokens, self.d.chains[c], lookup=c)


class LookupDrafter(Drafter):
    """Prompt lookup decoding (Saxena 2023): the tokens that followed the latest earlier occurrence
    of the context's last n-gram, verified as one chain. No weights; exact like every drafter."""

    name = "lookup"
    branch = False  # it is the lookup chain

    def __init__(self, length: int = 4):
        if not (isinstance(length, int) and 1 <= length <= MAX_LOOKUP):
            raise DrafterError(f"The prompt lookup drafter copies 1 to {MAX_LOOKUP} tokens a step (got {length}).")
        self.length = self.depth = length

    def _bind(self, dec) -> None:
        self.device = dec.device
        self.chains = {c: dec.build(with_lookup(root_only_tree(), c)) for c in range(1, self.length + 1)}

    def open(self) -> DraftRun:
        return _LookupRun(self)

    def static(self, dec, lookup: int) -> StaticDraft:  # the root alone, then the chain matched on the device
        return StaticDraft(self.chains[self.length], lambda hidden, root: root.view(1), self.length, (), ("lookup",))


def make_drafter(*, heads=None, tree=None, eagle: EagleHead | None = None, drafter: Drafter | None = None) -> Drafter:
    """The drafter of Decoder's keywords: ``drafter`` itself, else the EAGLE head, else the Medusa heads."""
    if drafter is not None:
        if not isinstance(drafter, Drafter):
            raise DrafterError(
                f"drafter must be a Drafter (MedusaDrafter, EagleDrafter, LookupDrafter), not {type(drafter).__name__}."
            )
        return drafter
    if eagle is not None:
        return EagleDrafter(eagle, tree)
    return MedusaDrafter(heads, tree)


__all__ = [
    "Draft",
    "DraftRun",
    "Drafter",
    "DrafterError",
    "EagleDrafter",
    "LookupDrafter",
    "MedusaDrafter",
    "StaticDraft",
    "make_drafter",
]
