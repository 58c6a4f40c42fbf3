"""EAGLE's training loss with training-time test, and acceptance simulated on held-out answers.

The loss (``eagle_loss``) unrolls the drafter ``steps`` times, as EAGLE-3's training-time test does
(arXiv 2503.01840, Sec. 3.2; reference SafeAILab/EAGLE ``eagle/traineagle3/cnets.py``): step 0 reads
the verified input at every position t (f_t, or the fused layer inputs) beside x_{t+1}; step j >= 1
reads the drafter's own output g of step j - 1 at t beside x_{t+1+j}, at position t + j, attending
to the verified entries 0..t of step 0 and to its own entries at t in steps 1..j (a diagonal each),
which is exactly what the drafted node at depth j + 1 sees at run time. Each step's outputs are
scored against the base model's distribution of x_{t+2+j} (softmax of lm_head(f_{t+1+j}) over the
proposal vocabulary) and, for EAGLE-1, regress f_{t+1+j}; step j is weighted 0.8^j (reference).
``steps=1`` is EAGLE-1's teacher-forced loss.

``simulated_acceptance`` measures what a checkpoint is kept for: greedy decoding of held-out
distilled answers (the base model's own greedy answers, so the tokens after every position are
what greedy verification would accept) with the dynamic tree, from the cached features, without
running the base model: tokens per step, and the acceptance rate per depth.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..core.device import cpu_has_native_bf16
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.eagle import EagleHead
from ..core.eagle_run import EagleRun
from ..core.spec_metrics import acceptance
from .feature_cache import FeatureCache

# weight of the token loss beside the feature loss (reference p_w, EAGLE-1)
TOKEN_WEIGHT = 0.1
# weight of training-time test step j: STEP_DECAY ** j (reference)
STEP_DECAY = 0.8


def batches(cache: FeatureCache, order: list[int], batch_tokens: int) -> list[list[int]]:
    """Sequences grouped (in ``order``) into batches of about ``batch_tokens`` padded tokens."""
    out, cur, width = [], [], 0
    for i in order:
        n = int(cache.offsets[i + 1] - cache.offsets[i])
        if cur and max(width, n) * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    return out + ([cur] if cur else [])


def _step_mask(T: int, step: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, T, (step + 1) T] additive mask of training-time test step ``step``: causal over step 0's
    entries, then each later step's entry at the same position (its drafted ancestors and itself)."""
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    eye = torch.eye(T, dtype=torch.bool)
    seen = torch.cat([causal] + [eye] * step, dim=1)
    return torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)[None, None]


def unrolled(head: EagleHead, inputs: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The drafter's outputs g [B, T, d] of training-time test steps 0 .. steps - 1 (module doc):
    ``inputs`` [B, T, d] the verified inputs at positions 0..T-1, ``tokens`` [B, T + steps - 1] from x_1."""
    from transformers import DynamicCache

    B, T, _ = inputs.shape
    t = torch.arange(T, device=inputs.device)[None]
    kv, h, out = DynamicCache(), inputs, []
    for j in range(steps):
        mask = _step_mask(T, j, h.dtype).to(h.device)
        g = head(h, tokens[:, j : j + T], (t + j).expand(B, T), attention_mask=mask, cache=kv)
        out.append(g)
        h = g
    return out


def eagle_loss(
    head: EagleHead, proj: torch.Tensor, cache: FeatureCache, batch: list[int], *, noise: float, steps: int = 1
) -> tuple[torch.Tensor, dict]:
    """The loss on one padded batch (module doc); metrics of step 0 and the top-1 of every step."""
    fused = bool(head.config.fuse_layers)
    seqs = [cache.seq(i) for i in batch]
    B, W = len(seqs), max(len(ids) for _, ids, _ in seqs)
    T = W - 1
    d = cache.features.shape[1]
    f = torch.zeros(B, W + steps, d)
    ids = torch.zeros(B, W + steps, dtype=torch.long)
    first, length = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
    layers = torch.zeros(B, T, cache.layers.shape[1], d) if fused else None
    for r, (feat, tok, p) in enumerate(seqs):
        n = len(tok)
        f[r, :n], ids[r, :n] = feat.float(), tok
        if fused:
            layers[r, : n - 1] = cache.seq_layers(batch[r])[: n - 1].float()
        # t >= the last prompt token: the positions a decode drafts from
        first[r], length[r] = max(p - 1, 0), n
    # assembled on the CPU (the cache lives there), then moved once
    dev = proj.device
    f, ids, first, length = f.to(dev), ids.to(dev), first.to(dev), length.to(dev)
    layers = layers.to(dev) if fused else None
    t = torch.arange(T, device=dev)[None]
    # bfloat16 autocast on a GPU and on a CPU with native bfloat16 (emulated bfloat16 is far slower than float32)
    native = dev.type == "cuda" or cpu_has_native_bf16()
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=native):
        h = head.draft_input(layers) if fused else f[:, :T]
        if noise:
            h = h + (torch.rand(B, T, d).to(dev) - 0.5) * noise
        total, out = 0.0, {}
        for j, g in enumerate(unrolled(head, h, ids[:, 1 : T + steps], steps)):
            # a target x_{t+2+j} exists
            valid = (t >= first[:, None]) & (t + 1 + j < length[:, None])
            if not valid.any():
                break
            target = f[:, 1 + j : 1 + j + T][valid]
            gv = g[valid].float()
            logq = torch.log_softmax((gv @ proj.T).float(), -1)
            with torch.no_grad():
                p = torch.softmax((target @ proj.T).float(), -1)
            ploss = -(p * logq).sum(-1).mean()
            vloss = F.smooth_l1_loss(gv, target) if not fused else torch.zeros(())
            step_loss = vloss + TOKEN_WEIGHT * ploss if not fused else ploss
            total = total + STEP_DECAY**j * step_loss
            with torch.no_grad():
                out[f"top1_{j}"] = float((logq.argmax(-1) == p.argmax(-1)).float().mean())
            if j == 0:
                out.update(vloss=float(vloss.detach()), ploss=float(ploss.detach()), n=int(valid.sum()))
    out["top1"] = out["top1_0"]
    return total, out


@torch.no_grad()
def teacher_forced(head: EagleHead, proj: torch.Tensor, cache: FeatureCache, groups: list[list[int]]) -> dict:
    """Held-out loss and top-1 agreement of step 0 (no noise), weighted by positions."""
    was = head.training
    head.eval()
    tot = {"vloss": 0.0, "ploss": 0.0, "top1": 0.0, "n": 0}
    for b in groups:
        _, m = eagle_loss(head, proj, cache, b, noise=0.0)
        for k in ("vloss", "ploss", "top1"):
            tot[k] += m[k] * m["n"]
        tot["n"] += m["n"]
    head.train(was)
    return {k: tot[k] / max(tot["n"], 1) for k in ("vloss", "ploss", "top1")}


def accepted_length(tokens: torch.Tensor, retrieve: torch.Tensor, truth: torch.Tensor) -> int:
    """The longest root-to-node path of a tree (``tokens`` [L], ``retrieve`` [L, depth + 1]) whose
    drafted tokens equal ``truth`` [depth] from the start: greedy verification's accept length."""
    depth = retrieve.shape[1] - 1
    idx = retrieve[:, 1:]
    path = tokens[idx.clamp(min=0)]
    ok = (path == truth[:depth][None]) & (idx >= 0)
    return int(ok.long().cumprod(1).sum(1).max())


@torch.no_grad()
def simulated_lengths(
    head: EagleHead, cache: FeatureCache, i: int, tree: DynamicTreeConfig, clock: list[float] | None = None
) -> list[int]:
    """The accept length of every full greedy step over sequence ``i``'s answer (module doc); with
    ``clock``, each step's drafter seconds (its draft, then the extend by the accepted tokens) go there."""
    f, ids, p = cache.seq(i)
    feats = cache.seq_layers(i).float() if head.config.fuse_layers else f.float()
    ids = ids.to(head.fc.weight.device)
    run, lengths = EagleRun(head, tree), []
    run.extend(feats[:p], ids[1 : p + 1], 0)
    # the root: the newest committed token, whose feature is not verified yet
    pos = p
    # a full step: every depth has a true token after it
    while pos + tree.depth < len(ids):
        t0 = time.perf_counter()
        drafted = run.draft(ids[pos])
        spent = time.perf_counter() - t0
        a = accepted_length(drafted.tokens, drafted.retrieve_indices, ids[pos + 1 : pos + 1 + tree.depth])
        lengths.append(a)
        # the answer ends inside the accepted path: no bonus token, no next step
        if pos + a + 2 > len(ids):
            break
        t0 = time.perf_counter()
        run.extend(feats[pos : pos + a + 1], ids[pos + 1 : pos + a + 2], pos)
        if clock is not None:
            clock.append(spent + time.perf_counter() - t0)
        pos += a + 1
    return lengths


@torch.no_grad()
def simulated_acceptance(head: EagleHead, cache: FeatureCache, seqs: list[int], tree: DynamicTreeConfig) -> dict:
    """Greedy decoding of held-out answers with the dynamic tree, from cached features (module doc)."""
    was = head.training
    head.eval()
    lengths = [a for i in seqs for a in simulated_lengths(head, cache, i, tree)]
    head.train(was)
    return depth_rates(lengths, tree.depth)


def depth_rates(lengths: list[int], depth: int, digits: int = 4) -> dict:
    """Tokens/step and the rates per depth of greedy steps' accept lengths, every step a draft
    (``core/spec_metrics.acceptance``): the share accepting >= k, and the k-th given k - 1 (0 where undefined)."""
    a = acceptance(lengths, depth=depth)
    return {
        "tokens_per_step": round(a.mean_acceptance_length or 1.0, digits),
        "steps": a.steps,
        "accepted_at_least": [round(x, digits) for x in a.rates or (0.0,) * depth],
        "accept_rate_per_depth": [round(x or 0.0, digits) for x in a.given_previous or (0.0,) * depth],
    }
