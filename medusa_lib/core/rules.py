"""The rules of one verify step, written once as tensor functions.

The dynamic decoder (``decoding.py``) and the static engine's whole-step program (``fused.py``)
call the same functions: ``accept`` (greedy, typical or exact sampling, and the bonus token) and
``cut`` (the new-token budget, the context and EOS). Neither reads the host inside, so a captured
step holds them whole; the dynamic decoder reads their small results back.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .acceptance import draw, greedy_accept, greedy_tokens, nucleus, tempered_probs, typical_accept, walk

# finish reason codes of ``cut``
REASONS = (None, "eos", "length", "context")


class Rule(NamedTuple):
    """How a step accepts: ``name`` "greedy", "typical" or "sample"; ``nucleus``: top-p applies to
    its draws; ``sample_root``: the bonus token is a draw (typical acceptance with a sampled root)."""

    name: str
    nucleus: bool = False
    sample_root: bool = False


def rule_of(method: str, config) -> Rule:
    """The rule of a decoder's steps (plain decoding is the root-only tree under the same rules)."""
    sampled = config.temperature > 0
    if sampled and method in ("plain", "medusa-sample"):
        return Rule("sample", config.top_p < 1, False)
    if sampled and method == "medusa-typical":
        return Rule("typical", config.sample_root and config.top_p < 1, config.sample_root)
    return Rule("greedy")


class Knobs(NamedTuple):
    """The settings the rules read: Python numbers (dynamic decoder) or device scalars (static step)."""

    temperature: float | torch.Tensor
    top_p: float | torch.Tensor
    seed: int | torch.Tensor
    epsilon: float | torch.Tensor
    delta: float | torch.Tensor


def knobs_of(config) -> Knobs:
    return Knobs(config.temperature, config.top_p, config.seed, config.posterior_threshold, config.posterior_alpha)


def accept(
    rule: Rule,
    logits: torch.Tensor,
    tokens: torch.Tensor,
    paths: torch.Tensor,
    valid: torch.Tensor,
    children: torch.Tensor | None,
    *,
    knobs: Knobs,
    seq_len: int | torch.Tensor,
    early: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Acceptance over a verified tree: logits [L, V] after every node, tokens [L], paths [P, D+1]
    (retrieve_indices, padding clamped to 0) with ``valid`` [P, D+1], children [L, W] (read by
    exact sampling only).

    Greedy and typical: per root-to-leaf path the leading candidates that pass, the best path wins
    (first on ties), then the bonus token after its last node (argmax, or a draw at
    ``seq_len + n``). Exact sampling walks the tree draw by draw (``acceptance.walk``); its path is
    reported as the first row that starts with it. Returns (n [1] accepted candidates, nodes
    [D + 1] from the root, 0 past the n-th, best row [1], bonus token [1])."""
    k = knobs
    if rule.name == "sample":
        depth = paths.shape[1] - 1
        n, nodes, bonus = walk(
            logits, tokens, children, depth=depth, temperature=k.temperature, top_p=k.top_p,
            use_nucleus=rule.nucleus, seed=k.seed, position=seq_len, early=early,
        )  # fmt: skip
        j = torch.arange(depth + 1, device=paths.device)
        best = ((paths == nodes[None]) | (j[None] > n)).all(dim=1).long().argmax().view(1)
        return n, nodes, best, bonus
    # token ids along every path
    path_tokens = tokens[paths]  # [P, D+1]
    # the greedy rule's argmax after every node, reused for the bonus
    argmax = None
    if rule.name == "typical":
        length, score = typical_accept(
            logits, path_tokens, paths, valid, temperature=k.temperature, epsilon=k.epsilon, delta=k.delta
        )
    else:
        argmax = greedy_tokens(logits)
        length, score = greedy_accept(logits, path_tokens, paths, valid, argmax=argmax)
    # first best path on ties
    best = score.argmax().view(1)
    n = length.gather(0, best)
    nodes = paths.index_select(0, best)[0]
    last = nodes.gather(0, n)
    if rule.sample_root:
        probs = tempered_probs(logits.index_select(0, last), k.temperature)
        bonus = draw(nucleus(probs, k.top_p) if rule.nucleus else probs, k.seed, seq_len + n)
    else:
        bonus = argmax.gather(0, last) if argmax is not None else greedy_tokens(logits.index_select(0, last))
    return n, nodes, best, bonus


def cut(
    emitted: torch.Tensor, n: torch.Tensor, *, budget: torch.Tensor, context: torch.Tensor, eos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a step's tokens stop, as plain decoding would have stopped: ``emitted`` [W] are the
    accepted candidates then the bonus (n + 1 tokens, -1 after), ``budget`` / ``context`` the new
    tokens and context slots left, ``eos`` [E] the stop tokens (-1: none). First the cut to the room
    left, then at the first EOS inside it: a multi-token step never writes past either limit.
    Returns (count [1] of tokens kept, reason [1]: an index into ``REASONS``)."""
    j = torch.arange(emitted.numel(), device=emitted.device)
    room = torch.minimum(budget, context).view(1)
    count = torch.minimum(n + 1, room)
    is_eos = (emitted[:, None] == eos[None]).any(-1) & (j < count)
    has_eos = is_eos.any().view(1)
    first = torch.where(is_eos, j, emitted.numel()).min().view(1)
    reason = torch.where(has_eos, 1, torch.where(n + 1 >= room, torch.where(budget <= context, 2, 3), 0))
    return torch.where(has_eos, first + 1, count), reason


__all__ = ["REASONS", "Knobs", "Rule", "accept", "cut", "knobs_of", "rule_of"]
