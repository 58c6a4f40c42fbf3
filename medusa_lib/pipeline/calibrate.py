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
import json
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.chat import chat_prompt_ids
from ..core.compose import make_decoder
from ..core.config import DEFAULT_LOOKUP, DecodeConfig
from ..core.defaults import KIND_NAMES, calibration_key, record_kind, record_numerics
from ..core.device import device_label
from ..core.engine import Engine, prepare_engine
from ..core.heads import CONFIG_FILE, TREES_FILE, MedusaHeads
from ..core.heads_load import load_heads
from ..core.lookup import ngram_proposal
from ..core.machine_fit import machine_record
from ..core.messages import InputError
from ..core.model import body_and_lm_head, input_device, load_model
from ..core.packing import few_row_kernels
from ..core.tree.design import expected_tokens_per_step, greedy_choices
from ..core.tree.shape import TOPK, build_tree, with_lookup
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
from .jsonl import load_jsonl, replace_file

SIZES = (4, 8, 16, 32, 64)


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


@torch.inference_mode()
def simulated_accepts(
    model, heads: MedusaHeads, trees: dict, records: list[dict], *, states: list | None = None, lookup: int = 0
) -> dict[str, list[torch.Tensor]]:
    """Per tree, per record: the candidates greedy verification would accept at every answer position.

    At position t (root x_{t+1}, the answer's next token) the heads draft the tree from h_t, and a
    root-to-leaf path is accepted as far as its tokens are x_{t+2}, x_{t+3}, ... (the base model's
    own greedy continuation, for greedy answers); the longest run over the paths counts. With
    ``lookup`` > 0 the lookup branch (``lookup.ngram_proposal`` over the prompt and the answer up to
    the root) is one more path.
    """
    _, lm_head = body_and_lm_head(model)
    embed = model.get_input_embeddings()
    out: dict[str, list[torch.Tensor]] = {name: [] for name in trees}
    chains: list[torch.Tensor] = []
    for seq, start, h in states if states is not None else answer_states(model, records):
        # x_{t+1} of each position t from start on
        answer = torch.tensor(seq[start + 1 :], dtype=torch.long)
        n = answer.numel()
        if lookup:
            chains.append(lookup_accepts(seq, start, lookup))
        for name, tree in trees.items():
            D = tree.depth
            # [n, D]: x_{t+2} .. x_{t+D+1}
            truth = torch.cat([answer, torch.full((D + 1,), -1)]).unfold(0, D, 1)[1 : n + 1]
            tokens = heads.draft(h[:n], lm_head, tree, answer.to(h.device), embed).cpu()  # [n, L]
            ri = tree.retrieve_indices.cpu()
            # the candidates along each root-to-leaf path
            path = tokens[:, ri[:, 1:].clamp(min=0)]  # [n, P, D]
            match = (path == truth[:, None, :]) & (ri[:, 1:] >= 0)
            out[name].append(match.long().cumprod(-1).sum(-1).max(-1).values)
    return merge_lookup(out, chains) if lookup else out


def merge_lookup(accepts: dict[str, list[torch.Tensor]], chains: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """Per tree and record, the longer of the tree's accepted run and the lookup branch's
    (:func:`lookup_accepts`, one tensor per record): the branch is one more path."""
    return {name: [torch.maximum(a, c) for a, c in zip(per_record, chains)] for name, per_record in accepts.items()}


def lookup_accepts(seq: list[int], start: int, length: int) -> torch.Tensor:
    """[n]: at each answer position (root seq[start + 1 + i]), how many leading tokens of the lookup
    branch's proposal are the sequence's own next tokens."""
    full = torch.tensor(seq, dtype=torch.long)
    out = torch.zeros(len(seq) - start - 1, dtype=torch.long)
    for i in range(out.numel()):
        root = start + 1 + i
        prop = ngram_proposal(full[: root + 1], length=length)
        truth = full[root + 1 : root + 1 + prop.numel()]
        m = prop[: truth.numel()] == truth
        out[i] = int(m.long().cumprod(0).sum())
    return out


def simulated_tokens_per_step(
    model, heads: MedusaHeads, trees: dict, records: list[dict], *, states: list | None = None, lookup: int = 0
) -> dict[str, float]:
    """Tokens/step of greedy Medusa on the answers, simulated: walk each answer as decoding would
    (the prefill gives its first token; a step rooted at answer position i accepts
    :func:`simulated_accepts` [i] candidates plus the bonus token, and the next step is rooted
    where that leaves off), then decoded tokens over steps, as ``RunResult.tokens_per_step``.
    (Averaging 1 + accepts over *all* positions instead would overstate it: easy stretches give
    long runs but are visited by few steps.)"""
    return walked_tokens_per_step(simulated_accepts(model, heads, trees, records, states=states, lookup=lookup))


def walked_tokens_per_step(accepts: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """The walk of :func:`simulated_tokens_per_step` over accepts already simulated."""
    out = {}
    for name, per_record in accepts.items():
        tokens = steps = 0
        for a in per_record:
            a, n, i = a.tolist(), len(a), 0
            while i < n - 1:
                emitted = min(a[i] + 1, n - 1 - i)
                tokens, steps, i = tokens + emitted, steps + 1, i + emitted
        out[name] = tokens / steps if steps else 1.0
    return out


def measure(
    model,
    heads,
    trees: dict,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    repeats: int = 1,
    lookup: int = 0,
    engine: Engine | None = None,
) -> dict:
    """Per decoder (plain and each tree): median tokens/s, mean tokens/step, and ``speedup``, the
    median over runs of its tokens/s over plain's on the same prompt in the same round. The pairing
    keeps out what differs between prompts (answer length, how predictable) and slow drifts of a
    shared machine, which a ratio of medians over different prompts keeps in. ``engine``: the
    cache and captured steps the playground runs on this device (``prepare_engine``), so the
    trees are timed as they will run."""
    cfg = DecodeConfig(
        max_new_tokens=max_new_tokens, record_detail=False, lookup=lookup, cache=engine.cache if engine else "dynamic"
    )
    shared = engine.static_kv if engine else None
    decoders = {"plain": make_decoder(model, method="plain", config=cfg, static_kv=shared)}
    decoders.update(
        {
            name: make_decoder(model, method="medusa-greedy", heads=heads, tree=t, config=cfg, static_kv=shared)
            for name, t in trees.items()
        }
    )
    return time_decoders(decoders, prompt_ids, repeats=repeats)


def time_decoders(decoders: dict, prompt_ids: list[list[int]], *, repeats: int = 1) -> dict:
    """``decoders`` (their first ``plain``) timed one after another on every prompt, ``repeats`` rounds:
    per decoder the median tokens/s, mean tokens/step and ``speedup``, the median over runs of its
    tokens/s over plain's on the same prompt in the same round (``measure``)."""
    # warm-up: a first run builds packed weights and caches
    for dec in decoders.values():
        dec.run(prompt_ids[0][:16])
    rates: dict[str, list[float]] = {n: [] for n in decoders}
    tps: dict[str, list[float]] = {n: [] for n in decoders}
    rounds = [ids for ids in prompt_ids for _ in range(repeats)]
    for ids in tqdm(rounds, desc=f"timing plain + {len(decoders) - 1}", unit="prompt", file=sys.stdout):
        # one after another on the one device
        for name, dec in decoders.items():
            res = dec.run(ids)
            rates[name].append(res.tokens_per_second)
            tps[name].append(res.tokens_per_step)
    return {
        n: {
            "tok_s": statistics.median(rates[n]),
            "tokens_per_step": statistics.fmean(tps[n]),
            "speedup": statistics.median(r / p for r, p in zip(rates[n], rates["plain"])),
        }
        for n in decoders
    }


def pick_default(speeds: dict[str, float], nodes: dict[str, int], tolerance: float = 0.02) -> str:
    """The smallest tree whose measured speed (tokens/s, or speed-up over plain) is within ``tolerance`` of
    the fastest one.

    Trees a few percent apart are a tie on a shared CPU (one run of ~10 prompts moves by about
    that much), and the smaller tree step is cheaper at longer contexts and under contention.
    """
    fastest = max(speeds.values())
    return min((n for n in speeds if speeds[n] >= (1 - tolerance) * fastest), key=lambda n: (nodes[n], -speeds[n]))


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


def write_calibration(folder: Path, record: dict, trees: dict[str, list], *, say=print) -> str:
    """Write a calibration beside the heads in ``folder``; return where in config.json it went.

    ``record`` names its ``default_tree``, ``lookup``, ``device_kind`` and ``dtype``. It replaces the
    top-level calibration (and config.json's ``default_tree`` and ``lookup``) when there is none or it
    was made on the same kind of device in the same numerics (a record without a kind was made on a
    CPU); otherwise it replaces the record of its kind and numerics in ``calibrations`` (under
    ``calibration_key``: "cuda-bfloat16", "cpu-float32") and the top-level one stays as it is.
    ``trees`` join trees.json by name; a name whose choices differ from the stored ones takes the new
    choices (said). Each file is replaced whole (written beside it, then renamed), trees.json first,
    so config.json never names a tree trees.json lacks.
    """
    trees_path, config_path = folder / TREES_FILE, folder / CONFIG_FILE
    stored = json.loads(trees_path.read_text()) if trees_path.exists() else {}
    changed = [n for n in trees if n in stored and stored[n] != trees[n]]
    # Smallest first, as the tree menu lists them.
    merged = dict(sorted({**stored, **trees}.items(), key=lambda kv: len(kv[1])))
    cfg = json.loads(config_path.read_text())
    kind, top = record["device_kind"], cfg.get("calibration")

    # this device kind and numerics (a record saying none: any)
    def same(r: dict, key: str | None = None) -> bool:
        return record_kind(r, key) == kind and record_numerics(r) in (None, record_numerics(record))

    # the other calibrations, under any older key too
    others = {k: r for k, r in (cfg.get("calibrations") or {}).items() if not same(r, k)}
    if isinstance(top, dict) and not same(top):
        key = calibration_key(record)
        others[key] = record
        where = f"calibrations.{key} of {CONFIG_FILE}; the top-level {calibration_key(top)} calibration is kept"
    else:
        cfg["default_tree"], cfg["lookup"], cfg["calibration"] = record["default_tree"], record["lookup"], record
        where = f"the top level of {CONFIG_FILE}"
    if others:
        cfg["calibrations"] = others
    else:
        cfg.pop("calibrations", None)
    replace_file(trees_path, json.dumps(merged, indent=None) + "\n")
    replace_file(config_path, json.dumps(cfg, indent=2) + "\n")
    if changed:
        say(
            f"note: {', '.join(changed)} in {TREES_FILE} had other choices from an earlier calibration; "
            "kept this one's "
            "(figures recorded for them on another device were measured with the old ones: recalibrate there too)"
        )
    say(
        f"wrote {trees_path}, default_tree={record['default_tree']} and lookup={record['lookup']} "
        f"({' '.join(x for x in (KIND_NAMES.get(kind, kind), record_numerics(record)) if x)} calibration: {where})"
    )
    return where


if __name__ == "__main__":
    main()
