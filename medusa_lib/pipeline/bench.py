"""Benchmark: Medusa against what a user would pick instead, on one model and one device.

    python -m medusa_lib.pipeline.bench --methods hf-generate,baseline,hf-prompt-lookup,medusa-greedy --repeats 3
    python -m medusa_lib.pipeline.bench --sampled --temperature 0.7 --seed 0 --dtype float32   # sampling: exact and typical
    python -m medusa_lib.pipeline.bench --forward-costs [--no-prepack] [--stock-attention]   # what a forward of L tokens costs

Methods (all greedy unless noted, same dtype, same chat-templated prompts):
  hf-generate       ``model.generate(do_sample=False)``: what most users run
  hf-generate-static  the same with ``cache_implementation="static"``, one cache length for the whole
                    bench (longest prompt + --max-new-tokens), so no prompt recompiles it: on CUDA
                    transformers compiles its decode step (torch.compile, CUDA graphs); on CPU it runs
                    eager. Its warm-up runs (two prompt lengths) are timed apart ("warm-up s").
  baseline          our plain autoregressive loop (the same code path the Medusa loop uses)
  hf-prompt-lookup  ``model.generate(prompt_lookup_num_tokens=10)``: draft-free n-gram speculation
  medusa-greedy     Medusa heads + tree attention (+ the lookup branch, --lookup), exact greedy
  medusa-heads-only Medusa greedy with the heads' tree alone (no lookup branch)
  medusa-typical    Medusa typical acceptance (epsilon, delta; T = --temperature), root sampled with --seed
  medusa-greedy-nodetail  Medusa greedy without recording the per-step tree detail
  plain-sample      our plain loop sampling at --temperature, --top-p, --seed
  medusa-sample     Medusa exact (lossless) speculative sampling, same tree and lookup as medusa-greedy
  eagle-greedy      the EAGLE head (--eagle) drafting EAGLE-2's dynamic tree (--eagle-tree), no lookup branch,
                    on the same verifier: exact greedy
  eagle-sample      the same drafter with exact speculative sampling (same seed as plain-sample)
  eagle-typical     the same drafter with typical acceptance, root sampled with --seed

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
"tokens/s" counts the decode steps only (its prefill is shown apart), so the two differ by design. Forward calls of the HF methods are
counted with a hook (steps), and its first call gives their prefill time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

from ..core.decoding import DecodeConfig, DecodeError, Decoder, _sync, first_difference
from ..core.defaults import heads_defaults
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.eagle import load_eagle
from ..core.fused import ready
from ..core.heads import load_heads
from ..core.kv import describe_engine, prepare_engine
from ..core.lab import step_costs
from ..core.messages import InputError, cause
from ..core.model import chat_prompt_ids, eos_token_ids, input_device, load_model
from ..core.packing import is_prepacked
from ..core.tree import get_tree, with_lookup
from .cli import add_model_arguments
from .jsonl import load_jsonl

ALL_METHODS = (
    "hf-generate",
    "hf-generate-static",
    "baseline",
    "hf-prompt-lookup",
    "medusa-greedy",
    "medusa-heads-only",
    "medusa-typical",
    "medusa-greedy-nodetail",
    "plain-sample",
    "medusa-sample",
    "eagle-greedy",
    "eagle-sample",
    "eagle-typical",
)
DEFAULT_METHODS = "hf-generate,baseline,hf-prompt-lookup,medusa-greedy,medusa-typical"
CUDA_DEFAULT_METHODS = "hf-generate,hf-generate-static,baseline,hf-prompt-lookup,medusa-greedy,medusa-typical"  # compiled static generate: what a GPU user would race
WARMUP_PROMPT_LENGTHS = {
    "hf-generate-static": (32, 16)
}  # a second prompt length: any recompile a new length causes happens here, not in the table
SAMPLED_METHODS = (
    "plain-sample",
    "medusa-sample",
    "medusa-typical",
    "eagle-sample",
    "eagle-typical",
)  # draw from the seed when --temperature > 0 (--sampled: the first three)
EXACT_SAMPLERS = {
    "medusa-sample": "plain-sample",
    "eagle-sample": "plain-sample",
}  # lossless: same seed, same output as its reference
DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "data" / "bench_prompts.jsonl"
DEFAULT_HEADS = Path(__file__).resolve().parents[2] / "assets" / "heads" / "smollm2-135m-instruct"
DEFAULT_EAGLE = Path(__file__).resolve().parents[2] / "assets" / "heads" / "smollm2-135m-instruct-eagle"


class ForwardClock:
    """Counts a model's forward calls and stamps the end of the first one (the prefill).

    ``first_only``: unhook after the prefill, so a compiled decode step never sees the hook (a
    timestamp inside it would break the graph); the caller counts the steps instead."""

    def __init__(self, model, device, *, first_only: bool = False):
        self.device, self.calls, self.first_end, self.first_only = device, 0, None, first_only
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.calls += 1
        if self.calls == 1:
            self.first_end = _sync(self.device)
            if self.first_only:
                self.handle.remove()

    def close(self):
        self.handle.remove()


def run_hf(
    model, ids: list[int], *, max_new_tokens: int, lookup: bool, eos, static_cache_len: int | None = None
) -> dict:
    """``model.generate`` greedy, timed like our loops. ``lookup``: prompt-lookup decoding.
    ``static_cache_len``: a StaticCache of that many positions, whatever the prompt's length (so the
    decode step transformers compiles on CUDA keeps one shape); its steps are the new tokens after
    the prefill's (one token per forward, as greedy generate makes them)."""
    device = input_device(model)
    clock = ForwardClock(model, device, first_only=static_cache_len is not None)
    try:
        inp = torch.tensor([ids], device=device)
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=eos[0] if eos else None,
            temperature=None,
            top_p=None,
            top_k=None,
        )
        if lookup:
            kwargs["prompt_lookup_num_tokens"] = 10
        if static_cache_len is not None:
            kwargs |= {"cache_implementation": "static", "max_cache_len": static_cache_len}
        t0 = _sync(device)
        out = model.generate(inp, attention_mask=torch.ones_like(inp), **kwargs)
        t1 = _sync(device)
    finally:
        clock.close()
    new = out[0, len(ids) :].tolist()
    prefill = (clock.first_end or t1) - t0
    steps = max(len(new) - 1, 0) if clock.first_only else max(clock.calls - 1, 0)
    return {
        "output_token_ids": new,
        "new_tokens": len(new),
        "steps": steps,
        "prefill_seconds": prefill,
        "decode_seconds": t1 - t0 - prefill,
    }


def run_ours(decoder: Decoder, ids: list[int]) -> dict:
    res = decoder.run(ids)
    phases = defaultdict(float)
    for s in res.steps[1:]:
        for k, v in s.phases.items():
            phases[k] += v
    return {
        "output_token_ids": res.tokens,
        "new_tokens": len(res.tokens),
        "steps": res.decode_steps,
        "prefill_seconds": res.prefill_seconds,
        "decode_seconds": res.decode_seconds,
        "phase_seconds": dict(phases),
        "lookup_tokens": res.lookup_tokens,
        "accept_lengths": [
            s.accept_length for s in res.steps[1:] if s.finish_reason is None
        ],  # full steps: what the drafter got accepted
    }


def forward_costs(model, *, sizes=(1, 2, 5, 9, 17, 33), prefix: int = 256, repeats: int = 20) -> list[dict]:
    """Median ms of one body forward of L new tokens after a cached prefix and of the lm_head over
    those L rows: the tree lab's ``lab.step_costs``, one function for both."""
    return step_costs(model, sizes, prefix=prefix, repeats=repeats)


def format_forward_costs(rows: list[dict]) -> str:
    lines = [f"{'tokens':>7}{'body ms':>10}{'lm_head ms':>12}{'vs 1 token':>12}"]
    lines += [f"{r['tokens']:>7}{r['body_ms']:>10.1f}{r['lm_head_ms']:>12.1f}{r['vs_one_token']:>11.2f}x" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help='JSONL lines {"id", "category", "prompt"}')
    which = ap.add_mutually_exclusive_group()
    which.add_argument(
        "--methods",
        default=None,
        help=f"comma list of {', '.join(ALL_METHODS)} (default {DEFAULT_METHODS}; on CUDA {CUDA_DEFAULT_METHODS})",
    )
    which.add_argument(
        "--sampled",
        action="store_const",
        const=",".join(SAMPLED_METHODS[:3]),
        dest="methods",
        default=None,
        help=f"the sampled comparison: --methods {','.join(SAMPLED_METHODS)}",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--tree", default=None, help="tree preset (default: the heads' calibrated default)")
    ap.add_argument(
        "--lookup",
        type=int,
        default=None,
        help="lookup-branch length of the medusa methods (default: the heads' calibrated one, 0 if calibrated without it, else 4; 0 = heads only)",
    )
    add_model_arguments(ap)
    ap.add_argument("--heads", default=str(DEFAULT_HEADS))
    ap.add_argument("--eagle", default=str(DEFAULT_EAGLE), help="EAGLE head folder of the eagle-* methods")
    ap.add_argument(
        "--eagle-tree",
        default=None,
        help="the eagle-* methods' dynamic tree as top_k,depth,nodes (default: the head's own)",
    )
    ap.add_argument(
        "--record-eagle",
        action="store_true",
        help="write eagle-greedy's measured speed-up over baseline into the EAGLE head's config.json "
        "(calibration: the page's Drafter default reads it for this kind of device)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    ap.add_argument("--per-category", type=int, default=0, help="only the first N prompts of each category")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.7,
        help="temperature of the sampled methods (plain-sample, medusa-sample, medusa-typical)",
    )
    ap.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="nucleus sampling of plain-sample, medusa-sample and medusa-typical's root",
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed of plain-sample, medusa-sample and medusa-typical (which always samples its root with it)",
    )
    ap.add_argument("--no-chat-template", action="store_true")
    ap.add_argument(
        "--no-prepack",
        action="store_true",
        help="keep stock nn.Linear weights on CPU (every method; to measure what pre-packing gives)",
    )
    ap.add_argument(
        "--stock-attention",
        action="store_true",
        help="keep transformers' sdpa attention on CPU instead of the packed-GQA one (every method)",
    )
    ap.add_argument(
        "--cache",
        default="auto",
        choices=["auto", "dynamic", "static"],
        help="KV cache of our methods (auto: static on CUDA, dynamic on a CPU; core/kv.py)",
    )
    ap.add_argument(
        "--capture",
        default="auto",
        choices=["auto", "none", "compile", "cuda-graph"],
        help="with --cache static, compile or record the fixed-shape steps before timing (auto: cuda-graph on CUDA, none on a CPU); reported as 'capture s'",
    )
    ap.add_argument("--json", default=None, help="write all records to this JSON file")
    ap.add_argument(
        "--forward-costs",
        action="store_true",
        help="only time one forward of 1..33 tokens after a 256-token prefix (what a tree step costs), then stop",
    )
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
    prompts = load_jsonl(args.prompts)
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

    model, tok = load_model(
        args.model,
        device=args.device,
        dtype=args.dtype,
        prepack=not args.no_prepack,
        packed_gqa=not args.stock_attention,
        progress=lambda m: print(m, flush=True),
    )
    prepacked = is_prepacked(model)
    attention = model.config._attn_implementation
    dtype = next(model.parameters()).dtype
    device = input_device(model)
    if args.methods is None and device.type == "cuda":
        methods = CUDA_DEFAULT_METHODS.split(",")
    setup = f"model {args.model} | {dtype} | {device} | {'pre-packed' if prepacked else 'stock'} linear weights | attention {attention} | torch threads {torch.get_num_threads()}"
    if args.forward_costs:
        print(setup)
        print(format_forward_costs(forward_costs(model, repeats=args.repeats * 7)))
        return
    eos = eos_token_ids(model)
    encoded = [(p, chat_prompt_ids(tok, p["prompt"], chat_template=not args.no_chat_template)) for p in prompts]
    static_cache_len = (
        max(len(ids) for _, ids in encoded) + args.max_new_tokens
    )  # one cache shape for every prompt: never a recompile
    decoders = {}
    tree_name, lookup, note, tree = None, 0, None, None
    if any(m.startswith("medusa") for m in methods):
        heads = load_heads(args.heads, model=model)
        defaults = heads_defaults(heads, device)  # the playground's defaults too (this device kind's calibration)
        note = defaults.note  # calibrated on another kind of device only
        if note:
            print(f"note: {note}", flush=True)
        tree_name = args.tree or defaults.tree
        tree = get_tree(tree_name, num_heads=heads.num_heads, extra=heads.tree_presets)
        lookup = args.lookup if args.lookup is not None else defaults.lookup_length
        tree_name = f"{tree_name} + lookup-{lookup}" if lookup else tree_name
    # Our methods' engine: the cache, and with a capture the shared static cache, long enough for the
    # widest step the methods below verify (the tree + its lookup branch); the warm-up captures their steps.
    shapes = [tree, with_lookup(tree, lookup)] if tree is not None else []
    widest = max((t.num_nodes for t in shapes), default=1)
    try:
        engine = prepare_engine(
            model,
            cache=args.cache,
            capture=args.capture,
            max_len=static_cache_len + widest,
            say=lambda m: print(m, flush=True),
        )
    except InputError as e:
        raise SystemExit(str(e)) from None
    own = {"cache": engine.cache}

    def ours(method: str, config: DecodeConfig, **kw) -> Decoder:
        return Decoder(model, method=method, config=replace(config, **own), static_kv=engine.static_kv, **kw)

    if tree is not None:
        cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, lookup=lookup)
        decoders["medusa-greedy"] = ours("medusa-greedy", cfg, heads=heads, tree=tree)
        decoders["medusa-heads-only"] = ours(
            "medusa-greedy", DecodeConfig(max_new_tokens=args.max_new_tokens), heads=heads, tree=tree
        )
        decoders["medusa-greedy-nodetail"] = ours(
            "medusa-greedy",
            DecodeConfig(max_new_tokens=args.max_new_tokens, record_detail=False, lookup=lookup),
            heads=heads,
            tree=tree,
        )
        decoders["medusa-typical"] = ours(
            "medusa-typical", replace(sample_cfg, sample_root=True, lookup=lookup), heads=heads, tree=tree
        )
        decoders["medusa-sample"] = ours("medusa-sample", replace(sample_cfg, lookup=lookup), heads=heads, tree=tree)
    eagle_tree = None
    if any(m.startswith("eagle") for m in methods):
        try:
            eagle = load_eagle(args.eagle, model=model)
            eagle_tree = (
                DynamicTreeConfig(*map(int, args.eagle_tree.split(","))) if args.eagle_tree else eagle.config.tree
            )
            eagle_tree.check()
        except (InputError, ValueError, TypeError) as e:
            raise SystemExit(
                f"--eagle / --eagle-tree: {e if isinstance(e, InputError) else 'write the tree as three whole numbers, top_k,depth,nodes (e.g. 8,5,24)'}"
            ) from None
        decoders["eagle-greedy"] = ours(
            "medusa-greedy", DecodeConfig(max_new_tokens=args.max_new_tokens), eagle=eagle, tree=eagle_tree
        )
        decoders["eagle-sample"] = ours("medusa-sample", sample_cfg, eagle=eagle, tree=eagle_tree)
        decoders["eagle-typical"] = ours(
            "medusa-typical", replace(sample_cfg, sample_root=True), eagle=eagle, tree=eagle_tree
        )
    decoders["baseline"] = ours("plain", DecodeConfig(max_new_tokens=args.max_new_tokens))
    decoders["plain-sample"] = ours("plain", sample_cfg)

    def run(method: str, ids: list[int]) -> dict:
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
    static = f" | static cache {static_cache_len}" if "hf-generate-static" in methods else ""
    eagle_desc = (
        f" | eagle tree top-k {eagle_tree.top_k} depth {eagle_tree.depth} nodes {eagle_tree.num_nodes}"
        if eagle_tree
        else ""
    )
    description = engine.description
    if (
        engine.static_kv is not None and engine.static_kv.capture != "none"
    ):  # every step shape captured now, timed apart, never in a run
        kv = engine.static_kv
        for m in methods:
            if m in decoders and decoders[m].static:
                try:
                    ready(decoders[m], kv)
                except Exception as e:  # noqa: BLE001  that method's runs take the dynamic cache (Decoder.steps), said here once
                    print(f"Capturing {m}'s steps failed ({cause(e)}); its runs use the dynamic cache.", flush=True)
        description = describe_engine("static", kv.capture, shapes=kv.programs_captured, seconds=kv.capture_seconds)
        print(f"Engine: {description}.", flush=True)
    print(
        f"{setup} | {description} | tree {tree_name}{eagle_desc} | {len(prompts)} prompts x {args.repeats} repeats | max_new_tokens {args.max_new_tokens}{sampling}{static}",
        flush=True,
    )
    warmup_seconds = {}
    for m in methods:  # warm-up: every code path once (compilation, graph capture, first-call set-up), timed apart
        t0 = _sync(device)
        for length in WARMUP_PROMPT_LENGTHS.get(m, (32,)):
            run(m, encoded[0][1][:length])
        warmup_seconds[m] = _sync(device) - t0

    records = []
    t_start = time.perf_counter()
    for p, ids in encoded:
        per_method: dict[str, list[dict]] = defaultdict(list)
        for _ in range(args.repeats):
            for m in methods:  # one after another, interleaved across repeats
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
            for k in ("phase_seconds", "lookup_tokens", "accept_lengths"):
                if k in med:
                    rec[k] = med[k]
            records.append(rec)
        print(
            f"  {p['id']}: "
            + "  ".join(
                f"{m} {statistics.median(r['new_tokens'] / (r['prefill_seconds'] + r['decode_seconds']) for r in per_method[m]):.1f} e2e tok/s"
                for m in methods
            ),
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
            "attention": attention,
        }
        out |= {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed, "sampled_methods": sampled}
        out["speedup_reference"] = {m: reference_of(m, methods, sampled) for m in methods}
        out["exact_sampling"] = {
            m: identical_outputs(records, m, ref)
            for m, ref in EXACT_SAMPLERS.items()
            if m in methods and ref in methods
        }
        out["warmup_seconds"] = warmup_seconds
        out["static_cache_len"] = static_cache_len if "hf-generate-static" in methods else None
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
        )


def record_eagle(
    folder: Path, records: list[dict], *, device, dtype: str, argv, tree, args, medusa_tree: str | None = None
) -> None:
    """eagle-greedy's e2e speed-up over baseline on this run's prompts, into the head's config.json
    ``calibration``, with medusa-greedy's from the same run when it ran (present/drafter.py compares
    the two to pick the page's default drafter)."""
    import datetime
    import sys

    from ..core.defaults import device_kind

    by = defaultdict(list)
    for r in records:
        by[r["method"]].append(r)
    if not by.get("eagle-greedy") or not by.get("baseline"):
        raise SystemExit("--record-eagle needs eagle-greedy and baseline in --methods.")
    rate = lambda rs: sum(r["new_tokens"] for r in rs) / sum(r["prefill_seconds"] + r["decode_seconds"] for r in rs)  # noqa: E731
    eg = by["eagle-greedy"]
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["calibration"] = {
        "device_kind": device_kind(device),
        "speedup": round(rate(eg) / rate(by["baseline"]), 3),
        "tokens_per_step": round(sum(r["new_tokens"] for r in eg) / sum(r["steps"] for r in eg), 3),
        "dtype": dtype,
        "tree": [tree.top_k, tree.depth, tree.num_nodes],
        "prompts": len(eg),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "date": datetime.date.today().isoformat(),
        "command": "python -m medusa_lib.pipeline.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    if by.get("medusa-greedy"):  # the other drafter, in the same run: the page compares these two (ratios of one run)
        cfg["calibration"]["medusa_speedup"] = round(rate(by["medusa-greedy"]) / rate(by["baseline"]), 3)
        cfg["calibration"]["medusa_tree"] = medusa_tree
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    medusa = (
        f", medusa-greedy {cfg['calibration']['medusa_speedup']:.2f}x" if "medusa_speedup" in cfg["calibration"] else ""
    )
    print(
        f"recorded in {cfg_path}: eagle-greedy {cfg['calibration']['speedup']:.2f}x{medusa} baseline on {device_kind(device)}"
    )


def reference_of(method: str, methods: list[str], sampled: list[str]) -> str | None:
    """The plain loop a method's speed-up is measured against: plain-sample for sampled methods
    (when it ran: sampling costs a little per token, and typical/exact acceptance should be
    credited only for what the tree adds), baseline for the rest (and sampled ones without it)."""
    if method in sampled and "plain-sample" in methods:
        return "plain-sample"
    return "baseline" if "baseline" in methods else None


def identical_outputs(records: list[dict], method: str, reference: str) -> dict:
    """Prompts whose output under ``method`` equals ``reference``'s, and where the others first differ."""
    ref = {r["id"]: r["output_token_ids"] for r in records if r["method"] == reference}
    diffs = {r["id"]: first_difference(r["output_token_ids"], ref[r["id"]]) for r in records if r["method"] == method}
    bad = {i: d for i, d in diffs.items() if d is not None}
    return {"reference": reference, "identical": len(diffs) - len(bad), "prompts": len(diffs), "first_difference": bad}


def report(records: list[dict], methods: list[str], *, sampled: list[str] = ()) -> str:
    """The tables: per method, per category, per phase, output equality of the greedy methods against
    hf-generate and of the exact sampler against plain-sample (``sampled``: the methods that sampled)."""
    by = defaultdict(list)
    for r in records:
        by[r["method"]].append(r)

    def rate(rs):  # e2e tok/s over the whole set = total new tokens / total time (prefill + decode)
        return sum(r["new_tokens"] for r in rs) / max(sum(r["prefill_seconds"] + r["decode_seconds"] for r in rs), 1e-9)

    def step_ms(rs):
        steps = sum(r["steps"] for r in rs)
        return 1000 * sum(r["decode_seconds"] for r in rs) / max(steps, 1)

    def ratio(x: float | None, width: int) -> str:  # "-" where the reference did not run
        return f"{x:>{width}.2f}x" if x is not None else f"{'-':>{width + 1}}"

    hf_rate = rate(by["hf-generate"]) if by.get("hf-generate") else None
    lines = [
        f"{'method':<24}{'e2e tok/s':>10}{'tok/step':>10}{'ms/step':>9}{'step vs plain':>15}{'vs hf-generate':>16}{'vs plain':>10}{'prefill ms':>12}  plain ref"
    ]
    for m in methods:
        rs, ref = by[m], reference_of(m, methods, list(sampled))
        tps = sum(r["new_tokens"] for r in rs) / max(sum(r["steps"] for r in rs), 1)
        ms = step_ms(rs)
        row = f"{m:<24}{rate(rs):>10.1f}{tps:>10.2f}{ms:>9.1f}"
        row += ratio(ms / step_ms(by[ref]) if ref else None, 14)
        row += ratio(rate(rs) / hf_rate if hf_rate else None, 15)
        row += ratio(rate(rs) / rate(by[ref]) if ref else None, 9)
        row += f"{1000 * statistics.median(r['prefill_seconds'] for r in rs):>12.1f}  {ref or '-'}"
        lines.append(row)
    if any(reference_of(m, methods, list(sampled)) == "plain-sample" for m in methods):
        lines.append(
            '(step vs plain, vs plain: against the plain loop named in "plain ref": plain-sample for the sampled methods, baseline for greedy ones)'
        )

    cats = sorted({r["category"] for r in records})
    lines += ["", "e2e tok/s per category", f"{'category':<16}" + "".join(f"{m[:18]:>20}" for m in methods)]
    for c in cats:
        lines.append(f"{c:<16}" + "".join(f"{rate([r for r in by[m] if r['category'] == c]):>20.1f}" for m in methods))

    phase_rows = [m for m in methods if any("phase_seconds" in r for r in by[m])]
    if phase_rows:
        names = [
            p
            for p in ("propose", "verify", "accept", "commit", "step")
            if any(p in r.get("phase_seconds", {}) for m in phase_rows for r in by[m])
        ]
        whole = ' (static engine: one whole-step program, "step")' if "step" in names else ""
        lines += [
            "",
            f"mean ms per decode step, by phase{whole}",
            f"{'method':<24}" + "".join(f"{p:>10}" for p in names),
        ]
        for m in phase_rows:
            steps = max(sum(r["steps"] for r in by[m]), 1)
            tot = defaultdict(float)
            for r in by[m]:
                for k, v in r.get("phase_seconds", {}).items():
                    tot[k] += v
            lines.append(f"{m:<24}" + "".join(f"{1000 * tot[p] / steps:>10.2f}" for p in names))

    depth_rows = [
        m for m in methods if any(r.get("accept_lengths") for r in by[m]) and not m.startswith(("baseline", "plain"))
    ]
    if depth_rows:  # how deep the drafts got accepted: share of full steps that accepted >= k drafted tokens
        lines += [
            "",
            "share of decode steps accepting >= k drafted tokens (tokens/step = 1 + the sum of the row)",
            f"{'method':<24}" + "".join(f"{'>=' + str(k):>8}" for k in range(1, 7)),
        ]
        for m in depth_rows:
            acc = [a for r in by[m] for a in r.get("accept_lengths", [])]
            lines.append(
                f"{m:<24}" + "".join(f"{sum(a >= k for a in acc) / max(len(acc), 1):>8.2f}" for k in range(1, 7))
            )

    lookup_rows = [m for m in methods if any(r.get("lookup_tokens") for r in by[m])]
    if lookup_rows:
        lines += ["", "tokens accepted from the lookup branch (share of all new tokens)"]
        for m in lookup_rows:
            n = sum(r.get("lookup_tokens", 0) for r in by[m])
            lines.append(f"  {m:<24}{n:>6} ({n / max(sum(r['new_tokens'] for r in by[m]), 1):.1%})")

    if by.get("hf-generate") and any(m != "hf-generate" and m not in sampled for m in methods):
        ref = {r["id"]: r["output_token_ids"] for r in by["hf-generate"]}
        lines += ["", "outputs identical to hf-generate"]
        for m in methods:
            if m == "hf-generate" or m in sampled:  # a sample is not meant to match greedy decoding
                continue
            diffs = [(r["id"], first_difference(r["output_token_ids"], ref[r["id"]])) for r in by[m]]
            bad = [(i, d) for i, d in diffs if d is not None]
            where = ", ".join(f"{i}@{d}" for i, d in bad[:6]) + (" ..." if len(bad) > 6 else "")
            lines.append(f"  {m:<24}{len(diffs) - len(bad)}/{len(diffs)}" + (f"   differ: {where}" if bad else ""))

    for m, ref in EXACT_SAMPLERS.items():  # lossless sampling: same seed, same tokens (float32)
        if by.get(m) and by.get(ref):
            same = identical_outputs(records, m, ref)
            bad = list(same["first_difference"].items())
            where = ", ".join(f"{i}@{d}" for i, d in bad[:6]) + (" ..." if len(bad) > 6 else "")
            lines += [
                "",
                f"{m} == {ref}: {same['identical']}/{same['prompts']} identical"
                + (f"   differ: {where} (exact in float32; low precision may flip near-ties)" if bad else ""),
            ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
