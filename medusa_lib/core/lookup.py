"""Lookup branch: n-gram proposals from the context, verified in the same tree step as the heads.

Prompt lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``) drafts the tokens
that followed an earlier occurrence of the text's last few tokens. Chat answers repeat themselves
and their prompt (names, code identifiers, list patterns, phrases the question used), and there the
heads, which see one hidden state, are weakest. A step verifies the heads' tree plus this chain
under the same root (``tree.with_lookup``); acceptance is unchanged (the longest path the base model
agrees with wins), so greedy output still equals plain greedy decoding.
"""

from __future__ import annotations

import torch

DEFAULT_LOOKUP = 4  # branch length used when heads ship no calibrated one (simulated best of 2-4 on held-out answers)
MAX_LOOKUP = 8  # longest lookup branch a decoder takes
MAX_NGRAM = 4  # longest suffix n-gram looked up (longer matches are tried first)
MIN_NGRAM = 2  # shortest; single-token matches propose too often and are mostly wrong


def is_length(n) -> bool:
    """A valid lookup-branch length: a whole number from 0 (off) to MAX_LOOKUP (booleans are not)."""
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_LOOKUP


def ngram_proposal(
    history: torch.Tensor, *, length: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM
) -> torch.Tensor:
    """Up to ``length`` tokens that followed the most recent earlier occurrence of the longest
    suffix of ``history`` (1-D token ids; its last token is the next step's root) with
    ``min_ngram`` <= n <= ``max_ngram`` tokens. Empty when no such n-gram occurred before or
    ``length`` is 0. Near the end of ``history`` the proposal may be shorter than ``length``."""
    if min_ngram < 1 or max_ngram < min_ngram:
        raise ValueError(f"Need 1 <= min_ngram <= max_ngram (got {min_ngram}, {max_ngram}).")
    n_tok = history.numel()
    if length < 1:
        return history[:0]
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        # windows starting at 0 .. n_tok - 1 - n: each one is followed by at least one token, and
        # the suffix itself (starting at n_tok - n) is not among them
        windows = history[: n_tok - 1].unfold(0, n, 1)
        hits = (windows == history[n_tok - n :]).all(-1).nonzero()
        if hits.numel():
            start = int(hits[-1, 0]) + n
            return history[start : start + length]
    return history[:0]
