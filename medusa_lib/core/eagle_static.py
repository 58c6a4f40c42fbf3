"""An EAGLE head's draft as a fixed-shape program: ``eagle_run.EagleRun`` for the static engine.

The same maths as ``EagleRun`` (the verified pairs into the head's own cache, then EAGLE-2's levels,
``eagle_run.grow_tree``), with every shape fixed and every length a device tensor, so the whole draft
runs inside the step's program (``fused.Program``: one CUDA graph a step on a GPU, no host read between
levels). The head's one layer writes into a transformers ``StaticCache`` layer of its own, whose slots
are positions:

  0 .. max_len - 1            verified pairs (f_t, x_{t+1}) at position t. A step writes its whole
                              accepted-path width; the pairs past the accepted ones are hidden by the
                              masks and overwritten by the next step, which starts right after the last
                              accepted pair.
  max_len .. + k (depth - 1)  the k frontier entries of each draft level, written level after level
                              (their rotary positions are explicit: where they sit does not matter).

Masks are built on the device from the verified length (a device scalar): a verified pair sees the
pairs up to its own position, a draft entry the verified prefix, its drafted ancestors and itself,
exactly what ``EagleRun`` shows each of them.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from .caches import ALIGN
from .dynamic_tree import DynamicTreeConfig
from .eagle_run import grow_tree
from .tree.masks import additive_mask


class StaticEagle:
    """The draft state of one static program (``fused.Program``): the head's static cache, the newest
    verified g, the verified length and the tree's parents, at fixed addresses. One run at a time."""

    def __init__(self, head: torch.nn.Module, tree: DynamicTreeConfig):
        # head: an eagle.EagleHead (not imported: the head's module imports eagle_run)
        tree.check()
        self.head, self.tree = head, tree
        dev = head.fc.weight.device
        self.dtype, self.device = head.fc.weight.dtype, dev
        # the tree the next step verifies: each node's parent (tree positions, the root's 0)
        self.parents = torch.zeros(tree.num_nodes + 1, dtype=torch.long, device=dev)
        self.eye = torch.eye(tree.top_k, dtype=torch.bool, device=dev)
        # allocated by the program that keeps it (``allocate``)
        self.cache: Cache | None = None

    @torch.inference_mode()
    def allocate(self, max_len: int) -> None:
        """The head's cache (``max_len`` verified slots, then the draft levels' slots) and the buffers the
        draft reads, allocated eagerly (never inside a compile or a capture), by the one program that
        keeps this state (``EagleDrafter.static``'s ``fresh``)."""
        if self.cache is not None:
            raise RuntimeError("a StaticEagle belongs to one program: allocate it once")
        k, depth, head = self.tree.top_k, self.tree.depth, self.head
        self.base = max_len
        self.size = -(-(max_len + k * (depth - 1)) // ALIGN) * ALIGN
        self.cache = Cache(layers=[StaticLayer(max_cache_len=self.size)])
        self.cols = torch.arange(self.size, device=self.device)
        # g at the newest verified pair (it drafts level 1), and how many pairs are verified
        self.last = torch.zeros(head.config.hidden_size, dtype=self.dtype, device=self.device)
        self.stable = torch.zeros((), dtype=torch.long, device=self.device)
        # one pair at slot 0 makes transformers allocate the layer (it marks its tensors static)
        zero = torch.zeros(1, dtype=torch.long, device=self.device)
        self._forward(self.last[None], zero, zero, self.cols[None] < 1, at=0)
        # the projection the dynamic run uses, built now (its first call gathers the proposal rows); a
        # traced step calls it without the data-pointer check (a change of the proposal vocabulary or the
        # numerics is another program: ``EagleDrafter.static``'s key)
        head.logits(self.last)
        proj, dtype = head._proj, head._lm_head.weight.dtype
        self.logits = lambda g: proj(g.to(dtype))
        self.stable.zero_()

    def _forward(self, x, tokens, pos, visible, *, at) -> torch.Tensor:
        """g [q, d] of the head after inputs ``x`` [q, d] beside ``tokens`` [q] at positions ``pos`` [q],
        each row seeing the slots ``visible`` [q, size]; their K/V are written at slots ``at`` (a number, or
        a device tensor [1]) on."""
        length = self.cache.layers[0].cumulative_length
        length.fill_(at) if isinstance(at, int) else length.copy_(at.view(()))
        mask = additive_mask(visible, self.dtype, self.device)
        return self.head(x[None], tokens[None], pos[None], attention_mask=mask[None, None], cache=self.cache)[0]

    def start(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        """A run's prompt: pairs (f_t, x_{t+1}) for t = 0 .. n - 1 (``features`` [n, d], ``tokens`` [n]),
        eagerly, at its own length."""
        pos = torch.arange(tokens.numel(), device=self.device)
        g = self._forward(
            self.head.draft_input(features.to(self.device)),
            tokens.to(self.device),
            pos,
            self.cols[None] <= pos[:, None],
            at=0,
        )
        self.last.copy_(g[-1])
        self.stable.fill_(tokens.numel())

    def verified(self, features: torch.Tensor, tokens: torch.Tensor, start: torch.Tensor, n: torch.Tensor) -> None:
        """A step's accepted path: pairs (f at its node, the token after it) from the root, at positions
        ``start`` [1] on (``features`` [W, d], ``tokens`` [W]); the first n + 1 (``n`` [1]) are real, the
        rest fill the fixed width (hidden, then overwritten)."""
        dev = self.device
        start, n = start.to(dev), n.to(dev)
        pos = start + torch.arange(tokens.numel(), device=dev)
        g = self._forward(
            self.head.draft_input(features.to(dev)),
            tokens.to(dev).clamp(min=0),
            pos,
            self.cols[None] <= pos[:, None],
            at=start,
        )
        self.last.copy_(g.index_select(0, n)[0])
        self.stable.copy_((start + n + 1).view(()))

    def draft(self, root: torch.Tensor) -> torch.Tensor:
        """EAGLE-2's tree under ``root`` [1] (``grow_tree``): writes its parents into ``parents``, returns
        its tokens [num_nodes + 1], the root first."""
        k = self.tree.top_k

        def level(g, tokens, depth, seen):
            # this level's entries, after the levels before it
            at = self.base + (depth - 1) * k
            drafted = torch.cat(
                [
                    torch.zeros(k, self.base, dtype=torch.bool, device=self.device),
                    seen,
                    torch.zeros(k, self.size - self.base - seen.shape[1], dtype=torch.bool, device=self.device),
                ],
                dim=1,
            )
            pos = (self.stable + depth - 1).expand(k)
            return self._forward(g, tokens, pos, (self.cols[None] < self.stable) | drafted, at=at)

        tree = grow_tree(self.logits, self.head.token_ids, self.tree, self.last, root, level, eye=self.eye)
        self.parents.copy_(tree.parents)
        return tree.tokens


__all__ = ["StaticEagle"]
