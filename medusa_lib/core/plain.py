"""Plain decoding, as ``model.generate`` makes it: the baseline every Medusa method is held against.

The stock call of the model, one token a step over transformers' ``DynamicCache``, with the same
sampling (``acceptance.sample_token``: greedy, or a draw keyed by the seed and the position) and the
same cut (``Decoder.finish``) as the Medusa steps, so plain greedy == Medusa greedy ==
``model.generate`` token for token. ``decoding.Decoder`` runs it for ``method="plain"`` on the
dynamic cache; the static engine runs plain decoding as the root-only tree step (``fused.py``).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterator

import torch

from .acceptance import sample_token
from .steps import Step, sync


def plain_steps(dec, ids: torch.Tensor, kv) -> Iterator[Step]:
    """Plain decoding of the prompt ``ids`` [1, n] on ``dec``'s model into ``kv`` (a ``kv.DynamicKV``): one token a
    step, greedy or drawn with ``dec.config``'s seed, each cut where ``dec.finish`` says; step 0 is the prefill."""
    cfg, dev = dec.config, dec.device
    draw = dict(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)
    seq_len = ids.shape[1]
    t0 = sync(dev)
    logits = dec.model(
        input_ids=ids,
        position_ids=torch.arange(seq_len, device=dev)[None],
        past_key_values=kv.cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[0, -1]
    token = sample_token(logits, position=seq_len, **draw)
    new, reason = dec.finish([int(token)], 0, seq_len)
    yield dec.prefill_step(new, reason, t0, kv)
    produced, seq_len, index = len(new), seq_len + len(new), 1
    while reason is None:
        t0 = sync(dev)
        # the stock call, as model.generate makes it
        pos = torch.tensor([[seq_len - 1]], device=dev)
        logits = dec.model(
            input_ids=token.view(1, 1).to(dev), position_ids=pos, past_key_values=kv.cache, use_cache=True
        ).logits[0, -1]
        t1 = sync(dev)
        token = sample_token(logits, position=seq_len, **draw)
        new, reason = dec.finish([int(token)], produced, seq_len)
        t2 = sync(dev)
        yield Step(
            index,
            tuple(new),
            t2 - t0,
            MappingProxyType({"verify": t1 - t0, "accept": t2 - t1}),
            accept_length=0,
            finish_reason=reason,
        )
        produced, seq_len, index = produced + len(new), seq_len + len(new), index + 1
