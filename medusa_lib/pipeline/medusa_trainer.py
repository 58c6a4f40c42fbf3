"""Medusa-1 heads trained on cached hidden states: the loss, its held-out evaluation and the training loop.

``Trainer.loss`` is the loss of ``train.py``: per head k, lambda_k = 0.8^k (the paper's Medusa-1
loss) times cross-entropy against the true token x_{t+k+1}, mixed with the base model's own
next-token distribution at t+k as a soft target (Hinton-style distillation), over the proposal
tokens; ``Trainer.evaluate`` adds per-head top-1/top-5 on held-out positions. ``train_heads`` runs
AdamW with a linear warm-up and cosine decay, keeps the heads with the best held-out loss, stops
early when it stops improving, and saves its state at every evaluation, so a run with the same
config and data resumes (``train_state.py`` reads the state back).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..core.device import cpu_has_native_bf16
from ..core.heads import MedusaHeads
from ..core.model import body_and_lm_head
from .hidden_cache import HiddenCache
from .train_state import read_train_state

# lambda_k = 0.8^k (paper)
DECAY = 0.8


@dataclass
class TrainConfig:
    num_heads: int = 4
    num_layers: int = 1
    shared_lm_head: bool = True
    # 0 = full vocabulary
    proposal_tokens: int = 8192
    # a: weight of the base model's distribution as a soft target
    soft_weight: float = 0.5
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 512  # positions per step
    epochs: int = 6
    # evaluations without held-out improvement before stopping
    patience: int = 2
    eval_every: int = 200  # steps
    seed: int = 0
    # heads also read the root token x_{t+1} (heads.py)
    root_conditioned: bool = False
    # Head k also reads x_{t+2}..x_{t+k}, teacher-forced (Hydra; implies root_conditioned).
    path_conditioned: bool = False
    # float type of the saved weights: float32 or bfloat16 (half the size)
    save_dtype: str = "float32"


class Trainer:
    def __init__(self, model, heads: MedusaHeads, cfg: TrainConfig, *, dtype=torch.bfloat16):
        self.model, self.heads, self.cfg = model, heads, cfg
        _, lm_head = body_and_lm_head(model)
        self.lm_head = lm_head
        # the GPU when there is one
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        heads.to(self.device)
        w = lm_head.weight.detach().float().cpu()
        # [V', d] frozen, shared
        self.proj = (w if heads.proposal_ids is None else w[heads.proposal_ids.cpu()]).to(self.device)
        # Column of each vocabulary id in the proposal set (-1 if outside it).
        self.column = torch.full((w.shape[0],), -1, dtype=torch.long)
        ids = torch.arange(w.shape[0]) if heads.proposal_ids is None else heads.proposal_ids
        self.column[ids.cpu()] = torch.arange(ids.numel())
        self.column = self.column.to(self.device)
        self.amp = dtype
        # Root-conditioned heads read these frozen input-embedding rows at each cache's x_{t+1} (HiddenCache.root_ids).
        self.embed = (
            model.get_input_embeddings().weight.detach().float().to(self.device) if heads.root_conditioned else None
        )

    def logits(self, z: torch.Tensor, own: bool, k: int | None = None) -> torch.Tensor:
        if own:
            return self.heads.heads[k][-1](z)
        return z @ self.proj.T.to(z.dtype)

    def loss(self, cache: HiddenCache, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Weighted loss over heads, and per-head top-1 / top-5 hit counts (with the valid counts)."""
        cfg, K = self.cfg, self.heads.num_heads
        own = not self.heads.config.shared_lm_head
        dev = self.device
        h = cache.hidden[idx].to(dev).float()
        root_emb = self.embed[cache.root_ids(self.lm_head)[idx].to(dev)] if self.embed is not None else None
        # Path-conditioned heads read the true branch x_{t+2}..x_{t+K}: the targets of heads 1..K-1
        # (teacher forcing; -1 past a sequence's end, where the later heads have no target either).
        path_emb = (
            self.embed[cache.next_ids[idx, : K - 1].clamp(min=0).to(dev)] if self.heads.path_conditioned else None
        )
        total = torch.zeros((), device=dev)
        hits = torch.zeros(K, 3)
        with torch.autocast(dev.type, dtype=self.amp, enabled=self.amp != torch.float32):
            z = self.heads.hidden(h, root_emb=root_emb, path_emb=path_emb)  # [B, K, d]
            for k in range(K):
                target = cache.next_ids[idx, k].to(dev)
                col = torch.where(target >= 0, self.column[target.clamp(min=0)], torch.full_like(target, -1))
                valid = target >= 0
                if not valid.any():
                    continue
                logits = self.logits(z[valid, k], own, k).float()  # [n, V']
                logq = F.log_softmax(logits, -1)
                in_vocab = col[valid] >= 0
                hard = -logq[in_vocab].gather(1, col[valid][in_vocab, None]).squeeze(1).sum() / max(int(valid.sum()), 1)
                loss_k = (1 - cfg.soft_weight) * hard
                if cfg.soft_weight > 0:
                    # Base distribution at t+k (predicts x_{t+k+1}) restricted to the proposal set.
                    with torch.no_grad():
                        teacher = F.softmax(
                            (cache.hidden[idx[valid.cpu()] + k + 1].to(dev).float() @ self.proj.T).float(), -1
                        )
                    loss_k = loss_k + cfg.soft_weight * -(teacher * logq).sum(-1).mean()
                total = total + DECAY ** (k + 1) * loss_k
                with torch.no_grad():
                    top5 = logits.topk(5, -1).indices
                    c = col[valid]
                    hits[k, 0] += (top5[:, 0] == c).sum().item()
                    hits[k, 1] += (top5 == c[:, None]).any(-1).sum().item()
                    hits[k, 2] += valid.sum().item()
        return total, hits, torch.tensor(len(idx))

    @torch.no_grad()
    def evaluate(self, cache: HiddenCache, batch_size: int = 2048) -> dict:
        self.heads.eval()
        loss_sum, n, hits = 0.0, 0, torch.zeros(self.heads.num_heads, 3)
        for i in range(0, len(cache), batch_size):
            idx = torch.arange(i, min(i + batch_size, len(cache)))
            loss, h, b = self.loss(cache, idx)
            loss_sum += float(loss) * int(b)
            n += int(b)
            hits += h
        self.heads.train()
        top1 = (hits[:, 0] / hits[:, 2].clamp(min=1)).tolist()
        top5 = (hits[:, 1] / hits[:, 2].clamp(min=1)).tolist()
        return {"loss": loss_sum / max(n, 1), "top1": top1, "top5": top5}


def train_heads(
    model,
    train_cache: HiddenCache,
    heldout_cache: HiddenCache,
    heads: MedusaHeads,
    cfg: TrainConfig,
    *,
    out: Path,
    state_path: Path | None = None,
    log=print,
    max_minutes: float | None = None,
    init: str | None = None,
    base_model: str | None = None,
) -> dict:
    """Train with AdamW + cosine decay; keep the heads with the best held-out loss (saved to ``out``).

    The optimiser state goes to ``state_path`` (default ``out/train_state.pt``) at every evaluation;
    a later call with the same config and data resumes from it, one with another config starts afresh.
    ``base_model`` (the Hub id or folder of ``model``) is written to the heads' config.
    """
    torch.manual_seed(cfg.seed)
    amp = (
        torch.bfloat16
        if (torch.cuda.is_available() and torch.cuda.is_bf16_supported()) or cpu_has_native_bf16()
        else torch.float32
    )
    trainer = Trainer(model, heads, cfg, dtype=amp)
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train_cache) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    # linear warm-up, then cosine decay to 0
    warmup = max(1, min(50, total_steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps))
    )
    state_path = Path(state_path) if state_path is not None else out / "train_state.pt"
    run_key = {"config": asdict(cfg), "train_positions": len(train_cache), "heldout_positions": len(heldout_cache)}
    # a run that started from other heads (--init-heads) is another run
    if init:
        run_key["init_heads"] = init
    step, best, bad, history = 0, float("inf"), 0, []
    # resume
    if state_path.exists():
        st = read_train_state(state_path, fresh="delete it to start afresh")
        if st.get("run") != run_key:
            log(f"{state_path} is from another run (config or data differ): starting afresh")
        else:
            heads.load_state_dict(st["heads"]), opt.load_state_dict(st["opt"]), sched.load_state_dict(st["sched"])
            step, best, bad, history = st["step"], st["best"], st["bad"], st["history"]
            log(f"resumed at step {step} (best held-out loss {best:.4f})")
    t0 = time.perf_counter()
    heads.train()
    g = torch.Generator().manual_seed(cfg.seed)
    perm = torch.randperm(len(train_cache), generator=g)
    stop = False
    while step < total_steps and not stop:
        epoch, within = divmod(step, steps_per_epoch)
        if within == 0:
            perm = torch.randperm(len(train_cache), generator=torch.Generator().manual_seed(cfg.seed + epoch))
        idx = perm[within * cfg.batch_size : (within + 1) * cfg.batch_size]
        loss, _, _ = trainer.loss(train_cache, idx)
        loss_value = loss.detach()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % 20 == 0:
            el = time.perf_counter() - t0
            log(
                f"step {step}/{total_steps} epoch {epoch + 1} loss {loss_value.item():.4f} lr "
                f"{sched.get_last_lr()[0]:.2e} {el / 60:.1f} min"
            )
        if step % cfg.eval_every == 0 or step == total_steps:
            ev = trainer.evaluate(heldout_cache)
            ev.update(step=step, minutes=(time.perf_counter() - t0) / 60)
            history.append(ev)
            log(
                f"held-out loss {ev['loss']:.4f} top1 {[round(x, 3) for x in ev['top1']]} top5 "
                f"{[round(x, 3) for x in ev['top5']]}"
            )
            if ev["loss"] < best - 1e-4:
                best, bad = ev["loss"], 0
                heads.save(out, base_model=base_model, dtype=getattr(torch, cfg.save_dtype))
            else:
                bad += 1
                if bad >= cfg.patience:
                    log("early stop: held-out loss stopped improving")
                    stop = True
            state_path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(
                {
                    "run": run_key,
                    "heads": heads.state_dict(),
                    "opt": opt.state_dict(),
                    "sched": sched.state_dict(),
                    "step": step,
                    "best": best,
                    "bad": bad,
                    "history": history,
                },
                state_path,
            )
        if max_minutes and (time.perf_counter() - t0) / 60 > max_minutes:
            log("time budget reached")
            break
    return {"steps": step, "best_loss": best, "history": history, "minutes": (time.perf_counter() - t0) / 60}
