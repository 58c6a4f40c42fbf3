"""Calibrate trees for a set of heads (Medusa paper, App. C; reference ``gen_results.py``).

    python -m medusa_lib.pipeline.calibrate --heads assets/heads/smollm2-135m-instruct

1. acc[k][r] = P(head k's rank-r token is the base model's next-but-k token), measured on the
   base model's own greedy answers to calibration prompts the heads were not trained on
   (path-conditioned heads read the answer's own tokens as their branch: acc[k][r] is then the
   probability given a correct branch, which is what a tree path needs).
2. For N in {4, 8, 16, 32, 64}: the greedy tree (grow from the root, always adding the frontier
   node with the largest product of accuracies) and its expected tokens/step
   1 + sum over nodes of that product; and its *simulated* tokens/step: the accuracy answers walked
   as greedy decoding would walk them, each step's tree drafted by the heads and accepted against
   the answer's own next tokens (no independence assumption, no decoding; step for step what
   decoding does wherever decoding reproduces the answer, which a test checks in float32).
3. Measure tokens/step and wall-clock tokens/s of Medusa greedy with each tree against plain
   greedy on held-out prompts, one after another on this device, and pick the default tree by
   measured speed-up over plain on the same prompts (``measure``), not by tokens/step alone.
   With ``--lookup N`` (default 4; 0 = heads only) every tree step also verifies the lookup
   branch (``lookup.py``), in the simulation and the measurement; the heads-only simulation is
   printed beside it.
With ``--write`` the trees go to ``trees.json`` beside the heads (shared by every device and numerics:
the calibrated-N trees are named by size, merged by name) and the record (the choice, the lookup
length and the figures, with the device, its kind and the numerics) to its ``config.json``: at the
top level for the first calibration (or the same device kind and numerics again), else under
``calibrations["<kind>-<numerics>"]`` (a GPU's best tree is not a CPU's, nor float32's bfloat16's:
see ``core/defaults.py``). ``--keep-trees`` times the calibrated-N trees trees.json already holds
instead of growing them again from this run's accuracies, so a calibration on another device or in
other numerics measures the same trees the earlier records quote.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.chat import chat_prompt_ids
from ..core.config import DEFAULT_LOOKUP
from ..core.device import device_label
from ..core.engine import prepare_engine
from ..core.heads_load import load_heads
from ..core.machine_fit import machine_record
from ..core.messages import InputError
from ..core.model import input_device, load_model
from ..core.packing import few_row_kernels
from ..core.tree.design import expected_tokens_per_step, greedy_choices
from ..core.tree.shape import build_tree, with_lookup
from .calibrate_accuracy import answer_states, head_accuracy
from .calibrate_record import write_calibration
from .calibrate_sim import lookup_accepts, merge_lookup, simulated_accepts, walked_tokens_per_step
from .calibrate_timing import measure, pick_default
from .cli import (
    add_engine_arguments,
    add_float_draft,
    add_model_arguments,
    check_heads_path,
    check_model_arguments,
    fail,
    read_prompts,
)
from .distill import generate_answers
from .jsonl import load_jsonl

SIZES = (4, 8, 16, 32, 64)


def split_prompts(prompts: list, n_acc: int, n_speed: int) -> tuple[list, list]:
    """Disjoint accuracy and speed prompts, each spread evenly over the whole list, so both sample
    every category of a category-sorted prompt set in proportion (leading slices would not: the
    accuracy prompts would cover the first categories and the speed prompts the last ones)."""
    n = len(prompts)
    n_speed = min(n_speed, n)
    # The middle of each of n_speed equal stretches.
    speed_idx = [(2 * i + 1) * n // (2 * n_speed) for i in range(n_speed)]
    taken = set(speed_idx)
    rest = [i for i in range(n) if i not in taken]
    n_acc = min(n_acc, len(rest))
    acc_idx = [rest[j * len(rest) // n_acc] for j in range(n_acc)]
    return [prompts[i] for i in acc_idx], [prompts[i] for i in speed_idx]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="assets/heads/smollm2-135m-instruct")
    add_model_arguments(ap)
    ap.add_argument("--prompts", default="assets/data/heldout_prompts.jsonl")
    ap.add_argument("--answers", default=None, help="held-out answers JSONL (else generated)")
    ap.add_argument("--acc-prompts", type=int, default=200, help="prompts used to measure head accuracy")
    ap.add_argument("--speed-prompts", type=int, default=8, help="prompts used for wall-clock speed")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--lookup",
        type=int,
        default=DEFAULT_LOOKUP,
        help="length of the lookup branch verified with every tree (0 = heads only)",
    )
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--repeats", type=int, default=1, help="runs of each speed prompt per tree (median over all)")
    ap.add_argument(
        "--tie",
        type=float,
        default=0.02,
        help="trees within this fraction of the fastest count as a tie; the smallest of them is the default",
    )
    ap.add_argument("--write", action="store_true", help="write trees.json and the default tree beside the heads")
    add_float_draft(ap, "the Medusa heads'")
    ap.add_argument(
        "--keep-trees",
        action="store_true",
        help="time the calibrated-N trees already in the heads' trees.json (grow only the sizes it lacks)",
    )
    add_engine_arguments(
        ap,
        cache_help="the engine the trees are timed on (auto: the playground's for this device: static on CUDA, "
        "dynamic on a CPU)",
        capture_help="with the static cache, the capture (auto: CUDA graphs on CUDA); "
        "every tree size is captured before timing",
    )
    args = ap.parse_args(argv)
    # the flags first, one sentence each, before the model loads
    prompts = read_prompts(args.prompts)
    if args.answers:
        read_prompts(args.answers, flag="--answers", key="id")
    check_heads_path(args.heads)
    check_model_arguments(args)
    try:
        model, tok = load_model(args.model, device=args.device, dtype=args.dtype, progress=print)
        heads = load_heads(args.heads, model=model, int8=False if args.float_draft else None)
    except InputError as e:
        # ModelError, HeadsError
        fail(e)
    acc_prompts, speed_prompts = split_prompts(prompts, args.acc_prompts, args.speed_prompts)
    if args.answers:
        by_id = {r["id"]: r for r in load_jsonl(args.answers)}
        records = [by_id[p["id"]] for p in acc_prompts if p["id"] in by_id]
    else:
        records = list(generate_answers(model, tok, acc_prompts, max_new_tokens=args.max_new_tokens, batch_size=32))
    states = answer_states(model, records)
    acc = head_accuracy(model, heads, records, states=states)
    print(f"head accuracy on {len(records)} held-out answers (rank 0..4):")
    for k in range(acc.shape[0]):
        print(
            f"  head {k + 1}: top-1 {acc[k, 0]:.3f}  top-5 {acc[k, :5].sum():.3f}  ranks "
            f"{[round(x, 3) for x in acc[k, :5].tolist()]}"
        )

    trees, expected = {}, {}
    stored = (getattr(heads, "tree_presets", None) or {}) if args.keep_trees else {}
    for n in [int(s) for s in args.sizes.split(",")]:
        name = f"calibrated-{n}"
        # the same tree the other calibrations measured
        if name in stored:
            trees[name], expected[name] = stored[name], expected_tokens_per_step(stored[name], acc.tolist())
        else:
            trees[name], expected[name] = greedy_choices(acc.tolist(), n)
    if stored:
        print(f"kept from trees.json: {', '.join(n for n in trees if n in stored) or 'none'}")
    built = {name: build_tree(c, num_heads=heads.num_heads, name=name) for name, c in trees.items()}
    # The heads draft once; the branch is merged in.
    alone = simulated_accepts(model, heads, built, records, states=states)
    heads_only = walked_tokens_per_step(alone)
    chains = [lookup_accepts(seq, start, args.lookup) for seq, start, _ in states] if args.lookup else []
    simulated = walked_tokens_per_step(merge_lookup(alone, chains)) if args.lookup else heads_only
    speed_ids = [chat_prompt_ids(tok, p["prompt"]) for p in speed_prompts]
    device = input_device(model)
    # the tree steps the timed runs verify
    steps = [with_lookup(t, args.lookup) for t in built.values()]
    try:
        engine = prepare_engine(
            model,
            cache=args.cache,
            capture=args.capture,
            max_len=max(map(len, speed_ids)) + args.max_new_tokens + max(t.num_nodes for t in steps),
            say=print,
        )
    except InputError as e:
        raise SystemExit(str(e)) from None
    results = measure(
        model,
        heads,
        built,
        speed_ids,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        lookup=args.lookup,
        engine=engine,
    )
    plain = results["plain"]["tok_s"]
    branch = f" + lookup-{args.lookup}" if args.lookup else ""
    print(f"\ntrees{branch}; expected and heads-only: the heads' tree alone; simulated and measured: as decoded")
    print(
        f"{'tree':<16}{'nodes':>6}{'expected tok/step':>19}{'heads-only':>12}{'simulated':>11}"
        f"{'measured tok/step':>19}{'tok/s':>8}{'vs plain':>10}"
    )
    print(f"{'plain':<16}{1:>6}{1.0:>19.2f}{1.0:>12.2f}{1.0:>11.2f}{1.0:>19.2f}{plain:>8.1f}{1.0:>9.2f}x")
    for name, t in built.items():
        r = results[name]
        print(
            f"{name:<16}{t.num_nodes:>6}{expected[name]:>19.2f}{heads_only[name]:>12.2f}{simulated[name]:>11.2f}{r['tokens_per_step']:>19.2f}{r['tok_s']:>8.1f}{r['speedup']:>9.2f}x"
        )
    print("(vs plain: median over runs of tokens/s over plain's on the same prompt)")
    fastest = max(built, key=lambda n: results[n]["speedup"])
    best = pick_default({n: results[n]["speedup"] for n in built}, {n: t.num_nodes for n, t in built.items()}, args.tie)
    print(f"\nfastest on this device: {fastest}; default (smallest tree within {args.tie:.0%} of it): {best}")
    if args.write:
        record = {
            "default_tree": best,
            "accuracy_top1": [round(x, 4) for x in acc[:, 0].tolist()],
            "accuracy_top5": [round(x, 4) for x in acc[:, :5].sum(1).tolist()],
            "accuracy": [[round(x, 4) for x in row] for row in acc.tolist()],
            "trees": {
                n: {
                    "nodes": built[n].num_nodes,
                    "expected_tokens_per_step": round(expected[n], 3),
                    "heads_only_simulated_tokens_per_step": round(heads_only[n], 3),
                    "simulated_tokens_per_step": round(simulated[n], 3),
                    "measured_tokens_per_step": round(results[n]["tokens_per_step"], 3),
                    "tok_s": round(results[n]["tok_s"], 2),
                    "speedup": round(results[n]["speedup"], 3),
                }
                for n in built
            },
            "plain_tok_s": round(plain, 2),
            "speed_prompts": len(speed_ids),
            "repeats": args.repeats,
            "tie": args.tie,
            "lookup": args.lookup,
            "dtype": str(next(model.parameters()).dtype),
            # the heads' proposal projection (core/packing.py)
            "draft": "int8" if heads.int8 else "float",
            "device": device_label(device),
            "device_kind": device.type,
            "engine": engine.description,
            # the machine key whose start-up choice this record overrides (core/machine_fit.py)
            "machine": machine_record(device, engine.cache, engine.static_kv.capture if engine.static_kv else None),
            # the verify's few-row products through MKL
            "mkl_rows": list(few_row_kernels(model)),
        }
        write_calibration(Path(args.heads), record, trees)


if __name__ == "__main__":
    main()
