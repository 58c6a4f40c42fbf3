"""Tune the EAGLE head's drafting on this machine, by measurement: its proposal vocabulary and its
dynamic tree.

    python -m medusa_lib.pipeline.eagle_tune --sizes 8192,4096,2048,1024            # proposal vocabulary
    python -m medusa_lib.pipeline.eagle_tune --trees 8,3,6 8,3,8 8,3,12 --write-tree  # node budget

**Proposal vocabulary** (``--sizes``). The drafter projects its output onto a proposal vocabulary,
the N most frequent tokens of the training answers (EAGLE-3's reduced draft vocabulary does the
same). On a CPU that projection is a large part of the draft: each level reads N rows of the
lm_head. A head trained on N tokens drafts on the M < N most frequent of them unchanged (its logits
over the kept tokens are the same, so is their order), so one training gives every smaller size.
For each size, on the held-out answers (the cached features ``train_eagle`` built): greedy steps
simulated with the head's own dynamic tree (``eagle_loss.simulated_lengths``: the decoder's draft
and extend, step for step), giving tokens/step and the acceptance per depth, and the drafter's
seconds per step (draft + extend), median of ``--repeats`` passes, each size's passes interleaved
with the others'. ``--write N`` keeps the N most frequent proposal tokens in the head's folder (its
weights are untouched) and records the sweep in its config.json.

**Node budget** (``--trees K,D,N ...``). Each dynamic tree decodes the held-out speed prompts (the
ones ``calibrate`` times the Medusa trees on) with EAGLE greedy, one after another with plain
greedy on the same prompt (``calibrate_timing.time_decoders``: speed-up = the median over prompts of the
paired ratio), in this run's numerics. ``--write-tree`` makes the smallest tree within ``--tie`` of
the fastest the head's tree on machines of this kind (``defaults.machine_key``: device, numerics,
and whether the CPU has bfloat16 instructions) and records the sweep in its config.json (the
top-level ``tree_sweep``, or ``tree_sweeps[key]`` for another kind of machine); ``load_eagle``
picks the tree of the machine it loads on. The page starts in float32: tune float32 on every kind.

Time it alone. Measure the head again with the bench (``--record-eagle``) after writing, since its
calibration predates the change.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.chat import chat_prompt_ids
from ..core.compose import make_decoder
from ..core.config import DecodeConfig
from ..core.defaults import machine_key, sweep_key
from ..core.drafters import EagleDrafter
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.eagle import CONFIG_FILE, EAGLE_FILE
from ..core.eagle_io import load_eagle, update_eagle_config
from ..core.messages import InputError
from ..core.model import eos_token_ids, load_model
from .calibrate import split_prompts
from .calibrate_timing import pick_default, time_decoders
from .cli import add_float_draft, add_model_arguments, fail, whole_number
from .eagle_loss import depth_rates, simulated_lengths
from .feature_cache import read_cache
from .hidden_cache import frequent_tokens
from .jsonl import load_jsonl
from .live_server import machine
from .train_eagle import HELDOUT_ANSWERS, TRAIN_ANSWERS


def proposal_subsets(head, records: list[dict], sizes: list[int], eos: list[int]) -> dict[int, torch.Tensor]:
    """Size -> the ``size`` most frequent answer tokens (``train_eagle``'s choice of the head's own),
    each a subset of the head's proposal tokens, or one sentence (SystemExit) saying why not."""
    now = head.proposal_ids.cpu() if head.proposal_ids is not None else None
    full = now.numel() if now is not None else head.config.vocab_size
    # rank only tokens the head was trained to draft
    kept = set(now.tolist()) if now is not None else None
    own = [{"answer_ids": [t for t in r["answer_ids"] if kept is None or t in kept]} for r in records]
    out = {}
    for n in sizes:
        if n > full:
            fail(f"--sizes {n} is more than the head's {full} proposal tokens; give sizes up to {full}.")
        ids = now if n == full and now is not None else frequent_tokens(own, n, head.config.vocab_size, eos)
        if now is not None and not torch.isin(ids, now).all():
            fail(
                f"The {n} most frequent answer tokens are not all among the head's proposal tokens: "
                "give the answers it was trained on (--train-answers)."
            )
        out[n] = ids
    return out


@torch.inference_mode()
def sweep(head, cache, seqs: list[int], subsets: dict[int, torch.Tensor], repeats: int, log=print) -> list[dict]:
    """One row per size: simulated tokens/step and rates per depth, and the drafter's ms per step."""
    tree, full = head.config.tree, head.proposal_ids
    lengths, per_pass = {}, {n: [] for n in subsets}
    bar = tqdm(total=repeats * len(subsets) * len(seqs), desc="sweep", unit="answer", file=sys.stdout)
    try:
        for r in range(repeats):
            # interleaved: a slow spell hits every size alike
            for n, ids in subsets.items():
                head.set_proposal(ids)
                clock, steps = [], []
                for i in seqs:
                    steps += simulated_lengths(head, cache, i, tree, clock=clock)
                    bar.update(1)
                if not clock:
                    fail("No held-out answer is long enough for one full draft step; give more --sim-prompts.")
                # the same every pass (greedy)
                lengths[n] = steps
                per_pass[n].append(1000 * statistics.median(clock))
    finally:
        bar.close()
        # the head as it came (None: the whole vocabulary)
        head.set_proposal(full)
    rows = []
    for n in subsets:
        rates = depth_rates(lengths[n], tree.depth, digits=3)
        rows.append({"proposal_tokens": n, **rates, "draft_ms": round(statistics.median(per_pass[n]), 2)})
        log(
            f"{n:>6} tokens: {rates['tokens_per_step']:.3f} tokens/step, rate per depth "
            f"{' / '.join(f'{x:.2f}' for x in rates['accept_rate_per_depth'])}, draft {rows[-1]['draft_ms']:.2f} ms"
        )
    return rows


def write_size(folder: Path, ids: torch.Tensor, record: dict) -> None:
    """Keep ``ids`` as the head's proposal tokens in ``folder`` (weights untouched) and record why."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / EAGLE_FILE))
    state["proposal_ids"] = ids.to(torch.long).contiguous()
    tmp = folder / (EAGLE_FILE + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(folder / EAGLE_FILE)
    update_eagle_config(folder, num_proposal_tokens=int(ids.numel()), proposal_sweep=record)


def tree_name(t: DynamicTreeConfig) -> str:
    return f"{t.top_k},{t.depth},{t.num_nodes}"


def parse_trees(texts: list[str]) -> list[DynamicTreeConfig]:
    """``K,D,N`` texts -> dynamic trees, each checked; one sentence (SystemExit) for a bad one."""
    trees = []
    for text in texts:
        try:
            k, d, n = (int(x) for x in text.split(","))
            t = DynamicTreeConfig(top_k=k, depth=d, num_nodes=n)
            t.check()
        except InputError as e:
            # before ValueError, which it is
            fail(f"--trees {text}: {e}")
        except ValueError:
            fail(f"--trees takes top-k,depth,nodes triples like 8,3,12 (got {text!r}).")
        trees.append(t)
    return trees


def time_trees(model, head, trees: list[DynamicTreeConfig], prompt_ids, *, max_new_tokens: int, repeats: int) -> dict:
    """Plain greedy and EAGLE greedy with each tree, timed one after another per prompt (``time_decoders``)."""
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, record_detail=False)
    decoders = {"plain": make_decoder(model, method="plain", config=cfg)}
    for t in trees:
        decoders[tree_name(t)] = make_decoder(model, method="medusa-greedy", drafter=EagleDrafter(head, t), config=cfg)
    return time_decoders(decoders, prompt_ids, repeats=repeats)


def write_tree(folder: Path, tree: DynamicTreeConfig, record: dict) -> str:
    """Make ``tree`` the head's dynamic tree on machines of the sweep's ``key`` (``defaults.machine_key``)
    in ``folder``'s config.json, with the sweep: the top-level tree and ``tree_sweep`` when there is
    none yet or it was timed on the same kind of machine, else ``tree_sweeps[key]`` (the top level, the
    tree of every machine no sweep was timed on, stays). Returns where it went."""
    meta = json.loads((folder / CONFIG_FILE).read_text())
    top = meta.get("tree_sweep")
    if not isinstance(top, dict) or sweep_key(top) == record["key"]:
        update_eagle_config(folder, top_k=tree.top_k, depth=tree.depth, num_nodes=tree.num_nodes, tree_sweep=record)
        return "the top-level tree"
    sweeps = meta.get("tree_sweeps") if isinstance(meta.get("tree_sweeps"), dict) else {}
    update_eagle_config(folder, tree_sweeps={**sweeps, record["key"]: record})
    return f"tree_sweeps[{record['key']!r}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(ap)
    ap.add_argument("--heads", default="assets/heads/smollm2-135m-instruct-eagle", help="the EAGLE head's folder")
    ap.add_argument("--sizes", default="", help="proposal vocabulary sizes to simulate, comma-separated")
    ap.add_argument("--work", default="data/cache/eagle", help="train_eagle's feature caches (heldout-all)")
    ap.add_argument("--train-answers", nargs="+", default=TRAIN_ANSWERS, help="what the head was trained on")
    ap.add_argument("--heldout-answers", nargs="+", default=HELDOUT_ANSWERS)
    ap.add_argument("--sim-prompts", type=whole_number(1), default=48, help="held-out answers simulated")
    ap.add_argument("--write", type=int, default=0, help="keep this proposal size in the head (one of --sizes)")
    ap.add_argument("--trees", nargs="+", default=[], help="dynamic trees to time, each top-k,depth,nodes")
    ap.add_argument("--prompts", default="assets/data/heldout_prompts.jsonl", help="held-out prompts (calibrate's)")
    ap.add_argument("--speed-prompts", type=whole_number(1), default=12, help="prompts each tree decodes")
    ap.add_argument("--max-new-tokens", type=whole_number(1), default=96)
    ap.add_argument("--tie", type=float, default=0.02, help="trees within this fraction of the fastest tie")
    ap.add_argument("--write-tree", action="store_true", help="make the chosen tree the head's default")
    ap.add_argument("--repeats", type=whole_number(1), default=3, help="timed passes per size, rounds per tree prompt")
    add_float_draft(ap, "the EAGLE head's")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()}, reverse=True)
    except ValueError:
        fail(f"--sizes must be whole numbers separated by commas (got {args.sizes!r}).")
    if sizes and min(sizes) < 1:
        fail(f"--sizes must be whole numbers of at least 1 (got {args.sizes!r}).")
    if args.write and args.write not in sizes:
        fail(f"--write {args.write} is not one of --sizes {args.sizes!r}; measure it before keeping it.")
    trees = parse_trees(args.trees)
    if not sizes and not trees:
        fail("Give --sizes (proposal vocabularies to simulate), --trees (dynamic trees to time), or both.")
    if args.write_tree and not trees:
        fail("--write-tree needs --trees to choose from.")
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(args.heads)
    model, tok = load_model(args.model, device=args.device, dtype=args.dtype, progress=print)
    try:
        head = load_eagle(folder, model=model, int8=False if args.float_draft else None)
    except InputError as e:
        # EagleError: one sentence
        fail(e)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    # the draft's matrices (core/packing.py)
    draft = "int8" if head.int8 else "float"
    command = "python -m medusa_lib.pipeline.eagle_tune " + " ".join(argv if argv is not None else sys.argv[1:])
    out = {}
    if sizes:
        cache = read_cache(Path(args.work) / "heldout-all", [r for p in args.heldout_answers for r in load_jsonl(p)])
        train_records = [r for p in args.train_answers for r in load_jsonl(p)]
        subsets = proposal_subsets(head, train_records, sizes, list(eos_token_ids(model)))
        seqs = list(range(len(cache)))[:: max(1, len(cache) // args.sim_prompts)][: args.sim_prompts]
        tree = head.config.tree
        print(
            f"{len(seqs)} held-out answers, tree {tree_name(tree)}, {dtype}, draft {draft}, "
            f"{torch.get_num_threads()} threads"
        )
        out["proposal_sweep"] = {
            "rows": sweep(head, cache, seqs, subsets, args.repeats),
            "tree": [tree.top_k, tree.depth, tree.num_nodes],
            "answers": len(seqs),
            "repeats": args.repeats,
            "dtype": dtype,
            "draft": draft,
            "machine": machine(),
            "command": command,
        }
        if args.write:
            write_size(folder, subsets[args.write], {**out["proposal_sweep"], "kept": args.write})
            # the trees below are timed on the head as written
            head.set_proposal(subsets[args.write])
            print(f"kept {args.write} proposal tokens in {folder}")
    if trees:
        _, prompts = split_prompts(load_jsonl(args.prompts), 0, args.speed_prompts)
        ids = [chat_prompt_ids(tok, p["prompt"]) for p in prompts]
        print(f"{len(ids)} held-out prompts x {args.repeats}, {args.max_new_tokens} new tokens, {dtype}, draft {draft}")
        res = time_trees(model, head, trees, ids, max_new_tokens=args.max_new_tokens, repeats=args.repeats)
        print(f"{'tree (k,d,n)':<14}{'tokens/step':>12}{'tok/s':>8}{'vs plain':>10}")
        for name, r in res.items():
            print(f"{name:<14}{r['tokens_per_step']:>12.2f}{r['tok_s']:>8.1f}{r['speedup']:>9.2f}x")
        named = {tree_name(t): t for t in trees}
        best = pick_default({n: res[n]["speedup"] for n in named}, {n: t.num_nodes for n, t in named.items()}, args.tie)
        print(f"default (the smallest tree within {args.tie:.0%} of the fastest): {best}")
        out["tree_sweep"] = {
            "rows": [{"tree": n, **{k: round(v, 3) for k, v in r.items()}} for n, r in res.items()],
            "chosen": best,
            "prompts": len(ids),
            "repeats": args.repeats,
            "max_new_tokens": args.max_new_tokens,
            "dtype": dtype,
            "draft": draft,
            "machine": machine(),
            "key": machine_key(next(model.parameters()).device, dtype),
            "command": command,
        }
        if args.write_tree:
            where = write_tree(folder, named[best], out["tree_sweep"])
            print(f"wrote tree {best} to {folder / CONFIG_FILE} ({where}: machines of {out['tree_sweep']['key']})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if args.write or args.write_tree:
        print("measure the head again with the bench (--record-eagle): its calibration predates the change")


if __name__ == "__main__":
    main()
