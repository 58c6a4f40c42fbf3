"""The bench's command line: its methods and options (``bench.py`` runs them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.config import MAX_LOOKUP
from ..core.drafters import REGISTRY
from .cli import add_engine_arguments, add_float_draft, add_model_arguments, whole_number

ALL_METHODS = (
    "hf-generate",
    "hf-generate-static",
    "hf-compiled",
    "baseline",
    "hf-prompt-lookup",
    "medusa-greedy",
    "medusa-heads-only",
    "medusa-typical",
    "medusa-greedy-nodetail",
    "plain-sample",
    "medusa-sample",
    "eagle-greedy",
    "eagle-lookup",
    "eagle-sample",
    "eagle-typical",
)
# the drafters with flags of their own (the Medusa heads: --heads, --tree; the EAGLE head: --eagle ...)
OWN_FLAGS = ("medusa", "eagle")
# every other registered drafter (prompt lookup, REST, ...): <name>-greedy, -sample, -typical, built
# from what it loads beside --heads (``Drafter.load``)
DRAFTER_METHODS = {
    f"{name}-{rule}": name for name in REGISTRY if name not in OWN_FLAGS for rule in ("greedy", "sample", "typical")
}
ALL_METHODS += tuple(DRAFTER_METHODS)
DEFAULT_METHODS = "hf-generate,baseline,hf-prompt-lookup,medusa-greedy,medusa-typical"
# With the compiled static generate and the compile anchor: what a GPU user would race.
CUDA_DEFAULT_METHODS = (
    "hf-generate,hf-generate-static,hf-compiled,baseline,hf-prompt-lookup,medusa-greedy,medusa-typical"
)
# A second prompt length: any recompile a new length causes happens here, not in the table.
WARMUP_PROMPT_LENGTHS = {"hf-generate-static": (32, 16), "hf-compiled": (32, 16)}
# Draw from the seed when --temperature > 0 (--sampled: the first three).
SAMPLED_METHODS = (
    "plain-sample",
    "medusa-sample",
    "medusa-typical",
    "eagle-sample",
    "eagle-typical",
    *(m for m in DRAFTER_METHODS if not m.endswith("-greedy")),
)
DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "data" / "bench_prompts.jsonl"
DEFAULT_HEADS = Path(__file__).resolve().parents[2] / "assets" / "heads" / "smollm2-135m-instruct"
DEFAULT_EAGLE = Path(__file__).resolve().parents[2] / "assets" / "heads" / "smollm2-135m-instruct-eagle"


def parser(description: str) -> argparse.ArgumentParser:
    """The bench's options (``python -m medusa_lib.pipeline.bench --help``)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--max-new-tokens", type=whole_number(1), default=128)
    ap.add_argument("--tree", default=None, help="tree preset (default: the heads' calibrated default)")
    ap.add_argument(
        "--lookup",
        type=whole_number(0, MAX_LOOKUP),
        default=None,
        help="lookup-branch length of the medusa methods and eagle-lookup (default: the heads' calibrated one, "
        "0 if calibrated without it, else 4; 0 = heads only; eagle-lookup takes 4 for 0)",
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
    ap.add_argument("--repeats", type=whole_number(1), default=3)
    ap.add_argument("--limit", type=whole_number(0), default=0, help="only the first N prompts (0: all)")
    ap.add_argument(
        "--per-category", type=whole_number(0), default=0, help="only the first N prompts of each category (0: all)"
    )
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
    add_float_draft(ap, "both drafters'")
    ap.add_argument(
        "--stock-attention",
        action="store_true",
        help="keep transformers' sdpa attention on CPU instead of the packed-GQA one (every method)",
    )
    ap.add_argument(
        "--fold-gqa",
        action="store_true",
        help="fold grouped-query heads onto the KV heads (no KV-head copies) on any device, a GPU too (a CPU "
        "does by default); every method, hf-compiled's too (one model)",
    )
    add_engine_arguments(
        ap,
        cache_help="KV cache of our methods (auto: static on CUDA, dynamic on a CPU; core/kv.py)",
        capture_help="with --cache static, compile or record the fixed-shape steps before timing "
        "(auto: cuda-graph on CUDA, none on a CPU); reported as 'capture s'",
    )
    ap.add_argument("--json", default=None, help="write all records to this JSON file")
    ap.add_argument(
        "--forward-costs",
        action="store_true",
        help="only time one forward of 1..33 tokens after a 256-token prefix (what a tree step costs), then stop",
    )
    return ap
