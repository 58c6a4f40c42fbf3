"""Train Medusa-1 heads on a frozen base model with self-distillation.

    python -m medusa_lib.pipeline.train --out assets/heads/smollm2-135m-instruct

Stages (each resumable): (1) the base model's own greedy answers to the training and held-out
prompt sets (``medusa_lib.pipeline.distill``); (2) a cache of final hidden states of prompt + answer;
(3) head training on batches of cached hidden states with

    loss = sum_k 0.8^k * [ (1 - a) * CE(head_k(h_t), x_{t+k+1}) + a * CE(head_k(h_t), p_base(. | x_<=t+k)) ]

the paper's Medusa-1 loss (lambda_k = 0.8^k) plus the base model's own next-token distribution
at t+k as a soft target (Hinton-style distillation; the hard label is its argmax for greedy
answers). Early stopping on held-out loss; per-head top-1/top-5 on held-out prompts.
By default K = 4 ResBlock heads share the base ``lm_head`` (a few MB), projected only onto the
most frequent answer tokens (``--proposal-tokens``), which cuts the per-step cost on CPU.
``--root-conditioned true`` heads also read x_{t+1}; ``--path-conditioned true`` heads (Hydra)
also read x_{t+2}..x_{t+k}, the true tokens of their branch (teacher forcing); see ``heads.py``.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict
from pathlib import Path

from ..core.heads import HeadsConfig, HeadsError, MedusaHeads
from ..core.heads_load import load_heads
from ..core.model import DEFAULT_HUB_ID, DEFAULT_MODEL, eos_token_ids, load_model
from .cli import add_model_arguments
from .hidden_cache import cached_hidden, frequent_tokens
from .jsonl import load_jsonl
from .medusa_trainer import TrainConfig, train_heads


def start_from(heads: MedusaHeads, folder: str | Path) -> None:
    """Copy trained heads of the same layout into ``heads`` (``--init-heads``). Plain heads may
    seed root-conditioned ones, root-conditioned heads path-conditioned ones, and heads with L
    ResBlocks deeper ones: the projections and blocks they lack stay at zero (a zero ResBlock is
    the identity), so the new heads start as the given ones."""
    try:
        init = load_heads(folder, local_only=True)
    except HeadsError as e:
        raise SystemExit(f"--init-heads: {e}") from None
    ours, theirs = heads.state_dict(), init.state_dict()
    n_layers = init.config.num_layers

    # a ResBlock the given heads lack
    def deeper(k: str) -> bool:
        m = re.fullmatch(r"heads\.\d+\.(\d+)\.linear\.(weight|bias)", k)
        return m is not None and int(m[1]) >= n_layers

    missing = [
        k
        for k in ours
        if k not in theirs and not k.startswith(("root.", "path.")) and not (heads.config.shared_lm_head and deeper(k))
    ]
    extra = [k for k in theirs if k not in ours]
    shapes = [k for k in ours if k in theirs and ours[k].shape != theirs[k].shape]
    if missing or extra or shapes:
        what = "; ".join(
            f"{name}: {', '.join(keys[:4])}"
            for name, keys in (("missing", missing), ("not in this run", extra), ("other shape", shapes))
            if keys
        )
        raise SystemExit(
            f"--init-heads {folder} has another layout than this run ({what}); match --num-heads, --num-layers, "
            "--shared-lm-head and --proposal-tokens to those heads (and --root-conditioned / --path-conditioned true "
            "if they read the root / their branch)."
        )
    heads.load_state_dict(theirs, strict=False)


def main(argv: list[str] | None = None) -> None:
    from .distill import main as distill_main

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    ap.add_argument("--out", default="assets/heads/smollm2-135m-instruct")
    ap.add_argument("--work", default="runs/train", help="answers, hidden-state caches, resume state")
    ap.add_argument("--train-prompts", default="assets/data/train_prompts.jsonl")
    ap.add_argument("--heldout-prompts", default="assets/data/heldout_prompts.jsonl")
    ap.add_argument(
        "--train-answers", nargs="+", default=None, help="answers JSONL(.gz) files (default: generate into --work)"
    )
    ap.add_argument("--heldout-answers", nargs="+", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-minutes", type=float, default=None)
    ap.add_argument("--prepare-only", action="store_true", help="build the answers and hidden-state caches, then stop")
    ap.add_argument(
        "--init-heads",
        default=None,
        help="start from these trained heads (same layout, or more ResBlocks with a shared lm_head; "
        "root or branch projections and blocks they lack start at zero)",
    )
    for f, v in asdict(TrainConfig()).items():
        ap.add_argument(
            "--" + f.replace("_", "-"),
            type=type(v) if not isinstance(v, bool) else lambda s: s.lower() in ("1", "true", "yes"),
            default=v,
        )
    args = ap.parse_args(argv)
    cfg = TrainConfig(**{f: getattr(args, f) for f in asdict(TrainConfig())})
    if cfg.save_dtype not in ("float32", "bfloat16"):
        raise SystemExit(f"--save-dtype must be float32 or bfloat16 (got {cfg.save_dtype!r}).")
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    answers, bounds = {}, {}
    for split, prompts, given in (
        ("train", args.train_prompts, args.train_answers),
        ("heldout", args.heldout_prompts, args.heldout_answers),
    ):
        paths = [Path(g) for g in given] if given else [work / f"{split}_answers.jsonl"]
        if not given:
            distill_main(
                [
                    "--prompts",
                    prompts,
                    "--out",
                    str(paths[0]),
                    "--model",
                    args.model,
                    "--device",
                    args.device,
                    "--dtype",
                    args.dtype,
                    "--max-new-tokens",
                    str(args.max_new_tokens),
                ]
            )
        parts = [load_jsonl(p) for p in paths]
        answers[split] = [r for part in parts for r in part]
        # record count after each file
        bounds[split] = [sum(map(len, parts[: i + 1])) for i in range(len(parts))]
        print(
            f"{split}: {len(answers[split])} answers, {sum(len(r['answer_ids']) for r in answers[split])} answer tokens"
        )

    model, tok = load_model(args.model, device=args.device, dtype=args.dtype, progress=print)
    model.requires_grad_(False)
    caches = {
        split: cached_hidden(model, answers[split], bounds[split], work, split, cfg.num_heads)
        for split in ("train", "heldout")
    }
    if args.prepare_only:
        print("caches ready: " + ", ".join(f"{s} {len(c)} positions" for s, c in caches.items()))
        return
    V = model.get_output_embeddings().weight.shape[0]
    d = model.config.hidden_size
    heads = MedusaHeads(
        HeadsConfig(
            hidden_size=d,
            vocab_size=V,
            num_heads=cfg.num_heads,
            num_layers=cfg.num_layers,
            shared_lm_head=cfg.shared_lm_head,
            num_proposal_tokens=cfg.proposal_tokens or None,
            root_conditioned=cfg.root_conditioned or cfg.path_conditioned,
            path_conditioned=cfg.path_conditioned,
        )
    )
    if args.init_heads:
        start_from(heads, args.init_heads)
        print(f"starting from the heads in {args.init_heads}")
    else:
        if cfg.proposal_tokens:
            heads.proposal_ids.copy_(
                frequent_tokens(answers["train"], cfg.proposal_tokens, V, always=list(eos_token_ids(model)))
            )
            coverage = sum(
                1 for r in answers["heldout"] for t in r["answer_ids"] if t in set(heads.proposal_ids.tolist())
            ) / max(1, sum(len(r["answer_ids"]) for r in answers["heldout"]))
            print(f"proposal vocabulary: {cfg.proposal_tokens} tokens cover {coverage:.1%} of held-out answer tokens")
        heads.init_from_lm_head(model.get_output_embeddings())
    heads.float()
    # several runs can share --work (and its caches) with different --out
    tag = out.resolve().name
    init = str(Path(args.init_heads).resolve()) if args.init_heads else None
    result = train_heads(
        model,
        caches["train"],
        caches["heldout"],
        heads,
        cfg,
        out=out,
        state_path=work / f"train_state-{tag}.pt",
        max_minutes=args.max_minutes,
        init=init,
        base_model=DEFAULT_HUB_ID if args.model == DEFAULT_MODEL else args.model,
    )
    summary = {
        "config": asdict(cfg),
        "train_positions": len(caches["train"]),
        "heldout_positions": len(caches["heldout"]),
        **result,
    }
    (work / f"train_summary-{tag}.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=2))


if __name__ == "__main__":
    main()
