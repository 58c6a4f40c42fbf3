"""The page's own path at its starting values, over many prompts: what a user who changes nothing sees.

Runs ``Playground.compare`` (the code behind the page's Run and ``/compare``) with the page's
starting values (``Playground.starting_request``: 96 new tokens, the heads' calibrated tree and lookup
branch, T = 0.7 for typical acceptance, seed 0), in each mode and numerics asked for, on the bench prompts and the
page's examples, and prints per (mode, numerics): how many exactness badges are green (Medusa greedy
== plain greedy in the greedy mode; Medusa exact sampling == plain sampling in the sampling mode),
and the median per-prompt speed-ups of the Medusa columns over the plain column (decode tokens/s,
as the page shows them).

    python -m medusa_lib.pipeline.page_check                                  # both modes, float32 and bfloat16
    python -m medusa_lib.pipeline.page_check --numerics float32 --per-category 1 --json runs/page.json

The three columns of one prompt run one after another on one device, as on the page; a speed-up
is a ratio within one comparison, so a change of the machine's load between prompts cancels out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from ..core.messages import InputError
from ..present.page import load_examples
from ..present.playground import Playground
from ..present.settings import MODES, Request
from .bench import DEFAULT_HEADS, DEFAULT_PROMPTS
from .cli import (
    add_model_arguments,
    check_heads_path,
    check_model_arguments,
    check_writable,
    fail,
    read_prompts,
    whole_number,
)
from .jsonl import load_jsonl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "assets" / "examples.json"


def page_prompts(
    *, bench: str | Path = DEFAULT_PROMPTS, examples: str | Path | None = EXAMPLES, per_category: int = 0
) -> list[tuple[str, str]]:
    """(id, prompt) of the bench prompts (the first ``per_category`` of each category, 0 = all) and the page's
    examples."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for p in load_jsonl(bench):
        seen[p.get("category", "")] += 1
        if not per_category or seen[p.get("category", "")] <= per_category:
            out.append((p.get("id", f"bench-{len(out)}"), p["prompt"]))
    for i, ex in enumerate(load_examples(examples) if examples else []):
        out.append((f"example-{i + 1}", ex["prompt"]))
    return out


def check(
    pg: Playground,
    prompts,
    *,
    modes=("greedy", "sampling"),
    numerics=("float32", "bfloat16"),
    max_new_tokens: int = Request.max_new_tokens,
    on_row=None,
) -> list[dict]:
    """One ``compare`` per (prompt, mode, numerics) at the page's starting values; a row each, also
    passed to ``on_row`` as it comes (so a long run that is stopped keeps what it measured). The
    modes and numerics of one prompt run together, so a partial run covers all of them."""
    rows, start = [], replace(pg.starting_request(), max_new_tokens=max_new_tokens)
    jobs = [(n, m, pid, text) for pid, text in prompts for n in numerics for m in modes]
    for n, mode, pid, text in tqdm(jobs, desc="page compare", unit="run", file=sys.stderr):
        settings = pg.settings_of(replace(start, sample=MODES[mode], numerics=n))
        out = pg.compare(text, settings)
        match = out["sampling_match" if MODES[mode] else "greedy_match"]
        plain, medusa, typical = (out["methods"][v] for v in settings.views)
        # None when a run made no decode step
        tps = lambda r: r["tokens_per_second"] or 0.0  # noqa: E731
        rows.append(
            {
                "id": pid,
                "mode": mode,
                "numerics": out["numerics"],
                "equal": match["equal"],
                "first_diff": match["first_diff"],
                "tie": match["tie"],
                "plain_tps": tps(plain),
                "medusa_tps": tps(medusa),
                "typical_tps": tps(typical),
                "medusa_tokens_per_step": medusa["tokens_per_step"],
                "typical_tokens_per_step": typical["tokens_per_step"],
            }
        )
        if on_row is not None:
            on_row(rows)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per (mode, numerics): green badges / prompts, median speed-ups of Medusa and typical over plain."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["mode"], r["numerics"])].append(r)
    out = []
    for (mode, numerics), rs in groups.items():
        timed = [r for r in rs if r["plain_tps"] > 0]
        ratio = lambda k: statistics.median(r[k] / r["plain_tps"] for r in timed) if timed else None  # noqa: E731
        out.append(
            {
                "mode": mode,
                "numerics": numerics,
                "green": sum(r["equal"] for r in rs),
                "prompts": len(rs),
                "plain_tps": statistics.median(r["plain_tps"] for r in rs),
                "medusa_speedup": ratio("medusa_tps"),
                "typical_speedup": ratio("typical_tps"),
                "medusa_tokens_per_step": statistics.median(r["medusa_tokens_per_step"] or 0 for r in rs),
                "differs": [r["id"] for r in rs if not r["equal"]],
            }
        )
    return out


def format_summary(summary: list[dict], *, setup: str) -> str:
    lines = [
        setup,
        f"{'mode':9} {'numerics':9} {'green badge':>12} {'plain tok/s':>12} {'Medusa x plain':>15} "
        f"{'typical x plain':>16} {'Medusa tok/step':>16}",
    ]
    for s in summary:
        fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
        lines.append(
            f"{s['mode']:9} {s['numerics']:9} {s['green']:>5} / {s['prompts']:<4} {s['plain_tps']:>12.1f} "
            f"{fmt(s['medusa_speedup']):>15} "
            f"{fmt(s['typical_speedup']):>16} {s['medusa_tokens_per_step']:>16.2f}"
        )
        if s["differs"]:
            lines.append(f"  differs: {', '.join(s['differs'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(ap)
    ap.add_argument("--heads", default=str(DEFAULT_HEADS))
    ap.add_argument(
        "--prompts", default=str(DEFAULT_PROMPTS), help='the bench prompts (JSONL lines {"id", "category", "prompt"})'
    )
    ap.add_argument("--no-examples", action="store_true", help="the bench prompts only, not the page's examples")
    ap.add_argument(
        "--per-category",
        type=whole_number(0),
        default=0,
        help="only the first N bench prompts of each category (0: all)",
    )
    ap.add_argument("--modes", default="greedy,sampling", help="comma list of greedy, sampling")
    ap.add_argument(
        "--numerics",
        default="float32,bfloat16",
        help="comma list of the loaded copies to run (the model loads in --dtype, plus a float32 copy)",
    )
    ap.add_argument("--max-new-tokens", type=whole_number(1), default=Request.max_new_tokens)
    ap.add_argument("--json", default=None, help="write the rows and the summary to this JSON file")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes takes a comma list of {', '.join(MODES)} (got {args.modes!r}).")
    numerics = [n.strip() for n in args.numerics.split(",") if n.strip()]
    check_model_arguments(args)
    # a --heads that names nothing is refused, not replaced by untrained heads
    if args.heads != str(DEFAULT_HEADS):
        check_heads_path(args.heads)
    read_prompts(args.prompts)
    if args.json:
        check_writable(args.json, flag="--json")
    try:
        pg = Playground.load(
            model=args.model,
            heads=args.heads,
            default_heads=DEFAULT_HEADS,
            device=args.device,
            dtype=args.dtype,
            max_prompt_tokens=None,
            progress=lambda m: print(m, file=sys.stderr, flush=True),
        )
    except InputError as e:
        # ModelError, HeadsError, EagleError: one sentence
        fail(e)
    missing = [n for n in numerics if n not in pg.variants]
    if missing:
        raise SystemExit(
            f"--numerics {missing[0]} is not loaded here (loaded: {', '.join(pg.variants)}); "
            "pick from those or load the model in that --dtype."
        )
    prompts = page_prompts(
        bench=args.prompts, examples=None if args.no_examples else EXAMPLES, per_category=args.per_category
    )

    def write(rows, summary=None):
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary or summarize(rows)}, indent=1))

    rows = check(pg, prompts, modes=modes, numerics=numerics, max_new_tokens=args.max_new_tokens, on_row=write)
    summary = summarize(rows)
    print(
        format_summary(
            summary,
            setup=f"the page's path at its defaults | {pg.device} | tree {pg.defaults.tree}, "
            f"lookup {pg.defaults.lookup if pg.defaults.lookup_on else 0} | "
            f"{len(prompts)} prompts | {args.max_new_tokens} new tokens | typical at T = {Request.temperature}, "
            f"seed {Request.seed}",
        )
    )
    write(rows, summary)


if __name__ == "__main__":
    main()
