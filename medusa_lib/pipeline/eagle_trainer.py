"""The EAGLE head's training loop: AdamW over shuffled batches of cached features, within a time budget.

The loss is ``eagle_loss.eagle_loss`` on teacher-forced features with uniform input noise of width
``NOISE`` (EAGLE, arXiv 2401.15077, Sec. 4; reference SafeAILab/EAGLE ``train/main.py``), after a
warm-up on a cosine to 0 over the plan or the time budget, whichever ends first. At each evaluation:
the held-out loss and tokens/step simulated on held-out answers; the head with the most tokens/step is
kept (not the one with the lowest loss), and the training state is saved, so a later run resumes from
it (``train_state.py``). ``train_eagle.py`` runs it.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.dynamic_tree import DynamicTreeConfig
from ..core.eagle import EagleHead
from .eagle_loss import batches, eagle_loss, simulated_acceptance, teacher_forced
from .feature_cache import FeatureCache
from .train_state import read_train_state

# width of the uniform input noise (reference "std": 0.2)
NOISE = 0.2


def train(
    head: EagleHead,
    train_cache: FeatureCache,
    heldout: FeatureCache,
    *,
    heldout_sim: FeatureCache | None = None,
    out: Path,
    lr: float,
    epochs: int,
    batch_tokens: int,
    minutes: float,
    eval_every: int,
    seed: int,
    eval_minutes: float = 0.0,
    save_dtype: torch.dtype,
    steps: int = 1,
    sim_prompts: int = 48,
    sim_tree: DynamicTreeConfig = DynamicTreeConfig(top_k=8, depth=5, num_nodes=24),
    resume: bool = True,
    log=print,
) -> dict:
    """AdamW over ``epochs`` shuffled passes, within ``minutes`` (resumed ones included). Every ``eval_every``
    batches: teacher-forced held-out loss, and tokens/step simulated on ``sim_prompts`` held-out answers
    (``simulated_acceptance``); the head with the most tokens/step is kept in ``out``. The training state
    (head, optimiser, batch, minutes spent, history) is saved to ``out/train_state.pt`` at each evaluation,
    and a run with ``resume`` goes on from it: the same plan, from the next batch."""
    torch.manual_seed(seed)
    proj = head.projection_weight().detach().float()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed)
    plan = [
        b
        for e in range(epochs)
        for b in batches(train_cache, torch.randperm(len(train_cache), generator=g).tolist(), batch_tokens)
    ]
    held = batches(heldout, list(range(len(heldout))), 8192)
    heldout_sim = heldout if heldout_sim is None else heldout_sim
    sim = list(range(len(heldout_sim)))[:: max(1, len(heldout_sim) // sim_prompts)][:sim_prompts]
    warmup = min(100, len(plan) // 10 + 1)
    best, history, done, spent = -1.0, [], 0, 0.0
    state_path = out / "train_state.pt"
    if resume and state_path.exists():
        st = read_train_state(state_path, fresh="give another --out, pass --restart, or delete it")
        if st["planned"] != len(plan):
            raise SystemExit(
                f"{state_path} is from another plan ({st['planned']} batches, not {len(plan)}); "
                "give another --out or delete it."
            )
        head.load_state_dict(st["head"]), opt.load_state_dict(st["opt"])
        best, history, done, spent = st["best"], st["history"], st["done"], st["minutes"]
        torch.set_rng_state(st["rng"])
        log(f"resuming at batch {done + 1} of {len(plan)} ({spent:.1f} min spent, best {best:.3f} tokens/step)")
    t0 = time.perf_counter() - 60 * spent
    # this training's minutes, resumed ones included
    elapsed = lambda: (time.perf_counter() - t0) / 60  # noqa: E731
    head.train()
    bar = tqdm(plan, desc="train", unit="batch", file=sys.stdout, initial=done)
    step = done
    for step, b in enumerate(plan[done:], start=done + 1):
        # Warm-up, then a cosine to 0 over the plan or the time budget, whichever ends first: a run cut
        # by its budget still ends annealed.
        progress = min(1.0, max((step - 1) / len(plan), elapsed() / minutes if minutes > 0 else 1.0))
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, step / warmup) * 0.5 * (1 + math.cos(math.pi * progress))
        loss, m = eagle_loss(head, proj, train_cache, b, noise=NOISE, steps=steps)
        if not math.isfinite(float(loss)):
            raise SystemExit(f"The loss became {float(loss)} at batch {step}; lower --lr.")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}", **{k: f"{v:.2f}" for k, v in m.items() if k.startswith("top1_")})
        over = elapsed() > minutes
        due = eval_minutes > 0 and elapsed() - (history[-1]["minutes"] if history else 0.0) >= eval_minutes
        if step % eval_every == 0 or step == len(plan) or over or due:
            ev = teacher_forced(head, proj, heldout, held)
            ev.update(simulated_acceptance(head, heldout_sim, sim, sim_tree))
            ev.update(step=step, minutes=round(elapsed(), 2))
            history.append(ev)
            log(
                f"\nheld-out at batch {step}: {ev['tokens_per_step']:.3f} tokens/step (accept rate per depth "
                f"{ev['accept_rate_per_depth']}), top1 {ev['top1']:.3f}, ploss {ev['ploss']:.3f}, "
                f"vloss {ev['vloss']:.4f}"
            )
            if ev["tokens_per_step"] > best:
                best = ev["tokens_per_step"]
                head.save(out, dtype=save_dtype, training={"history": history, "kept": step})
            state = {
                "head": head.state_dict(),
                "opt": opt.state_dict(),
                "rng": torch.get_rng_state(),
            }
            state.update(planned=len(plan), best=best, history=history, done=step, minutes=elapsed())
            torch.save(state, str(state_path) + ".tmp")
            Path(str(state_path) + ".tmp").replace(state_path)
        if over:
            log("time budget reached")
            break
    bar.close()
    return {
        "steps": step,
        "planned_steps": len(plan),
        "best_tokens_per_step": best,
        "minutes": round(elapsed(), 2),
        "history": history,
    }
