"""transformers' caches as a run uses them: built with full (non-sliding) layers, and compacted.

After a verify step the K/V of the accepted tree nodes move right behind the prefix and the rest
is dropped (``compact_cache``, by the rule ``moved_slots``); ``kv.py`` builds the run's cache
objects on these.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import Cache, StaticLayer

# static lengths are rounded up to a multiple of this (the verifier's cache, an EAGLE head's)
ALIGN = 64


def new_cache() -> DynamicCache:
    """A cache of full (non-sliding) layers: with our own 4D masks a sliding-window layer's
    eviction would break the tree-slot arithmetic; runs are capped at the window instead."""
    return DynamicCache()


def new_static_cache(model: nn.Module, max_len: int) -> Cache:
    """A StaticCache of ``max_len`` full (non-sliding) slots per layer, for the same reason."""
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[StaticLayer(max_cache_len=max_len) for _ in range(layers)])


def is_static(cache: Cache) -> bool:
    return bool(cache.layers) and isinstance(cache.layers[0], StaticLayer)


def moved_slots(prefix: int | torch.Tensor, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The compaction rule: the K/V of the accepted tree slots ``prefix + nodes`` (in tree order)
    move to ``prefix + 0 .. len(nodes) - 1``, right behind the prefix. Returns (source, destination)."""
    return prefix + nodes, prefix + torch.arange(nodes.numel(), device=nodes.device)


def compact_cache(cache: Cache, prefix_len: int, nodes: torch.Tensor, tree_len: int) -> None:
    """Keep the KV entries of the accepted tree nodes, in order, right after the prefix; drop the rest.

    Gather first (source and target ranges overlap), then write; then a dynamic cache is cropped
    (crop(-n) removes n) and a static one's length is set (its slots beyond are masked anyway).
    When ``nodes`` (on the host) are already 0..n-1, the entries are in place and only the crop runs:
    that is every step that accepts nothing, and every one that accepts only the first child.
    When only the last one is out of place (e.g. [0, 2]: a later sibling accepted at the last
    depth), that one slot is copied per layer instead of gathering all of them.
    """
    n = int(nodes.numel())
    in_place = nodes.device.type == "cpu" and torch.equal(nodes, torch.arange(n, dtype=nodes.dtype))
    last_only = (
        not in_place
        and nodes.device.type == "cpu"
        and n > 0
        and torch.equal(nodes[:-1], torch.arange(n - 1, dtype=nodes.dtype))
    )
    if last_only:
        # src > dst: nodes are in tree order
        src, dst = prefix_len + int(nodes[-1]), prefix_len + n - 1
        for layer in cache.layers:
            layer.keys[..., dst, :] = layer.keys[..., src, :]
            layer.values[..., dst, :] = layer.values[..., src, :]
    keep_on: dict[torch.device, torch.Tensor] = {}
    for layer in cache.layers if not (in_place or last_only) else ():
        # layers may sit on different devices (device_map="auto")
        dev = layer.keys.device
        if dev not in keep_on:
            keep_on[dev] = moved_slots(prefix_len, nodes.to(dev))[0]
        k = layer.keys.index_select(-2, keep_on[dev])
        v = layer.values.index_select(-2, keep_on[dev])
        layer.keys[..., prefix_len : prefix_len + n, :] = k
        layer.values[..., prefix_len : prefix_len + n, :] = v
    if is_static(cache):
        for layer in cache.layers:
            layer.cumulative_length.fill_(prefix_len + n)
    elif tree_len > n:
        cache.crop(-(tree_len - n))
