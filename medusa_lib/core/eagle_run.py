"""One run of an EAGLE head as a drafter (Li et al. 2024): its draft cache and EAGLE-2's dynamic tree.

Per decoding step the accepted tokens' *verified* features enter the head's own cache (``extend``),
replacing what it drafted there, and the next tree grows from the newest one (``draft``).
``core/eagle.py`` holds the head; ``core/drafters/eagle_head.py`` the drafter the verifier runs.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .dynamic_tree import Candidates, DynamicTree, DynamicTreeConfig, expand_level, select_tree
from .tree.masks import additive_mask


class EagleRun:
    """The drafter's state during one run: its KV cache (entries 0..stable-1 hold verified
    features), and the step's draft. Created inside ``Decoder.steps``: two runs never share it."""

    def __init__(self, head: torch.nn.Module, tree: DynamicTreeConfig):
        # head: an eagle.EagleHead (not imported: the head's module imports this one)
        tree.check()
        self.head, self.tree = head, tree
        self.cache = DynamicCache()
        # entries of verified features; everything after them is a draft
        self.stable = 0
        # g at the newest verified entry: it drafts level 1
        self.last: torch.Tensor | None = None
        dev = head.fc.weight.device
        self.dtype, self.device = head.fc.weight.dtype, dev
        k = tree.top_k
        self.eye = torch.eye(k, dtype=torch.bool, device=dev)

    def _mask(self, visible: torch.Tensor) -> torch.Tensor:
        """[1, 1, q, stable + extra] additive mask: the verified prefix, then ``visible`` [q, extra]."""
        q = visible.shape[0]
        extra = additive_mask(visible, self.dtype, self.device)
        return torch.cat([torch.zeros(q, self.stable, dtype=self.dtype, device=self.device), extra], dim=1)[None, None]

    def extend(self, features: torch.Tensor, tokens: torch.Tensor, start: int) -> None:
        """Append verified pairs (f_t, x_{t+1}) for t = start .. start + n - 1 (drafts dropped first);
        ``features`` [n, d], or [n, layers, d] for a head that fuses layers (``EagleHead.draft_input``)."""
        if self.cache.get_seq_length() > self.stable:
            self.cache.crop(-(self.cache.get_seq_length() - self.stable))
        n = features.shape[0]
        pos = torch.arange(start, start + n, device=self.device)[None]
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        g = self.head(
            self.head.draft_input(features.to(self.device))[None],
            tokens[None].to(self.device),
            pos,
            attention_mask=self._mask(causal),
            cache=self.cache,
        )[0]
        self.stable += n
        self.last, self.next_pos = g[-1], start + n

    def draft(self, root: torch.Tensor) -> DynamicTree:
        """EAGLE-2's dynamic tree under ``root`` from the newest verified entry (``grow_tree``); each
        level's k frontier nodes are appended to the draft cache after the verified entries."""
        k = self.tree.top_k

        def level(g, tokens, depth, seen):
            pos = torch.full((1, k), self.next_pos + depth - 1, device=self.device)
            return self.head(g[None], tokens[None], pos, attention_mask=self._mask(seen), cache=self.cache)[0]

        return grow_tree(self.head.logits, self.head.token_ids, self.tree, self.last, root, level, eye=self.eye)


def grow_tree(logits, token_ids, tree: DynamicTreeConfig, last, root, level, *, eye) -> DynamicTree:
    """EAGLE-2's dynamic tree under ``root`` (reference ``topK_genrate``): level 1 is the top-k of the
    head's ``logits`` after ``last`` (g at the newest verified entry), then depth - 1 batched draft
    forwards of the k frontier nodes each, ``level(g [k, d], tokens [k], depth, seen [k, k * depth])``
    -> g [k, d], every node seeing the prefix, its drafted ancestors and itself (``seen``: over the
    entries the levels before it and this one wrote, in that order). Written once for the dynamic
    run and the captured one (``eagle_static.StaticEagle``); no host reads."""
    k, dev = tree.top_k, last.device
    logp = torch.log_softmax(logits(last).float(), -1)
    top = torch.topk(logp, k)
    tokens, scores = [token_ids(top.indices)], [top.values]
    parents = [torch.full((k,), -1, dtype=torch.long, device=dev)]
    frontier_tok, frontier_val = tokens[0], top.values
    frontier_g = last.expand(k, -1)
    frontier_idx = torch.arange(k, device=dev)
    # each frontier node's drafted ancestors
    seen = torch.zeros(k, 0, dtype=torch.bool, device=dev)
    offset = k
    for depth in range(1, tree.depth):
        # ... and each node itself
        seen = torch.cat([seen, eye], dim=1)
        g = level(frontier_g, frontier_tok, depth, seen)
        columns, values, chosen, rows = expand_level(frontier_val, torch.log_softmax(logits(g).float(), -1), k)
        ids = token_ids(columns)
        tokens.append(ids), scores.append(values), parents.append(frontier_idx.repeat_interleave(k))
        frontier_tok, frontier_val, frontier_g, seen = ids[chosen], values[chosen], g[rows], seen[rows]
        frontier_idx = offset + chosen
        offset += k * k
    depths = torch.cat([torch.full((k if d == 1 else k * k,), d, device=dev) for d in range(1, tree.depth + 1)])
    cand = Candidates(torch.cat(tokens), torch.cat(scores), torch.cat(parents), depths)
    return select_tree(root, cand, num_nodes=tree.num_nodes, depth=tree.depth)


__all__ = ["EagleRun", "grow_tree"]
