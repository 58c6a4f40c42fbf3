"""Benchmark: Medusa against what a user would pick instead, on one model and one device.

    python -m medusa_lib.pipeline.bench --methods hf-generate,baseline,hf-prompt-lookup,medusa-greedy --repeats 3
    # sampling: exact and typical
    python -m medusa_lib.pipeline.bench --sampled --temperature 0.7 --seed 0 --dtype float32
    # what a forward of L tokens costs
    python -m medusa_lib.pipeline.bench --forward-costs [--no-prepack] [--stock-attention]

Methods (all greedy unless noted, same dtype, same chat-templated prompts):
  hf-generate       ``model.generate(do_sample=False)``: what most users run
  hf-generate-static  the same with ``cache_implementation="static"``, one cache length for the whole
                    bench (longest prompt + --max-new-tokens), so no prompt recompiles it: on CUDA
                    transformers compiles its decode step (torch.compile, CUDA graphs); on CPU it runs
                    eager. Its warm-up runs (two prompt lengths) are timed apart ("warm-up s").
  baseline          our plain autoregressive loop (the same code path the Medusa loop uses)
  hf-compiled       the compile anchor: transformers' StaticCache (the same length) and a greedy one-token
                    step under ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (gpt-fast's
                    recipe, what a transformers user runs with one compile line), eager prefill; stops as
                    ours do. Compiled in its warm-up (timed apart).
  hf-prompt-lookup  ``model.generate(prompt_lookup_num_tokens=10)``: draft-free n-gram speculation
  medusa-greedy     Medusa heads + tree attention (+ the lookup branch, --lookup), exact greedy
  medusa-heads-only Medusa greedy with the heads' tree alone (no lookup branch)
  medusa-typical    Medusa typical acceptance (epsilon, delta; T = --temperature), root sampled with --seed
  medusa-greedy-nodetail  Medusa greedy without recording the per-step tree detail
  plain-sample      our plain loop sampling at --temperature, --top-p, --seed
  medusa-sample     Medusa exact (lossless) speculative sampling, same tree and lookup as medusa-greedy
  eagle-greedy      the EAGLE head (--eagle) drafting EAGLE-2's dynamic tree (--eagle-tree), no lookup branch,
                    on the same verifier: exact greedy
  eagle-lookup      the same drafter with the lookup branch beside its tree (--lookup; the medusa methods'
                    length, else 4), as the page runs it
  eagle-sample      the same drafter with exact speculative sampling (same seed as plain-sample)
  eagle-typical     the same drafter with typical acceptance, root sampled with --seed
  <drafter>-greedy  every other registered drafter (core/drafters/: lookup, rest, ...) on the same verifier,
                    built from what it loads beside --heads: exact greedy (lookup-greedy: prompt lookup alone,
                    a chain of up to --lookup tokens, 4 when 0 or unset; rest-greedy: REST's datastore)
  <drafter>-sample  the same drafter with exact speculative sampling (same seed as plain-sample)
  <drafter>-typical the same drafter with typical acceptance, root sampled with --seed

Our methods (baseline, plain-sample, medusa-*) run on one engine (--cache, --capture; core/kv.py):
auto is a static KV cache with a CUDA graph per step shape on CUDA, the dynamic cache on a CPU. A
capture is recorded before the warm-up and timed apart ("capture s").
Sampled methods (--sampled = plain-sample,medusa-sample,medusa-typical) share one DecodeConfig
(temperature, top-p, seed); every run seeds its own generator from it, so with the same seed
medusa-sample's output equals plain-sample's token for token in float32 (bfloat16 may differ at
near-ties): the report counts that, as it counts greedy outputs identical to hf-generate.
medusa-typical always samples its root/bonus token with the seed (as the reference Medusa's
typical mode does), so the three draw from one seed; it is faster than exact sampling but not
lossless. Their speed-ups ("vs plain", "step vs plain") are against plain-sample when it ran,
greedy methods' against baseline (the table's "plain ref" column names which). --temperature 0
with plain-sample or medusa-sample is refused: at 0 they are baseline and medusa-greedy.
Timing: a warm-up run of every method first (its seconds printed apart as "warm-up s", never in
the tables); device-synchronised timestamps; the methods run one after another (never
concurrently); medians over ``--repeats``. "e2e tok/s" (end to end) = new tokens /
(prefill + decode) for every method, so HF and ours are measured the same way; the playground's
"tokens/s" counts the decode steps only (its prefill is shown apart), so the two differ by design.
Forward calls of the HF methods are counted with a hook (steps), and its first call gives their
prefill time. The drafter methods' acceptance (mean acceptance length, rate per draft position, over the
steps that drafted) is reported as vLLM reports it (core/spec_metrics.py; docs/engine.md), also in --json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from ..core.chat import chat_prompt_ids
from ..core.config import DecodeConfig, DecodeError
from ..core.messages import InputError, cause
from ..core.model import eos_token_ids, input_device, load_model
from ..core.packing import few_row_kernels, is_prepacked
from ..core.static_run import ready
from ..core.steps import sync

# re-exported: the methods are bench's
from .bench_args import (  # noqa: F401
    ALL_METHODS,
    CUDA_DEFAULT_METHODS,
    DEFAULT_EAGLE,
    DEFAULT_HEADS,
    DEFAULT_METHODS,
    DEFAULT_PROMPTS,
    DRAFTER_METHODS,
    SAMPLED_METHODS,
    WARMUP_PROMPT_LENGTHS,
    parser,
)
from .bench_decoders import build_decoders
from .bench_report import acceptance_by_method, exact_sampling, record_eagle, reference_of, report
from .bench_runs import RUN_DETAIL, CompiledLoop, e2e_rate, format_forward_costs, forward_costs, run_hf, run_ours
from .cli import (
    check_heads_path,
    check_model_arguments,
    check_tree_name,
    check_writable,
    fail,
    read_prompts,
)


def check_arguments(args: argparse.Namespace, methods: list[str]) -> None:
    """What can be refused before the model loads, one sentence each (cli.py)."""
    check_model_arguments(args)
    if any(m.startswith("medusa") for m in methods):
        check_heads_path(args.heads)
        check_tree_name(args.tree, heads=args.heads)
    if args.json:
        check_writable(args.json, flag="--json")


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    args = ap.parse_args(argv)

    methods = [m.strip() for m in (args.methods or DEFAULT_METHODS).split(",") if m.strip()]
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown:
        raise SystemExit(f"Unknown method {unknown[0]!r}; choose from {', '.join(ALL_METHODS)}.")
    # One sampling config for every sampled method: same temperature, top-p and seed, so the exact
    # sampler's outputs can be compared with plain sampling's prompt by prompt.
    sample_cfg = DecodeConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    try:
        sample_cfg.check()
    except DecodeError as e:
        raise SystemExit(str(e)) from None
    if args.temperature == 0 and {"plain-sample", "medusa-sample"} & set(methods):
        raise SystemExit(
            "plain-sample and medusa-sample need --temperature > 0 (at 0 they are baseline and medusa-greedy)."
        )
    sampled = [m for m in methods if m in SAMPLED_METHODS and args.temperature > 0]
    check_arguments(args, methods)
    prompts = read_prompts(args.prompts)
    if args.per_category:
        seen: dict[str, int] = defaultdict(int)
        kept = []
        for p in prompts:
            seen[p.get("category", "")] += 1
            if seen[p.get("category", "")] <= args.per_category:
                kept.append(p)
        prompts = kept
    if args.limit:
        prompts = prompts[: args.limit]
    try:
        model, tok = load_model(
            args.model,
            device=args.device,
            dtype=args.dtype,
            prepack=not args.no_prepack,
            packed_gqa="always" if args.fold_gqa else not args.stock_attention,
            progress=lambda m: print(m, flush=True),
        )
    except InputError as e:
        # ModelError: one sentence
        fail(e)
    prepacked = is_prepacked(model)
    attention = model.config._attn_implementation
    dtype = next(model.parameters()).dtype
    device = input_device(model)
    if args.methods is None and device.type == "cuda":
        methods = CUDA_DEFAULT_METHODS.split(",")
    # Inductor cannot lower oneDNN's opaque packed weights
    if "hf-compiled" in methods and prepacked:
        fail("hf-compiled compiles the stock model, and these weights are pre-packed for this CPU: add --no-prepack.")
    mkl_rows = few_row_kernels(model)
    mkl = f" (MKL for {', '.join(map(str, mkl_rows))} rows)" if mkl_rows else ""
    setup = (
        f"model {args.model} | {dtype} | {device} | {'pre-packed' if prepacked else 'stock'} linear weights{mkl} "
        f"| attention {attention} | torch threads {torch.get_num_threads()}"
    )
    if args.forward_costs:
        print(setup)
        print(format_forward_costs(forward_costs(model, repeats=args.repeats * 7)))
        return
    eos = eos_token_ids(model)
    encoded = [(p, chat_prompt_ids(tok, p["prompt"], chat_template=not args.no_chat_template)) for p in prompts]
    # One cache shape for every prompt: never a recompile.
    static_cache_len = max(len(ids) for _, ids in encoded) + args.max_new_tokens
    built = build_decoders(model, args, methods, sample_cfg=sample_cfg, static_cache_len=static_cache_len)
    decoders, engine, tree_name, lookup, note = built.decoders, built.engine, built.tree_name, built.lookup, built.note
    heads, eagle, eagle_tree = built.heads, built.eagle, built.eagle_tree

    # The compile anchor: built once (one cache, one compiled step for every prompt), compiled in the warm-up.
    loop = CompiledLoop(model, cache_len=static_cache_len) if "hf-compiled" in methods else None

    def run(method: str, ids: list[int]) -> dict:
        if method == "hf-compiled":
            return loop.run(ids, max_new_tokens=args.max_new_tokens, eos=eos)
        if method.startswith("hf-"):
            return run_hf(
                model,
                ids,
                max_new_tokens=args.max_new_tokens,
                lookup=method == "hf-prompt-lookup",
                eos=eos,
                static_cache_len=static_cache_len if method == "hf-generate-static" else None,
            )
        return run_ours(decoders[method], ids)

    sampling = f" | sampling T {args.temperature} top-p {args.top_p} seed {args.seed}" if sampled else ""
    static = f" | static cache {static_cache_len}" if {"hf-generate-static", "hf-compiled"} & set(methods) else ""
    eagle_desc = (
        f" | eagle tree top-k {eagle_tree.top_k} depth {eagle_tree.depth} nodes {eagle_tree.num_nodes}"
        + (f" (eagle-lookup + lookup-{decoders['eagle-lookup'].config.lookup})" if "eagle-lookup" in methods else "")
        if eagle_tree
        else ""
    )
    description = engine.description
    # Every step shape captured now, timed apart, never in a run.
    if engine.static_kv is not None and engine.static_kv.capture != "none":
        kv = engine.static_kv
        for m in methods:
            if m in decoders and decoders[m].static:
                try:
                    ready(decoders[m], kv, say=lambda line: print(line, flush=True))
                except Exception as e:  # noqa: BLE001
                    # That method's runs take the dynamic cache (Decoder.steps), said here once.
                    print(f"Capturing {m}'s steps failed ({cause(e)}); its runs use the dynamic cache.", flush=True)
        description = kv.describe()
        print(f"Engine: {description}.", flush=True)
    draft = "int8" if any(getattr(d, "int8", False) for d in (heads, eagle)) else "float"
    print(
        f"{setup} | drafts {draft} | {description} | tree {tree_name}{eagle_desc} | "
        f"{len(prompts)} prompts x {args.repeats} repeats | "
        f"max_new_tokens {args.max_new_tokens}{sampling}{static}",
        flush=True,
    )
    warmup_seconds = {}
    # warm-up: every code path once (compilation, graph capture, first-call set-up), timed apart
    for m in methods:
        t0 = sync(device)
        for length in WARMUP_PROMPT_LENGTHS.get(m, (32,)):
            run(m, encoded[0][1][:length])
        warmup_seconds[m] = sync(device) - t0

    records = []
    t_start = time.perf_counter()
    for p, ids in encoded:
        per_method: dict[str, list[dict]] = defaultdict(list)
        for _ in range(args.repeats):
            # one after another, interleaved across repeats
            for m in methods:
                per_method[m].append(run(m, ids))
        for m in methods:
            runs = per_method[m]
            med = sorted(runs, key=lambda r: r["prefill_seconds"] + r["decode_seconds"])[len(runs) // 2]
            rec = {
                "method": m,
                "id": p["id"],
                "category": p.get("category", ""),
                **{k: med[k] for k in ("output_token_ids", "new_tokens", "steps", "decode_seconds", "prefill_seconds")},
            }
            rec["total_seconds_runs"] = [r["prefill_seconds"] + r["decode_seconds"] for r in runs]
            # what our runs record beside the timings (bench_runs.py)
            for k in RUN_DETAIL:
                if k in med:
                    rec[k] = med[k]
            records.append(rec)
        print(
            f"  {p['id']}: "
            + "  ".join(f"{m} {statistics.median(e2e_rate(r) for r in per_method[m]):.1f} e2e tok/s" for m in methods),
            flush=True,
        )
    print(f"benchmark wall time {time.perf_counter() - t_start:.0f} s\n")
    print(report(records, methods, sampled=sampled))
    print(
        "\nwarm-up s (before the timed runs, not in the tables): "
        + ", ".join(f"{m} {w:.2f}" for m, w in warmup_seconds.items())
    )
    if engine.static_kv is not None:
        print(f"capture s (before the warm-up; not in the tables): {engine.static_kv.capture_seconds:.2f}")
    if args.json:
        out = {
            "model": args.model,
            "dtype": str(dtype),
            "device": str(device),
            "tree": tree_name,
            "eagle_tree": eagle_tree and [eagle_tree.top_k, eagle_tree.depth, eagle_tree.num_nodes],
            "lookup": lookup,
            "heads": str(args.heads) if tree_name else None,
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "prepacked": prepacked,
            # products of these row counts ran MKL's W @ x.T (packing.py)
            "mkl_rows": list(mkl_rows),
            "draft_int8": draft == "int8",
            "attention": attention,
        }
        out |= {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed, "sampled_methods": sampled}
        out["speedup_reference"] = {m: reference_of(m, methods, sampled) for m in methods}
        out["exact_sampling"] = exact_sampling(records, methods)
        # vLLM's metrics per drafter (bench_report.py)
        out["acceptance"] = acceptance_by_method(records, methods)
        out["warmup_seconds"] = warmup_seconds
        out["static_cache_len"] = static_cache_len if {"hf-generate-static", "hf-compiled"} & set(methods) else None
        out["calibration_note"] = note
        out["engine"] = {
            "cache": engine.cache,
            "capture": engine.static_kv.capture if engine.static_kv else "none",
            "description": description,
            "capture_seconds": engine.static_kv.capture_seconds if engine.static_kv else 0.0,
        }
        out["records"] = records
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"\nwrote {args.json}")
    if args.record_eagle:
        record_eagle(
            Path(args.eagle),
            records,
            device=device,
            dtype=str(dtype),
            argv=argv,
            tree=eagle_tree,
            args=args,
            medusa_tree=tree_name,
            draft=draft,
        )


if __name__ == "__main__":
    main()
