"""The bench's report: its tables, output equality, and the EAGLE head's recorded speed-up (``bench.py``)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from ..core.eagle_io import update_eagle_config
from ..core.spec_metrics import Acceptance, acceptance
from ..core.steps import first_difference
from .bench_args import DRAFTER_METHODS

# Lossless: same seed, same output as its reference.
# lossless sampling: every drafter's exact sampler gives plain sampling's tokens from the same seed
EXACT_SAMPLERS = {
    m: "plain-sample" for m in ("medusa-sample", "eagle-sample", *DRAFTER_METHODS) if m.endswith("-sample")
}


def record_eagle(
    folder: Path,
    records: list[dict],
    *,
    device,
    dtype: str,
    argv,
    tree,
    args,
    medusa_tree: str | None = None,
    draft: str = "float",
) -> None:
    """eagle-greedy's e2e speed-up over baseline on this run's prompts, into the head's config.json
    ``calibration``, with the other drafter's from the same run where it ran: medusa-greedy (the heads
    + their lookup branch) and medusa-heads-only; and eagle-lookup's (the EAGLE head + the same lookup
    branch). present/drafter.py compares the two drafters as the page runs them: each with the lookup
    branch. ``draft``: the drafters' matrices, int8 or float (core/packing.py)."""
    import datetime
    import sys

    from ..core.defaults import device_kind

    by = defaultdict(list)
    for r in records:
        by[r["method"]].append(r)
    if not by.get("eagle-greedy") or not by.get("baseline"):
        raise SystemExit("--record-eagle needs eagle-greedy and baseline in --methods.")

    # e2e tok/s over the runs = total new tokens / total time (prefill + decode)
    def rate(rs):
        return sum(r["new_tokens"] for r in rs) / sum(r["prefill_seconds"] + r["decode_seconds"] for r in rs)

    def speedup(method):
        return round(rate(by[method]) / rate(by["baseline"]), 3)

    eg = by["eagle-greedy"]
    record = {
        "device_kind": device_kind(device),
        "speedup": speedup("eagle-greedy"),
        "tokens_per_step": round(sum(r["new_tokens"] for r in eg) / sum(r["steps"] for r in eg), 3),
        "dtype": dtype,
        "draft": draft,
        "tree": [tree.top_k, tree.depth, tree.num_nodes],
        "prompts": len(eg),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "date": datetime.date.today().isoformat(),
        "command": "python -m medusa_lib.pipeline.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    # the EAGLE head as the page runs it: its tree + the lookup branch
    if by.get("eagle-lookup"):
        record["lookup_speedup"] = speedup("eagle-lookup")
    # the other drafter, in the same run: the page compares these two (ratios of one run)
    if by.get("medusa-greedy"):
        record["medusa_speedup"] = speedup("medusa-greedy")
        record["medusa_tree"] = medusa_tree
    # both drafters without the lookup branch
    if by.get("medusa-heads-only"):
        record["medusa_heads_speedup"] = speedup("medusa-heads-only")
    cfg_path = update_eagle_config(folder, calibration=record)
    names = {
        "lookup_speedup": "eagle-lookup",
        "medusa_speedup": "medusa-greedy",
        "medusa_heads_speedup": "medusa-heads-only",
    }
    others = "".join(f", {name} {record[k]:.2f}x" for k, name in names.items() if k in record)
    print(f"recorded in {cfg_path}: eagle-greedy {record['speedup']:.2f}x{others} baseline on {device_kind(device)}")


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


def exact_sampling(records: list[dict], methods: list[str]) -> dict:
    """Per exact sampler that ran beside its reference: its identical outputs (``identical_outputs``)."""
    return {
        m: identical_outputs(records, m, ref) for m, ref in EXACT_SAMPLERS.items() if m in methods and ref in methods
    }


def method_acceptance(records: list[dict], method: str) -> Acceptance | None:
    """A drafter method's acceptance over its records' full decode steps (``core/spec_metrics.py``);
    None for methods that record none (plain decoding, ``model.generate``). Records written before
    the draft depths were recorded count every step as a draft."""
    rs = [r for r in records if r["method"] == method and "accept_lengths" in r]
    if not rs or method.startswith(("baseline", "plain")):
        return None
    lists = {k: [x for r in rs for x in r.get(k, [])] for k in ("accept_lengths", "draft_depths", "draft_tokens")}
    # every position the drafter can reach gets a column
    depth = max(r.get("draft_positions", 0) for r in rs)
    if not all("draft_depths" in r and "draft_tokens" in r for r in rs):
        return acceptance(lists["accept_lengths"], depth=depth)
    return acceptance(**lists, depth=depth)


def acceptance_by_method(records: list[dict], methods: list[str]) -> dict:
    """The JSON's "acceptance": per drafter method, ``Acceptance.as_dict`` (vLLM's metrics and their counts)."""
    return {m: a.as_dict() for m in methods if (a := method_acceptance(records, m)) is not None}


def acceptance_table(records: list[dict], methods: list[str]) -> list[str]:
    """Per drafter method: tokens/step, the share of full steps that drafted, the mean acceptance length
    and draft acceptance rate, the acceptance rate at each draft position, and below it the rate given
    the position before (docs/engine.md, "How acceptance is reported")."""
    rows = [(m, a) for m in methods if (a := method_acceptance(records, m)) is not None and a.steps]
    if not rows:
        return []
    depth = max(a.depth for _, a in rows)

    # "-" past this method's deepest position, or where undefined
    def cells(rates, n):
        return "".join(f"{x:>7.2f}" if x is not None else f"{'-':>7}" for x in [*rates, *[None] * (depth - n)])

    lines = [
        "",
        "acceptance as vLLM reports it, over the full decode steps that drafted (mean acc len = 1 + the row's sum)",
        f"{'method':<24}{'tok/step':>9}{'drafted':>9}{'mean acc len':>14}{'acc/drafted':>13}"
        + "".join(f"{'@' + str(i):>7}" for i in range(1, depth + 1)),
    ]
    for m, a in rows:
        rs = [r for r in records if r["method"] == m]
        tps = sum(r["new_tokens"] for r in rs) / max(sum(r["steps"] for r in rs), 1)
        mal, dar, share = a.mean_acceptance_length, a.draft_acceptance_rate, a.drafted_share

        def num(x, width):
            return f"{x:>{width}.2f}" if x is not None else f"{'-':>{width}}"

        lines.append(f"{m:<24}{tps:>9.2f}{num(share, 9)}{num(mal, 14)}{num(dar, 13)}" + cells(a.rates, a.depth))
        lines.append(f"{'  given the one before':<69}" + cells(a.given_previous, a.depth))
    return lines


def report(records: list[dict], methods: list[str], *, sampled: list[str] = ()) -> str:
    """The tables: per method, per category, per phase, output equality of the greedy methods against
    hf-generate and of the exact sampler against plain-sample (``sampled``: the methods that sampled)."""
    by = defaultdict(list)
    for r in records:
        by[r["method"]].append(r)

    # e2e tok/s over the whole set = total new tokens / total time (prefill + decode)
    def rate(rs):
        return sum(r["new_tokens"] for r in rs) / max(sum(r["prefill_seconds"] + r["decode_seconds"] for r in rs), 1e-9)

    def step_ms(rs):
        steps = sum(r["steps"] for r in rs)
        return 1000 * sum(r["decode_seconds"] for r in rs) / max(steps, 1)

    # "-" where the reference did not run
    def ratio(x: float | None, width: int) -> str:
        return f"{x:>{width}.2f}x" if x is not None else f"{'-':>{width + 1}}"

    hf_rate = rate(by["hf-generate"]) if by.get("hf-generate") else None
    lines = [
        f"{'method':<24}{'e2e tok/s':>10}{'tok/step':>10}{'ms/step':>9}{'step vs plain':>15}{'vs hf-generate':>16}"
        f"{'vs plain':>10}{'prefill ms':>12}  plain ref"
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
            '(step vs plain, vs plain: against the plain loop named in "plain ref": '
            "plain-sample for the sampled methods, baseline for greedy ones)"
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

    lines += acceptance_table(records, methods)

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
            # a sample is not meant to match greedy decoding
            if m == "hf-generate" or m in sampled:
                continue
            diffs = [(r["id"], first_difference(r["output_token_ids"], ref[r["id"]])) for r in by[m]]
            bad = [(i, d) for i, d in diffs if d is not None]
            where = ", ".join(f"{i}@{d}" for i, d in bad[:6]) + (" ..." if len(bad) > 6 else "")
            lines.append(f"  {m:<24}{len(diffs) - len(bad)}/{len(diffs)}" + (f"   differ: {where}" if bad else ""))

    # lossless sampling: same seed, same tokens (float32)
    for m, ref in EXACT_SAMPLERS.items():
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
