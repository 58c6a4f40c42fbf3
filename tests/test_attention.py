"""Packed grouped-query attention: the same logits as transformers' sdpa, with the query heads folded."""

import pytest
import torch
import torch.nn.functional as F
from conftest import make_model

import medusa_lib.core.attention as attention
from medusa_lib.core.attention import NAME, use_packed_gqa
from medusa_lib.core.caches import new_cache
from medusa_lib.core.model import check_supported


def tree_mask(prefix: int, L: int, dtype, seed: int = 0) -> torch.Tensor:
    """A random ancestor pattern (each node sees itself and some earlier nodes) after a full prefix."""
    g = torch.Generator().manual_seed(seed)
    see = (torch.rand(L, L, generator=g) < 0.5).tril()
    see.fill_diagonal_(True)
    bias = torch.zeros(L, L, dtype=dtype).masked_fill(~see, torch.finfo(dtype).min)
    return torch.cat([torch.zeros(L, prefix, dtype=dtype), bias], 1)[None, None]


@pytest.fixture
def spy(monkeypatch):
    """Shapes of the SDPA calls the packed function makes itself (the folded path)."""
    calls = []
    real = F.scaled_dot_product_attention

    def sdpa(q, k, v, **kw):
        calls.append(
            (tuple(q.shape), tuple(k.shape), None if kw.get("attn_mask") is None else tuple(kw["attn_mask"].shape))
        )
        return real(q, k, v, **kw)

    monkeypatch.setattr(attention, "F", type("F", (), {"scaled_dot_product_attention": staticmethod(sdpa)}))
    return calls


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # 4 query heads on 2 KV heads; on 1 KV head
@torch.inference_mode()
def test_same_logits_as_sdpa_for_prefill_tree_and_single_steps(arch, spy):
    stock, packed = make_model(arch), make_model(arch)
    assert use_packed_gqa(packed) and packed.config._attn_implementation == NAME
    check_supported(packed)  # takes tree masks like sdpa
    ids = torch.randint(3, 300, (1, 23))
    cs, cp = new_cache(), new_cache()
    torch.testing.assert_close(
        packed(input_ids=ids, past_key_values=cp).logits,
        stock(input_ids=ids, past_key_values=cs).logits,
        rtol=0,
        atol=1e-6,
    )
    assert spy == []  # the causal prefill stays on the stock path
    L = 7
    mask, pos, tree_ids = tree_mask(23, L, torch.float32), torch.arange(23, 23 + L)[None], torch.randint(3, 300, (1, L))
    got = packed(input_ids=tree_ids, attention_mask=mask, position_ids=pos, past_key_values=cp).logits
    want = stock(input_ids=tree_ids, attention_mask=mask, position_ids=pos, past_key_values=cs).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    heads, kv = packed.config.num_attention_heads, packed.config.num_key_value_heads
    n_rep = heads // kv
    assert spy[0] == ((1, kv, n_rep * L, 16), (1, kv, 23 + L, 16), (1, 1, n_rep * L, 23 + L))  # folded: no repeat_kv
    one = torch.randint(3, 300, (1, 1))
    got = packed(
        input_ids=one, position_ids=torch.tensor([[30]]), past_key_values=cp
    ).logits  # no mask: a plain decode step
    want = stock(input_ids=one, position_ids=torch.tensor([[30]]), past_key_values=cs).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert spy[-1] == ((1, kv, n_rep, 16), (1, kv, 31, 16), None)


@torch.inference_mode()
def test_batched_generate_with_padding_is_unchanged(spy):
    stock, packed = make_model("llama"), make_model("llama")
    assert use_packed_gqa(packed)
    ids = torch.randint(3, 300, (2, 9))
    att = torch.ones_like(ids)
    att[1, :4] = 0  # left padding
    kw = dict(attention_mask=att, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(packed.generate(ids, **kw), stock.generate(ids, **kw))
    assert all(
        m is not None and m[:3] == (2, 1, q[2]) for q, _, m in spy
    )  # padded prefill and decode steps folded, with the mask tiled
    assert sum(q[2] == 2 for q, _, _ in spy) == 11 * 2  # 11 one-token decode steps x 2 layers


@pytest.mark.parametrize("mask_heads", [1, 4])  # one mask for all heads; one per query head
@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bool])
def test_folded_attention_equals_repeated_kv_attention(mask_heads, mask_dtype):
    from transformers.integrations.sdpa_attention import repeat_kv

    g = torch.Generator().manual_seed(0)
    B, H, H_kv, L, K, D = 2, 4, 2, 3, 11, 8
    q, k, v = (
        torch.randn(B, H, L, D, generator=g),
        torch.randn(B, H_kv, K, D, generator=g),
        torch.randn(B, H_kv, K, D, generator=g),
    )
    see = torch.rand(B, mask_heads, L, K, generator=g) < 0.7
    see[..., 0] = True  # every row sees something
    mask = see if mask_dtype == torch.bool else torch.zeros(see.shape).masked_fill(~see, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    module.num_key_value_groups = H // H_kv
    got, _ = attention.packed_gqa_attention(module, q, k, v, mask, scaling=0.3)
    want = F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask, scale=0.3).transpose(
        1, 2
    )
    assert got.shape == (B, L, H, D)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_models_without_gqa_or_sdpa_keep_their_attention():
    gpt2, eager = make_model("gpt2"), make_model("llama", attn="eager")
    assert not use_packed_gqa(gpt2) and gpt2.config._attn_implementation == "sdpa"
    assert not use_packed_gqa(eager) and eager.config._attn_implementation == "eager"
