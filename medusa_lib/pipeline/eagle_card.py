"""The EAGLE head's model card: held-out acceptance per depth, measured by decoding, beside the recipe.

``acceptance_per_depth`` decodes held-out prompts greedily with the trained head and counts the
decoder's full steps; ``model_card`` writes the head's README.md with the exact command, the data,
the training time, the recipe (``recipe_name``) and those figures; ``recipe_rows`` is the table of
several trainings on the same data. ``train_eagle.py`` writes it after training (or ``--eval-only``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from ..core.compose import make_decoder
from ..core.config import DecodeConfig
from ..core.drafters import EagleDrafter
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.eagle import EagleHead
from ..core.spec_metrics import step_lists
from .eagle_loss import depth_rates
from .eagle_trainer import NOISE


def acceptance_per_depth(
    model, head: EagleHead, prompts: list[list[int]], *, max_new_tokens: int, tree: DynamicTreeConfig
) -> dict:
    """Greedy decoding of held-out prompts with the head: tokens per step, and for every depth k
    the share of steps that accepted >= k drafted tokens (and, given k - 1 accepted, the k-th)."""
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, stop_on_eos=True, record_detail=False)
    lengths = []
    for ids in tqdm(
        prompts, desc=f"acceptance k={tree.top_k} depth={tree.depth} nodes={tree.num_nodes}", file=sys.stdout
    ):
        res = make_decoder(model, method="medusa-greedy", drafter=EagleDrafter(head, tree), config=cfg).run(ids)
        # full steps: a cut step says nothing about the drafter
        lengths += step_lists(res.steps)["accept_lengths"]
    return {
        "tree": {"top_k": tree.top_k, "depth": tree.depth, "num_nodes": tree.num_nodes},
        "prompts": len(prompts),
        **depth_rates(lengths, tree.depth, digits=3),
    }


def recipe_rows(runs: list[Path]) -> str:
    """A markdown table of several trainings on the same data (their ``training.json``): what each recipe gave."""
    rows = [
        "| run | recipe | training-time test steps | batches | minutes | held-out tokens/step (simulated, kept) "
        "| accept rate per depth (given the one before) | teacher-forced top-1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = json.loads((Path(run) / "training.json").read_text())
        kept = max(s["history"], key=lambda h: h["tokens_per_step"])
        rows.append(
            f"| `{Path(run).name}` | {s['recipe']} | {s['ttt_steps']} | {kept['step']} of {s['steps']} "
            f"| {kept['minutes']} of {s['minutes']} | {kept['tokens_per_step']:.3f} "
            f"| {' / '.join(f'{x:.2f}' for x in kept['accept_rate_per_depth'])} | {kept['top1']:.3f} |"
        )
    return "\n".join(rows)


def recipe_name(summary: dict) -> str:
    """The recipe as the model card names it: what the head reads, and its training-time test steps past one."""
    name, ttt = summary.get("recipe", "EAGLE-1 (top feature)"), int(summary.get("ttt_steps", 1))
    return name + (f" + training-time test ({ttt} steps)" if ttt > 1 else "")


def model_card(out: Path, *, command: str, summary: dict, evals: list[dict]) -> None:
    cfg = json.loads((out / "config.json").read_text())
    rows = "\n".join(
        f"| {e['tree']['top_k']} | {e['tree']['depth']} | {e['tree']['num_nodes']} | {e['tokens_per_step']} | "
        f"{' / '.join(map(str, e['accept_rate_per_depth']))} | "
        f"{' / '.join(map(str, e['accepted_at_least']))} |"
        for e in evals
    )
    kept = max(summary["history"], key=lambda h: h["tokens_per_step"]) if summary["history"] else {}
    fused = cfg.get("fuse_layers")
    reads = (
        f"the inputs of base layers {', '.join(map(str, fused))} (low, middle, high), each RMS-normalised, "
        "concatenated and projected to one feature (EAGLE-3, arXiv 2503.01840)"
        if fused
        else "the base model's top feature f_t (EAGLE-1, arXiv 2401.15077)"
    )
    loss = (
        "token cross-entropy against the base distribution (no feature regression, as EAGLE-3)"
        if fused
        else "SmoothL1 feature regression + 0.1 x token cross-entropy against the base distribution"
    )
    speed = summary.get("feature_speed") or {}
    compared = (out / "recipes.md").read_text() if (out / "recipes.md").exists() else ""
    text = f"""# EAGLE draft head for SmolLM2-135M-Instruct: {recipe_name(summary)}

A second drafter for Medusa Playground: one `{cfg.get("model_type")}` decoder layer of the base model's
own class, reading `fc([e(x_(t+1)); h_t])` where h_t is {reads}, and projecting through the base
model's frozen `lm_head` restricted to {cfg.get("num_proposal_tokens")} proposal tokens (dynamic tree of
EAGLE-2, arXiv 2406.16858; reference SafeAILab/EAGLE). The embedding and lm_head are the base model's
and are not stored here. Base model: {cfg.get("base_model_name_or_path")}. Default dynamic tree: top-k
{cfg["top_k"]}, depth {cfg["depth"]}, {cfg["num_nodes"]} nodes + the root.

## Command (exactly as run)

```
{command}
```

Self-distillation data: the base model's greedy answers in `assets/data/distill/`
({summary["train_sequences"]} training sequences, {summary["train_tokens"]} tokens incl. prompts;
{summary["heldout_sequences"]} held-out). Features cached once in bfloat16 (`feature_cache.py`; the training
set's {speed.get("tokens", "?")} tokens took {speed.get("seconds", "?")} s on {speed.get("threads", "?")} threads).
Training {summary["minutes"]} min, {summary["steps"]}
of {summary["planned_steps"]} planned batches, on {summary["machine"]}. Loss: {loss}, over
{summary.get("ttt_steps", 1)} training-time test step(s) (step j weighted 0.8^j), uniform input noise of width
{NOISE}. The kept checkpoint is the one with the most tokens/step simulated on held-out answers
(greedy, dynamic tree 8/5/24, from cached features), not the lowest loss: batch {kept.get("step")},
{kept.get("tokens_per_step")} tokens/step simulated, teacher-forced top-1 {kept.get("top1", float("nan")):.3f}.
{compared}
## Held-out acceptance per depth (greedy decoding by the decoder, {evals[0]["prompts"] if evals else 0} held-out \
prompts, {summary["eval_dtype"]})

| top-k | depth | nodes | tokens/step | accept rate at depth 1..D (given the one before) \
| share of steps accepting >= k |
|---|---|---|---|---|---|
{rows}
"""
    (out / "README.md").write_text(text)
