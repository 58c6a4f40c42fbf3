"""Head accuracy on the base model's own answers (Medusa paper, App. C; reference ``gen_results.py``).

acc[k][r] = P(head k's rank-r token is the base model's next-but-k token), measured on the base
model's own greedy answers to calibration prompts the heads were not trained on (path-conditioned
heads read the answer's own tokens as their branch: acc[k][r] is then the probability given a
correct branch, which is what a tree path needs). ``calibrate.py`` grows its greedy trees from it;
the answers' final hidden states (``answer_states``) are computed once and shared with the
simulation (``calibrate_sim.py``).
"""

from __future__ import annotations

import sys

import torch
from tqdm import tqdm

from ..core.heads import MedusaHeads
from ..core.model import body_and_lm_head, input_device
from ..core.tree.shape import TOPK


@torch.inference_mode()
def answer_states(model, records: list[dict]) -> list[tuple[list[int], int, torch.Tensor]]:
    """(sequence, start, h) per record: h [n, d] are the final hidden states from the last prompt
    position ``start`` (it predicts the first answer token) to the end. Computed once and shared by
    :func:`head_accuracy` and :func:`simulated_accepts` (pass it as ``states``)."""
    body, _ = body_and_lm_head(model)
    device = input_device(model)
    out = []
    for r in tqdm(records, desc="hidden states of the answers", unit="answer", file=sys.stdout, leave=False):
        seq = list(r["prompt_ids"]) + list(r["answer_ids"])
        start = len(r["prompt_ids"]) - 1
        out.append((seq, start, body(input_ids=torch.tensor([seq], device=device)).last_hidden_state[0, start:]))
    return out


@torch.inference_mode()
def head_accuracy(
    model, heads: MedusaHeads, records: list[dict], *, topk: int = TOPK, states: list | None = None
) -> torch.Tensor:
    """acc [K, topk]: fraction of answer positions where head k's rank-r token is the true x_{t+k+1}."""
    _, lm_head = body_and_lm_head(model)
    device = input_device(model)
    K = heads.num_heads
    hits = torch.zeros(K, topk)
    counts = torch.zeros(K)
    embed = model.get_input_embeddings()
    for seq, start, h in states if states is not None else answer_states(model, records):
        # x_{t+1}, x_{t+2}, ... after each h_t
        after = torch.tensor(seq[start + 1 :] + [0] * K, device=device)
        n_pos = h.shape[0]
        # the root x_{t+1} (root-conditioned heads)
        roots = after[:n_pos]
        # [n, K-1]: the true branch (teacher forcing)
        path = (
            torch.stack([after[j : j + n_pos] for j in range(1, K)], dim=1)
            if heads.path_conditioned and K > 1
            else None
        )
        ids = heads.propose(
            h,
            lm_head,
            topk=topk,
            root_emb=heads.root_embedding(embed, roots),
            path_emb=None if path is None else embed.weight[path],
        ).cpu()  # [n, K, topk]
        for k in range(1, K + 1):
            # positions t with a target x_{t+k+1}
            n = len(seq) - start - k - 1
            if n <= 0:
                continue
            target = torch.tensor(seq[start + k + 1 :])[:n]
            match = ids[:n, k - 1] == target[:, None]  # [n, topk]
            hits[k - 1] += match.float().sum(0)
            counts[k - 1] += n
    return hits / counts.clamp(min=1)[:, None]
