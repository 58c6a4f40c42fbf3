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

# longest suffix n-gram looked up (longer matches are tried first)
MAX_NGRAM = 4
# shortest; single-token matches propose too often and are mostly wrong
MIN_NGRAM = 2


def ngram_match(
    history: torch.Tensor, seq_len: torch.Tensor, *, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM
) -> torch.Tensor:
    """[1] where the tokens after the latest earlier occurrence of the longest suffix n-gram of
    ``history[:seq_len]`` start (``min_ngram`` <= n <= ``max_ngram``), -1 when none occurred.
    ``history`` may run past ``seq_len`` (a fixed-size buffer); ``seq_len`` [1] is a tensor, so a
    captured step matches on the device with no host read."""
    dev = history.device
    start = torch.full((1,), -1, dtype=torch.long, device=dev)
    for n in range(max_ngram, min_ngram - 1, -1):
        if history.numel() < n:
            continue
        suffix = history.gather(0, (seq_len - n + torch.arange(n, device=dev)).clamp(min=0))
        windows = history.unfold(0, n, 1)  # [H - n + 1, n]
        s = torch.arange(windows.shape[0], device=dev)
        # each window is followed by at least one token, and the suffix itself is not among them
        hit = (windows == suffix).all(-1) & (s <= seq_len - 1 - n)
        last = torch.where(hit, s, -1).max().view(1)
        start = torch.where((start < 0) & (last >= 0), last + n, start)
    return start


def lookup_chain(history: torch.Tensor, seq_len: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The lookup chain of a fixed shape (``length`` nodes), as a captured step verifies it: the
    tokens after the match in ``history[:seq_len]`` (``ngram_match``), then whatever the history
    holds there. Returns (chain [length], matched [1]): only the first ``matched`` nodes hold the
    match; the rest are dead this step (never accepted: ``fused.Program``), so the step reads as the
    dynamic decoder's chain of ``matched`` nodes (``ngram_proposal``). No host read."""
    j = torch.arange(length, device=history.device)
    start = ngram_match(history, seq_len)
    matched = torch.where(start >= 0, (seq_len - start).clamp(0, length), 0)
    return history.gather(0, (start.clamp(min=0) + j).clamp(max=history.numel() - 1)), matched


def ngram_proposal(
    history: torch.Tensor, *, length: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM
) -> torch.Tensor:
    """Up to ``length`` tokens that followed the most recent earlier occurrence of the longest
    suffix of ``history`` (1-D token ids; its last token is the next step's root) with
    ``min_ngram`` <= n <= ``max_ngram`` tokens (``ngram_match``). Empty when no such n-gram
    occurred before or ``length`` is 0. Near the end of ``history`` it may be shorter."""
    if min_ngram < 1 or max_ngram < min_ngram:
        raise ValueError(f"Need 1 <= min_ngram <= max_ngram (got {min_ngram}, {max_ngram}).")
    if length < 1:
        return history[:0]
    n_tok = torch.tensor([history.numel()], device=history.device)
    start = int(ngram_match(history, n_tok, max_ngram=max_ngram, min_ngram=min_ngram))
    return history[start : start + length] if start >= 0 else history[:0]
