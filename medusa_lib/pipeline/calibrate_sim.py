"""Tokens/step of greedy Medusa with a tree, simulated on the base model's own answers (no decoding).

The accuracy answers walked as greedy decoding would walk them: each step's tree drafted by the
heads and accepted against the answer's own next tokens; with a lookup length, the lookup branch
(``core/lookup.py``) is one more path. No independence assumption, no decoding: step for step what
decoding does wherever decoding reproduces the answer, which a test checks in float32
(tests/test_calibrate.py). ``calibrate.py`` prints it beside the expected and the measured tokens/step.
"""

from __future__ import annotations

import torch

from ..core.heads import MedusaHeads
from ..core.lookup import ngram_proposal
from ..core.model import body_and_lm_head
from .calibrate_accuracy import answer_states


@torch.inference_mode()
def simulated_accepts(
    model, heads: MedusaHeads, trees: dict, records: list[dict], *, states: list | None = None, lookup: int = 0
) -> dict[str, list[torch.Tensor]]:
    """Per tree, per record: the candidates greedy verification would accept at every answer position.

    At position t (root x_{t+1}, the answer's next token) the heads draft the tree from h_t, and a
    root-to-leaf path is accepted as far as its tokens are x_{t+2}, x_{t+3}, ... (the base model's
    own greedy continuation, for greedy answers); the longest run over the paths counts. With
    ``lookup`` > 0 the lookup branch (``lookup.ngram_proposal`` over the prompt and the answer up to
    the root) is one more path.
    """
    _, lm_head = body_and_lm_head(model)
    embed = model.get_input_embeddings()
    out: dict[str, list[torch.Tensor]] = {name: [] for name in trees}
    chains: list[torch.Tensor] = []
    for seq, start, h in states if states is not None else answer_states(model, records):
        # x_{t+1} of each position t from start on
        answer = torch.tensor(seq[start + 1 :], dtype=torch.long)
        n = answer.numel()
        if lookup:
            chains.append(lookup_accepts(seq, start, lookup))
        for name, tree in trees.items():
            D = tree.depth
            # [n, D]: x_{t+2} .. x_{t+D+1}
            truth = torch.cat([answer, torch.full((D + 1,), -1)]).unfold(0, D, 1)[1 : n + 1]
            tokens = heads.draft(h[:n], lm_head, tree, answer.to(h.device), embed).cpu()  # [n, L]
            ri = tree.retrieve_indices.cpu()
            # the candidates along each root-to-leaf path
            path = tokens[:, ri[:, 1:].clamp(min=0)]  # [n, P, D]
            match = (path == truth[:, None, :]) & (ri[:, 1:] >= 0)
            out[name].append(match.long().cumprod(-1).sum(-1).max(-1).values)
    return merge_lookup(out, chains) if lookup else out


def merge_lookup(accepts: dict[str, list[torch.Tensor]], chains: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """Per tree and record, the longer of the tree's accepted run and the lookup branch's
    (:func:`lookup_accepts`, one tensor per record): the branch is one more path."""
    return {name: [torch.maximum(a, c) for a, c in zip(per_record, chains)] for name, per_record in accepts.items()}


def lookup_accepts(seq: list[int], start: int, length: int) -> torch.Tensor:
    """[n]: at each answer position (root seq[start + 1 + i]), how many leading tokens of the lookup
    branch's proposal are the sequence's own next tokens."""
    full = torch.tensor(seq, dtype=torch.long)
    out = torch.zeros(len(seq) - start - 1, dtype=torch.long)
    for i in range(out.numel()):
        root = start + 1 + i
        prop = ngram_proposal(full[: root + 1], length=length)
        truth = full[root + 1 : root + 1 + prop.numel()]
        m = prop[: truth.numel()] == truth
        out[i] = int(m.long().cumprod(0).sum())
    return out


def simulated_tokens_per_step(
    model, heads: MedusaHeads, trees: dict, records: list[dict], *, states: list | None = None, lookup: int = 0
) -> dict[str, float]:
    """Tokens/step of greedy Medusa on the answers, simulated: walk each answer as decoding would
    (the prefill gives its first token; a step rooted at answer position i accepts
    :func:`simulated_accepts` [i] candidates plus the bonus token, and the next step is rooted
    where that leaves off), then decoded tokens over steps, as ``RunResult.tokens_per_step``.
    (Averaging 1 + accepts over *all* positions instead would overstate it: easy stretches give
    long runs but are visited by few steps.)"""
    return walked_tokens_per_step(simulated_accepts(model, heads, trees, records, states=states, lookup=lookup))


def walked_tokens_per_step(accepts: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """The walk of :func:`simulated_tokens_per_step` over accepts already simulated."""
    out = {}
    for name, per_record in accepts.items():
        tokens = steps = 0
        for a in per_record:
            a, n, i = a.tolist(), len(a), 0
            while i < n - 1:
                emitted = min(a[i] + 1, n - 1 - i)
                tokens, steps, i = tokens + emitted, steps + 1, i + emitted
        out[name] = tokens / steps if steps else 1.0
    return out
