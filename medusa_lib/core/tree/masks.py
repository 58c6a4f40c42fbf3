"""Tree attention as float masks: one builder for every caller, and ``TreeBuffers``, a tree on a decoder's devices.

Stock transformers take a float 4D mask: 0 where a query may attend, the dtype's minimum elsewhere
(never a bool mask, so every attention backend reads it the same way). ``additive_mask`` turns a
"who sees whom" table into that mask for every caller: the tree's own nodes (``tree_attention_bias``),
the EAGLE draft's levels, a captured step's new tree, the prefill chunks. ``prefix_mask`` lays a
tree's mask after the cached prefix, over a cache's slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from .shape import MedusaTree, children_tensor


def additive_mask(seen: torch.Tensor, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The float mask of the bool table ``seen`` (True: may attend): 0 there, ``dtype``'s minimum elsewhere,
    on ``device`` (default: ``seen``'s)."""
    device = seen.device if device is None else device
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill(~seen.to(device), torch.finfo(dtype).min)


def prefix_mask(bias: torch.Tensor, prefix: int | torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """[1, 1, L, len(cols)] the float mask of a tree step after ``prefix`` cached tokens over the cache
    slots ``cols``: 0 over the prefix, the tree's ``bias`` [L, L] after it, dtype-min beyond. The one
    mask builder of both caches' steps, the prefill chunks and the Tree lab's forwards."""
    n, rel, low = bias.shape[0], cols - prefix, torch.finfo(bias.dtype).min
    tree_part = bias.index_select(1, rel.clamp(0, n - 1))
    return torch.where(rel < 0, 0.0, torch.where(rel < n, tree_part, low)).to(bias.dtype)[None, None]


def tree_attention_bias(tree: MedusaTree, dtype: torch.dtype) -> torch.Tensor:
    """[L, L] additive mask: 0 where a node may attend, dtype-min elsewhere (float, never bool)."""
    return additive_mask(tree.attn_mask != 0, dtype)


@dataclass(frozen=True, eq=False)
class TreeBuffers:
    """One tree's buffers, each on the device that reads it (built once per decoder, not per step).

    tree  on the model's input device: position ids of the verify forward
    out   on the logits' device: retrieve_indices for acceptance, levels for the heads' draft
    cpu   on the CPU: what step records hold, and the accepted nodes for cache compaction
    bias  [L, L] the float additive tree attention mask in the model dtype, on the input device
    """

    tree: MedusaTree
    out: MedusaTree
    cpu: MedusaTree
    bias: torch.Tensor

    @classmethod
    def build(
        cls, tree: MedusaTree, *, device: torch.device | str, out_device: torch.device | str, dtype: torch.dtype
    ) -> TreeBuffers:
        on_device = tree.to(device)
        return cls(
            tree=on_device, out=tree.to(out_device), cpu=tree.to("cpu"), bias=tree_attention_bias(on_device, dtype)
        )

    @cached_property
    def num_nodes(self) -> int:
        """L, tree tokens verified per step."""
        return self.tree.num_nodes

    @cached_property
    def depth(self) -> int:
        return self.tree.depth

    @cached_property
    def paths(self) -> torch.Tensor:
        """[P, D+1] retrieve_indices on the logits' device, padding clamped to 0 (see ``valid``)."""
        return self.out.retrieve_indices.clamp(min=0)

    @cached_property
    def valid(self) -> torch.Tensor:
        """[P, D+1] which path slots are nodes (padded slots never pass)."""
        return self.out.retrieve_indices >= 0

    @cached_property
    def children(self) -> torch.Tensor:
        """[L, W] each node's children on the logits' device, -1 padded (exact sampling's walk)."""
        return children_tensor(self.cpu.children, device=self.out.retrieve_indices.device)
