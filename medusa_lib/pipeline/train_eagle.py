"""Train an EAGLE draft head on a frozen base model by self-distillation, on the CPU.

    python -m medusa_lib.pipeline.train_eagle --out assets/heads/smollm2-135m-instruct-eagle

EAGLE (arXiv 2401.15077, Sec. 4; reference SafeAILab/EAGLE ``train/main.py``): the drafter reads
(e(x_{t+1}), f_t + noise) and regresses the base model's next feature f_{t+1}, with

    loss = SmoothL1(g_t, f_{t+1}) + 0.1 * CE( softmax(lm_head(f_{t+1})), log_softmax(lm_head(g_t)) )

(feature regression, plus the token loss against the base model's own distribution), on
teacher-forced features with uniform noise U(-0.1, 0.1) (the reference's "std" 0.2) so that the
drafter tolerates its own, imperfect features when it drafts deeper. Loss on the answer positions.

Stages: (1) the base model's features f_t of every prompt + answer in the distill files, computed
once and cached under ``--work`` (gitignored); (2) training with AdamW, a tqdm progress bar and a
time budget, keeping the head with the best held-out loss; (3) held-out acceptance per depth,
measured by decoding held-out prompts with the trained head (a top-1 chain and the default dynamic
tree), written to the model card beside the exact command and the training time.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..core.decoding import DecodeConfig, Decoder
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.eagle import EagleHead, load_eagle, new_eagle_head
from ..core.model import (
    DEFAULT_HUB_ID,
    DEFAULT_MODEL,
    body_and_lm_head,
    cpu_has_native_bf16,
    eos_token_ids,
    input_device,
    load_model,
)
from .cli import add_model_arguments
from .hidden_cache import frequent_tokens
from .jsonl import load_jsonl

TRAIN_ANSWERS = [
    "assets/data/distill/train_answers.jsonl.gz",
    "assets/data/distill/train_answers_part2.jsonl.gz",
    "assets/data/distill/self_instruct_answers.jsonl.gz",
]
HELDOUT_ANSWERS = ["assets/data/distill/heldout_answers.jsonl.gz"]
NOISE = 0.2  # width of the uniform input noise (reference "std": 0.2)
TOKEN_WEIGHT = 0.1  # weight of the token loss (reference p_w)


class FeatureCache:
    """Base-model features of many sequences: ``features[offsets[i]:offsets[i+1]]`` [T_i, d] (bfloat16),
    ``ids`` the tokens beside them and ``prompt_len`` where each answer starts."""

    def __init__(self, features: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, prompt_len: torch.Tensor):
        self.features, self.ids, self.offsets, self.prompt_len = features, ids, offsets, prompt_len

    def __len__(self) -> int:
        return len(self.prompt_len)

    def seq(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.features[a:b], self.ids[a:b], int(self.prompt_len[i])

    @classmethod
    @torch.inference_mode()
    def build(cls, model, records: list[dict], *, batch_tokens: int = 8192, desc: str = "features") -> "FeatureCache":
        body, _ = body_and_lm_head(model)
        dev = input_device(model)
        seqs = [list(r["prompt_ids"]) + list(r["answer_ids"]) for r in records]
        feats: list[torch.Tensor | None] = [None] * len(seqs)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        bar = tqdm(total=sum(map(len, seqs)), desc=desc, unit="tok", file=sys.stdout)
        i = 0
        while i < len(order):
            j = i + 1
            while j < len(order) and (j - i + 1) * len(seqs[order[j]]) <= batch_tokens:
                j += 1
            batch = order[i:j]
            width = len(seqs[batch[-1]])
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            att = torch.zeros(len(batch), width, dtype=torch.long)
            for r, k in enumerate(batch):
                ids[r, : len(seqs[k])] = torch.tensor(seqs[k])
                att[r, : len(seqs[k])] = 1
            h = body(input_ids=ids.to(dev), attention_mask=att.to(dev)).last_hidden_state.to(torch.bfloat16).cpu()
            for r, k in enumerate(batch):
                feats[k] = h[r, : len(seqs[k])].clone()
            bar.update(int(att.sum()))
            i = j
        bar.close()
        lengths = torch.tensor([len(s) for s in seqs])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        return cls(
            torch.cat(feats),
            torch.tensor([t for s in seqs for t in s]),
            offsets,
            torch.tensor([len(r["prompt_ids"]) for r in records]),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"features": self.features, "ids": self.ids, "offsets": self.offsets, "prompt_len": self.prompt_len},
            str(path) + ".tmp",
        )
        Path(str(path) + ".tmp").replace(path)

    @classmethod
    def load(cls, path: Path) -> "FeatureCache":
        d = torch.load(path, weights_only=True)
        return cls(d["features"], d["ids"], d["offsets"], d["prompt_len"])


def cached_features(model, records: list[dict], path: Path, desc: str) -> FeatureCache:
    """The feature cache of ``records`` at ``path``, built once (rebuilt if the records changed)."""
    if path.exists():
        cache = FeatureCache.load(path)
        if len(cache) == len(records) and int(cache.offsets[-1]) == sum(
            len(r["prompt_ids"]) + len(r["answer_ids"]) for r in records
        ):
            return cache
        print(f"{path} does not match these answers: rebuilding")
    cache = FeatureCache.build(model, records, desc=desc)
    cache.save(path)
    return cache


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


def eagle_loss(
    head: EagleHead, proj: torch.Tensor, cache: FeatureCache, batch: list[int], *, noise: float
) -> tuple[torch.Tensor, dict]:
    """EAGLE's loss on one padded batch: (f_t + noise, x_{t+1}) -> g_t vs f_{t+1}, and the token loss."""
    seqs = [cache.seq(i) for i in batch]
    T = max(len(ids) for _, ids, _ in seqs) - 1
    d = cache.features.shape[1]
    f = torch.zeros(len(seqs), T + 1, d)
    ids = torch.zeros(len(seqs), T + 1, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for r, (feat, tok, p) in enumerate(seqs):
        n = len(tok)
        f[r, :n], ids[r, :n] = feat.float(), tok
        mask[r, max(p - 1, 0) : n - 1] = True  # t >= last prompt token: the positions a decode drafts from
    inputs = f[:, :-1] + (torch.rand(len(seqs), T, d) - 0.5) * noise if noise else f[:, :-1]
    pos = torch.arange(T)[None].expand(len(seqs), T)
    # Emulated bfloat16 is far slower than float32.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cpu_has_native_bf16()):
        g = head(inputs, ids[:, 1:], pos)  # causal over each sequence (right padding never reaches a real position)
        g, target = g[mask].float(), f[:, 1:][mask]
        vloss = F.smooth_l1_loss(g, target)
        logq = torch.log_softmax((g @ proj.T).float(), -1)
        with torch.no_grad():
            p = torch.softmax((target @ proj.T).float(), -1)
        ploss = -(p * logq).sum(-1).mean()
    with torch.no_grad():
        hit = (logq.argmax(-1) == p.argmax(-1)).float().mean()
    return vloss + TOKEN_WEIGHT * ploss, {
        "vloss": float(vloss.detach()),
        "ploss": float(ploss.detach()),
        "top1": float(hit),
        "n": int(mask.sum()),
    }


@torch.no_grad()
def evaluate(head: EagleHead, proj: torch.Tensor, cache: FeatureCache, groups: list[list[int]]) -> dict:
    head.eval()
    tot = {"vloss": 0.0, "ploss": 0.0, "top1": 0.0, "n": 0}
    for b in groups:
        _, m = eagle_loss(head, proj, cache, b, noise=0.0)
        for k in ("vloss", "ploss", "top1"):
            tot[k] += m[k] * m["n"]
        tot["n"] += m["n"]
    head.train()
    out = {k: tot[k] / max(tot["n"], 1) for k in ("vloss", "ploss", "top1")}
    out["loss"] = out["vloss"] + TOKEN_WEIGHT * out["ploss"]
    return out


def train(
    head: EagleHead,
    train_cache: FeatureCache,
    heldout: FeatureCache,
    *,
    out: Path,
    lr: float,
    epochs: int,
    batch_tokens: int,
    minutes: float,
    eval_every: int,
    seed: int,
    save_dtype: torch.dtype,
    log=print,
) -> dict:
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
    warmup = min(100, len(plan) // 10 + 1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, len(plan)) / len(plan)))
    )
    best, history, t0 = float("inf"), [], time.perf_counter()
    head.train()
    bar = tqdm(plan, desc="train", unit="batch", file=sys.stdout)
    for step, b in enumerate(bar, start=1):
        loss, m = eagle_loss(head, proj, train_cache, b, noise=NOISE)
        if not math.isfinite(float(loss)):
            raise SystemExit(f"The loss became {float(loss)} at batch {step}; lower --lr.")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        sched.step()
        bar.set_postfix(vloss=f"{m['vloss']:.3f}", ploss=f"{m['ploss']:.2f}", top1=f"{m['top1']:.2f}")
        over = (time.perf_counter() - t0) / 60 > minutes
        if step % eval_every == 0 or step == len(plan) or over:
            ev = evaluate(head, proj, heldout, held)
            ev.update(step=step, minutes=round((time.perf_counter() - t0) / 60, 2))
            history.append(ev)
            log(
                f"\nheld-out step {step}: loss {ev['loss']:.4f} vloss {ev['vloss']:.4f} ploss {ev['ploss']:.3f} top1 "
                f"{ev['top1']:.3f}"
            )
            if ev["loss"] < best:
                best = ev["loss"]
                head.save(out, dtype=save_dtype, training={"history": history})
        if over:
            log("time budget reached")
            break
    bar.close()
    return {
        "steps": step,
        "planned_steps": len(plan),
        "best_loss": best,
        "minutes": round((time.perf_counter() - t0) / 60, 2),
        "history": history,
    }


def acceptance_per_depth(
    model, head: EagleHead, prompts: list[list[int]], *, max_new_tokens: int, tree: DynamicTreeConfig
) -> dict:
    """Greedy decoding of held-out prompts with the head: tokens per step, and for every depth k
    the share of steps that accepted >= k drafted tokens (and, given k - 1 accepted, the k-th)."""
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, stop_on_eos=True, record_detail=False)
    lengths, tokens, steps = [], 0, 0
    for ids in tqdm(
        prompts, desc=f"acceptance k={tree.top_k} depth={tree.depth} nodes={tree.num_nodes}", file=sys.stdout
    ):
        res = Decoder(model, method="medusa-greedy", eagle=head, tree=tree, config=cfg).run(ids)
        full = [s for s in res.steps[1:] if s.finish_reason is None]  # a cut step says nothing about the drafter
        lengths += [s.accept_length for s in full]
        tokens += sum(s.accept_length + 1 for s in full)
        steps += len(full)
    at_least = [sum(a >= k for a in lengths) / max(len(lengths), 1) for k in range(1, tree.depth + 1)]
    given = [at_least[0]] + [at_least[k] / at_least[k - 1] if at_least[k - 1] else 0.0 for k in range(1, len(at_least))]
    return {
        "tree": {"top_k": tree.top_k, "depth": tree.depth, "num_nodes": tree.num_nodes},
        "prompts": len(prompts),
        "steps": steps,
        "tokens_per_step": round(tokens / max(steps, 1), 3),
        "accepted_at_least": [round(x, 3) for x in at_least],
        "accept_rate_per_depth": [round(x, 3) for x in given],
    }


def model_card(out: Path, *, command: str, summary: dict, evals: list[dict]) -> None:
    cfg = json.loads((out / "config.json").read_text())
    rows = "\n".join(
        f"| {e['tree']['top_k']} | {e['tree']['depth']} | {e['tree']['num_nodes']} | {e['tokens_per_step']} | "
        f"{' / '.join(map(str, e['accept_rate_per_depth']))} | "
        f"{' / '.join(map(str, e['accepted_at_least']))} |"
        for e in evals
    )
    last = summary["history"][-1] if summary["history"] else {}
    # A markdown heading and a table header are one line each, whatever their length.
    acceptance = (
        f"## Held-out acceptance per depth (greedy decoding, {evals[0]['prompts'] if evals else 0} held-out prompts, "
        f"{summary['eval_dtype']})"
    )
    header = (
        "| top-k | depth | nodes | tokens/step | accept rate at depth 1..D (given the one before) "
        "| share of steps accepting >= k |"
    )
    text = f"""# EAGLE draft head for SmolLM2-135M-Instruct

A second drafter for Medusa Playground: one `{cfg.get("model_type")}` decoder layer of the base
model's own class, reading `fc([e(x_(t+1)); f_t])`, projecting through the base model's frozen
`lm_head` restricted to {cfg.get("num_proposal_tokens")} proposal tokens
(EAGLE, arXiv 2401.15077; dynamic tree of EAGLE-2, arXiv 2406.16858; reference SafeAILab/EAGLE).
The embedding and lm_head are the base model's and are not stored here. Base model:
{cfg.get("base_model_name_or_path")}. Default dynamic tree: top-k {cfg["top_k"]}, depth {cfg["depth"]},
{cfg["num_nodes"]} nodes + the root.

## Command (exactly as run)

```
{command}
```

Self-distillation data: the base model's greedy answers in `assets/data/distill/`
({summary["train_sequences"]} training sequences, {summary["train_tokens"]} tokens incl. prompts;
{summary["heldout_sequences"]} held-out). Features cached once (bfloat16), {summary["feature_minutes"]} min;
training {summary["minutes"]} min, {summary["steps"]} of {summary["planned_steps"]} planned
batches, on {summary["machine"]} (shared with other jobs). Loss: SmoothL1 feature regression + 0.1 x token
cross-entropy against the base distribution, uniform input noise of width {NOISE}.

Held-out (teacher-forced) at the kept checkpoint: feature loss {last.get("vloss", float("nan")):.4f}, token loss
{last.get("ploss", float("nan")):.3f}, top-1 agreement with the base model {last.get("top1", float("nan")):.3f}.

{acceptance}

{header}
|---|---|---|---|---|---|
{rows}
"""
    (out / "README.md").write_text(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    ap.add_argument("--out", default="assets/heads/smollm2-135m-instruct-eagle")
    ap.add_argument("--work", default="data/cache/eagle", help="feature caches (gitignored)")
    ap.add_argument("--train-answers", nargs="+", default=TRAIN_ANSWERS)
    ap.add_argument("--heldout-answers", nargs="+", default=HELDOUT_ANSWERS)
    ap.add_argument(
        "--train-records",
        type=int,
        default=0,
        help="use this many training answers, spread evenly over the files (0: all); features cost a base forward each",
    )
    ap.add_argument("--heldout-records", type=int, default=120, help="held-out answers for the held-out loss (0: all)")
    ap.add_argument(
        "--proposal-tokens",
        type=int,
        default=8192,
        help="draft onto this many frequent answer tokens (0: the full vocabulary)",
    )
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--max-minutes", type=float, default=25.0)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument(
        "--eval-prompts", type=int, default=40, help="held-out prompts decoded to measure acceptance per depth"
    )
    ap.add_argument("--eval-tokens", type=int, default=96)
    ap.add_argument("--save-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=0, help="CPU threads (0: torch's default); 1 is faster on a CPU other jobs share"
    )
    ap.add_argument(
        "--eval-only", action="store_true", help="measure the head already in --out and rewrite its model card"
    )
    args = ap.parse_args(argv)
    if args.dtype == "float16":
        raise SystemExit("--dtype float16 is not supported for EAGLE training on this path; use bfloat16 or float32.")
    if args.threads:
        torch.set_num_threads(args.threads)
    work, out = Path(args.work), Path(args.out)
    answers = {
        s: [r for p in paths for r in load_jsonl(p)]
        for s, paths in (("train", args.train_answers), ("heldout", args.heldout_answers))
    }
    for split, n in (("train", args.train_records), ("heldout", args.heldout_records)):
        if n and n < len(answers[split]):
            step = len(answers[split]) / n  # evenly spread: every file and category keeps its share
            answers[split] = [answers[split][int(i * step)] for i in range(n)]
    print(
        ", ".join(
            f"{s}: {len(a)} answers, {sum(len(r['prompt_ids']) + len(r['answer_ids']) for r in a)} tokens"
            for s, a in answers.items()
        )
    )
    model, _ = load_model(args.model, device=args.device, dtype=args.dtype, prepack=False, progress=print)
    model.requires_grad_(False)
    base = DEFAULT_HUB_ID if args.model == DEFAULT_MODEL else args.model
    summary_path = out / "training.json"
    if not args.eval_only:
        t0 = time.perf_counter()
        caches = {
            s: cached_features(model, answers[s], work / f"{s}_features_{len(answers[s])}.pt", desc=f"{s} features")
            for s in answers
        }
        feature_minutes = round((time.perf_counter() - t0) / 60, 1)
        V = model.get_output_embeddings().weight.shape[0]
        ids = (
            frequent_tokens(answers["train"], args.proposal_tokens, V, always=list(eos_token_ids(model)))
            if args.proposal_tokens
            else None
        )
        head = new_eagle_head(model, proposal_ids=ids, base_model=base)
        # g starts as f_t: "the next feature is this one" (the identity on the feature half of fc).
        with torch.no_grad():
            d = head.config.hidden_size
            head.fc.weight[:, d:] = torch.eye(d)
            head.fc.bias.zero_()
        head.bind(model.float() if model.dtype != torch.float32 else model)  # float32 frozen modules for training
        result = train(
            head,
            caches["train"],
            caches["heldout"],
            out=out,
            lr=args.lr,
            epochs=args.epochs,
            batch_tokens=args.batch_tokens,
            minutes=args.max_minutes,
            eval_every=args.eval_every,
            seed=args.seed,
            save_dtype=getattr(torch, args.save_dtype),
        )
        summary = {
            **result,
            "feature_minutes": feature_minutes,
            "train_sequences": len(caches["train"]),
            "train_tokens": int(caches["train"].offsets[-1]),
            "heldout_sequences": len(caches["heldout"]),
            "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
            "command": "python -m medusa_lib.pipeline.train_eagle "
            + " ".join(argv if argv is not None else sys.argv[1:]),
        }
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    summary = json.loads(summary_path.read_text())
    eval_model, _ = load_model(args.model, device=args.device, dtype=args.dtype, progress=print)
    head = load_eagle(out, model=eval_model)
    prompts = [
        r["prompt_ids"]
        for r in answers["heldout"][:: max(1, len(answers["heldout"]) // args.eval_prompts)][: args.eval_prompts]
    ]
    chain = DynamicTreeConfig(top_k=1, depth=head.config.depth, num_nodes=head.config.depth)
    evals = [
        acceptance_per_depth(eval_model, head, prompts, max_new_tokens=args.eval_tokens, tree=t)
        for t in (chain, head.config.tree)
    ]
    summary["eval_dtype"] = str(next(eval_model.parameters()).dtype).removeprefix("torch.")
    summary["acceptance"] = evals
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    cfg = json.loads((out / "config.json").read_text())
    cfg["calibration"] = {"acceptance": evals, "eval_dtype": summary["eval_dtype"]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    model_card(out, command=summary["command"], summary=summary, evals=evals)
    print(json.dumps(evals, indent=2))


if __name__ == "__main__":
    main()
