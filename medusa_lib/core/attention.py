"""Grouped-query attention without copying the KV cache, for CPU decoding.

Most small chat models use grouped-query attention (GQA): ``n_rep`` query heads share one
key/value head (SmolLM2-135M: 9 query heads, 3 KV heads). Stock transformers' ``sdpa`` path has
three ways to run it, and on CPU two of them are slow (measured here with SmolLM2-135M in bfloat16
and a long cache: docs/performance.md):

* one query, no mask (every plain decode step, ``model.generate`` included): SDPA with
  ``enable_gqa=True``, slow;
* one query with a mask: the query heads are folded onto the KV heads (``pack_gqa``), fast;
* several queries with a mask (every Medusa tree step): ``repeat_kv`` copies the whole cache
  to ``n_rep`` times its size in every layer, then attends: slow.

``packed_gqa_attention`` uses the fast fold for all of these: the ``n_rep`` query heads of a
group become ``n_rep * L`` query rows over that group's KV head, and the mask is tiled to match
(each row keeps its own query's mask row). Softmax is per row over the same keys, so the result
is the same attention, with no copy of the cache. Anything else (prefill with ``is_causal``,
dropout, position bias, a paged cache, no GQA) goes to the stock function unchanged.

It plugs in through transformers' own ``AttentionInterface`` (a registered attention function,
no modeling code touched), with the stock ``sdpa`` mask builder, so a model using it builds the
same masks and takes the same 4D tree masks as with ``sdpa``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# the attn_implementation name this module registers
NAME = "sdpa_packed_gqa"


def packed_gqa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [B, H, L, D], key/value [B, H_kv, K, D], mask [B, 1 or H, L, K] or None -> ([B, L, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n_rep = getattr(module, "num_key_value_groups", 1)
    B, H, L, D = query.shape
    mask = attention_mask
    foldable = (
        n_rep > 1
        # without a mask, L > 1 needs is_causal: rows cannot be folded
        and (mask is not None or L == 1)
        and dropout == 0.0
        and kwargs.get("position_bias") is None
        and kwargs.get("cache") is None
        and kwargs.get("softcap") is None
        and key.shape[1] * n_rep == H
        and (
            mask is None
            or (mask.dim() == 4 and mask.shape[1] in (1, H) and mask.shape[2] == L and mask.shape[3] == key.shape[2])
        )
    )
    if not foldable:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    H_kv = H // n_rep
    # Query head h = g * n_rep + r uses KV head g (repeat_kv's order): row r * L + l of group g.
    q = query.reshape(B, H_kv, n_rep * L, D)
    if mask is not None:
        Bm, K = mask.shape[0], mask.shape[3]
        if mask.shape[1] == 1:
            mask = mask[:, :, None].expand(Bm, 1, n_rep, L, K).reshape(Bm, 1, n_rep * L, K)
        else:
            mask = mask.reshape(Bm, H_kv, n_rep * L, K)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling, is_causal=False)
    return out.reshape(out.shape[0], H, L, value.shape[-1]).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the function (and the stock sdpa mask builder) under ``NAME``; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, packed_gqa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def uses_gqa(model: nn.Module) -> bool:
    cfg = model.config
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    return bool(heads and kv and kv < heads)


def use_packed_gqa(model: nn.Module) -> bool:
    """Switch an ``sdpa`` GQA model to ``packed_gqa_attention`` (same results, no KV copies). True if switched."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or not uses_gqa(model):
        return False
    model.set_attn_implementation(register())
    return True
