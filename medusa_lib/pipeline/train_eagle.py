"""Train an EAGLE draft head on a frozen base model by self-distillation, on the CPU or a GPU (--device cuda).

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
import sys
import time
from pathlib import Path

import torch

from ..core.dynamic_tree import DynamicTreeConfig
from ..core.eagle import EagleHead, new_eagle_head
from ..core.eagle_io import load_eagle
from ..core.model import DEFAULT_HUB_ID, DEFAULT_MODEL, eos_token_ids, input_device, load_model
from .cli import add_model_arguments
from .eagle_card import acceptance_per_depth, model_card, recipe_rows
from .eagle_trainer import train
from .feature_cache import build_cache, fused_layers
from .hidden_cache import frequent_tokens
from .jsonl import load_jsonl
from .live_server import machine

TRAIN_ANSWERS = [
    "assets/data/distill/train_answers.jsonl.gz",
    "assets/data/distill/train_answers_part2.jsonl.gz",
    "assets/data/distill/self_instruct_answers.jsonl.gz",
]
HELDOUT_ANSWERS = ["assets/data/distill/heldout_answers.jsonl.gz"]


def init_from(head: EagleHead, folder: str | Path, model) -> None:
    """Start ``head`` from the weights of the EAGLE head in ``folder`` (one trained on a GPU, say): the
    same recipe (fused layers) and the same proposal tokens, or one sentence (SystemExit) saying so."""
    init = load_eagle(folder, model=model, int8=False)
    same_ids = (init.proposal_ids is None and head.proposal_ids is None) or (
        init.proposal_ids is not None
        and head.proposal_ids is not None
        and torch.equal(init.proposal_ids.cpu(), head.proposal_ids.cpu())
    )
    if init.config.fuse_layers != head.config.fuse_layers or not same_ids:
        raise SystemExit(
            f"--init {folder} is another recipe (its fused layers or proposal tokens differ from this training's); "
            "give a head trained with the same flags."
        )
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in init.state_dict().items()})


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
    ap.add_argument(
        "--stop-at", type=float, default=0.0, help="and end training by this Unix time (a time-boxed GPU call)"
    )
    ap.add_argument("--eval-every", type=int, default=200, help="evaluate every this many batches")
    ap.add_argument("--eval-minutes", type=float, default=0.0, help="and every this many minutes (0: never)")
    ap.add_argument(
        "--eval-prompts", type=int, default=40, help="held-out prompts decoded to measure acceptance per depth"
    )
    ap.add_argument("--eval-tokens", type=int, default=96)
    ap.add_argument(
        "--ttt-steps", type=int, default=1, help="training-time test: draft steps unrolled in training (1: EAGLE-1)"
    )
    ap.add_argument("--fuse", action="store_true", help="EAGLE-3: read a low, a middle and a high layer, fused")
    ap.add_argument(
        "--sim-prompts", type=int, default=48, help="held-out answers to simulate tokens/step on (the kept checkpoint)"
    )
    ap.add_argument("--init", default=None, help="start from this EAGLE head's weights (e.g. one trained on a GPU)")
    ap.add_argument("--restart", action="store_true", help="start again instead of resuming --out/train_state.pt")
    ap.add_argument(
        "--compare",
        nargs="+",
        metavar="RUN",
        help="with --eval-only: put a table of these trainings (their training.json) into the model card",
    )
    ap.add_argument("--save-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=0, help="CPU threads (0: torch's default); 1 is faster on a CPU other jobs share"
    )
    ap.add_argument(
        "--eval-only", action="store_true", help="measure the head already in --out and rewrite its model card"
    )
    ap.add_argument("--features-only", action="store_true", help="build the feature caches under --work, then stop")
    ap.add_argument(
        "--no-eval",
        action="store_true",
        help="stop after training (training.json written); `--eval-only` later measures it and writes the model card",
    )
    args = ap.parse_args(argv)
    if args.dtype == "float16":
        raise SystemExit("--dtype float16 is not supported for EAGLE training on this path; use bfloat16 or float32.")
    if args.threads:
        torch.set_num_threads(args.threads)
    # float32 training on a GPU: tensor cores
    torch.backends.cuda.matmul.allow_tf32 = True
    work, out = Path(args.work), Path(args.out)
    answers = {
        s: [r for p in paths for r in load_jsonl(p)]
        for s, paths in (("train", args.train_answers), ("heldout", args.heldout_answers))
    }
    n = args.train_records
    if n and n < len(answers["train"]):
        # evenly spread: every file and category keeps its share
        step = len(answers["train"]) / n
        answers["train"] = [answers["train"][int(i * step)] for i in range(n)]
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
            s: build_cache(
                model,
                answers[s],
                work / f"{s}-{'all' if s == 'heldout' or not args.train_records else len(answers[s])}",
                # one cache for both recipes: EAGLE-3 reads the layer inputs
                with_layers=True,
                # a GPU: fewer launches
                batch_tokens=16384 if input_device(model).type == "cuda" else 2048,
                desc=f"{s} features",
            )
            for s in ("heldout", "train")
        }
        feature_minutes = round((time.perf_counter() - t0) / 60, 1)
        if args.features_only:
            return
        where = work / ("train-all" if not args.train_records else f"train-{len(answers['train'])}") / "speed.json"
        speed = json.loads(where.read_text()) if where.exists() else None
        V = model.get_output_embeddings().weight.shape[0]
        ids = (
            frequent_tokens(answers["train"], args.proposal_tokens, V, always=list(eos_token_ids(model)))
            if args.proposal_tokens
            else None
        )
        n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
        fuse = fused_layers(n_layers) if args.fuse else None
        if fuse and caches["train"].layers is None:
            raise SystemExit(f"The feature cache under {work} has no layer inputs; delete it and run again.")
        # the head's initial weights: a resumed run builds the same one
        torch.manual_seed(args.seed)
        head = new_eagle_head(model, proposal_ids=ids, base_model=base, fuse_layers=fuse)
        # g starts as f_t: "the next feature is this one" (the identity on the feature half of fc).
        with torch.no_grad():
            d = head.config.hidden_size
            head.fc.weight[:, d:] = torch.eye(d)
            head.fc.bias.zero_()
        if args.init:
            init_from(head, args.init, model)
        head.to(input_device(model))
        held = caches["heldout"]
        if args.heldout_records and args.heldout_records < len(held):
            held = held.subset(range(0, len(held), len(held) // args.heldout_records))
        # float32 frozen modules for training
        head.bind(model.float() if model.dtype != torch.float32 else model)
        result = train(
            head,
            caches["train"],
            held,
            heldout_sim=caches["heldout"],
            out=out,
            lr=args.lr,
            epochs=args.epochs,
            batch_tokens=args.batch_tokens,
            minutes=min(args.max_minutes, (args.stop_at - time.time()) / 60) if args.stop_at else args.max_minutes,
            eval_every=args.eval_every,
            eval_minutes=args.eval_minutes,
            seed=args.seed,
            save_dtype=getattr(torch, args.save_dtype),
            steps=args.ttt_steps,
            sim_prompts=args.sim_prompts,
            resume=not args.restart,
        )
        summary = {
            **result,
            "feature_minutes": feature_minutes,
            "feature_speed": speed,
            "recipe": head.config.recipe,
            "ttt_steps": args.ttt_steps,
            "init": args.init,
            "train_sequences": len(caches["train"]),
            "train_tokens": int(caches["train"].offsets[-1]),
            "heldout_sequences": len(caches["heldout"]),
            "machine": machine(),
            "command": "python -m medusa_lib.pipeline.train_eagle "
            + " ".join(argv if argv is not None else sys.argv[1:]),
        }
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        if args.no_eval:
            return
    summary = json.loads(summary_path.read_text())
    if args.compare:
        (out / "recipes.md").write_text(
            "\n## Recipes compared on the same data (held-out tokens/step simulated, greedy, tree 8/5/24)\n\n"
            + recipe_rows([Path(r) for r in args.compare])
            + "\n"
        )
    eval_model, _ = load_model(args.model, device=args.device, dtype=args.dtype, progress=print)
    # the model card's figures: the head's own float drafts
    head = load_eagle(out, model=eval_model, int8=False)
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
