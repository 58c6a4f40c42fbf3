"""The figures of the GPU check's parts, read from their logs and JSON files, and said in one table cell.

One ``*_read(ctx, jobs)`` per part (``ctx``: gpu_parts.Context; ``jobs``: what the part ran) and one
``*_words(figures)``. A figure a part did not produce is "not measured", never estimated.
Standard library only, like the check that imports it.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

# a probe's figures: one line of JSON after this mark
MARK = "GPU_CHECK_JSON "
HEADS = "assets/heads/smollm2-135m-instruct"
PROFILE_KEYS = {
    "graph launches per step": "graph launches",
    "D2H copies per step": "D2H copies",
    "syncs per step": "syncs",
    "eager kernels per step": "eager kernels",
    "aten ops outside the step, per step": "aten ops outside",
    "host reads inside the step": "host reads inside",
}
PROMPT_LINE = re.compile(r"^  (\S+): (.*e2e tok/s.*)$")
COST_ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s*$")


def other_drafters(methods: list[str]) -> list[str]:
    """One method (the greedy one) per drafter other than Medusa, from the bench's own method list."""
    groups: dict[str, list[str]] = defaultdict(list)
    for m in methods:
        prefix = m.split("-")[0]
        if "-" in m and prefix not in ("hf", "medusa", "plain"):
            groups[prefix].append(m)
    return [next((m for m in ms if m.endswith("-greedy")), ms[0]) for ms in groups.values()]


def probe_figures_text(text: str) -> dict:
    lines = [ln for ln in text.splitlines() if ln.startswith(MARK)]
    return json.loads(lines[-1][len(MARK) :]) if lines else {}


def log_text(job) -> str:
    return job.log.read_text(errors="replace") if job.log.exists() else ""


def last_line(text: str) -> str:
    """The last non-empty line of a log (where a CLI says its one sentence, or a traceback ends)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def fmt(x, spec: str = ".1f", unit: str = "") -> str:
    return "not measured" if x is None else format(x, spec) + unit


def load(path: Path | None) -> dict:
    return json.loads(path.read_text()) if path and path.exists() else {}


# ------------------------------------------------------------------------- env, model, profile_step
def env_read(ctx, jobs) -> dict:
    fig = probe_figures_text(log_text(jobs[0]))
    ctx.methods = fig.get("methods") or []
    return fig


def env_words(f: dict) -> str:
    if not f:
        return "not measured"
    drafters = ", ".join(other_drafters(f.get("methods") or [])) or "none"
    return (
        f"{f.get('gpu') or 'no GPU'}, torch {f.get('torch')}, CUDA {f.get('cuda')}, "
        f"transformers {f.get('transformers')}, gguf {f.get('gguf')}, Python {f.get('python')}; "
        f"gradio imported: {f.get('gradio_imported')}; other drafters: {drafters}"
    )


def model_read(ctx, jobs) -> dict:
    return probe_figures_text(log_text(jobs[0]))


def model_words(f: dict) -> str:
    if not f:
        return "not measured"
    return f"{f.get('source')} in {fmt(f.get('seconds'))} s, cache {fmt((f.get('cache_bytes') or 0) / 1e6)} MB"


def profile_read(ctx, jobs) -> dict:
    """profile_step's rows: a decoder's name, then ``  key<42 wide> value`` lines."""
    out, current = {}, None
    for line in log_text(jobs[0]).splitlines():
        if line in ("plain", "medusa-greedy"):
            current = out.setdefault(line, {})
        elif current is not None and line.startswith("  ") and len(line) > 45:
            key, value = line[2:44].rstrip(), line[45:].strip()
            try:
                current[key] = float(value)
            except ValueError:
                current[key] = value
    return out


def profile_words(f: dict) -> str:
    said = []
    for name, row in f.items():
        counts = ", ".join(f"{row[k]} {label}" for k, label in PROFILE_KEYS.items() if k in row) or "no counts"
        said.append(f"{name}: {counts} per step ({row.get('engine', '?')})")
    return "; ".join(said) or "not measured"


# ------------------------------------------------------------------------- the bench
def rate(rs: list[dict]) -> float:
    """e2e tok/s over a set of records: all new tokens over all time (prefill + decode), as the bench's report."""
    return sum(r["new_tokens"] for r in rs) / max(sum(r["prefill_seconds"] + r["decode_seconds"] for r in rs), 1e-9)


def bench_summary(data: dict) -> dict:
    """Per method: e2e tok/s, tokens/step, ms/step, the speed-up over its plain reference and over
    hf-generate, and (greedy methods) how many outputs equal hf-generate's."""
    by: dict[str, list[dict]] = defaultdict(list)
    for r in data.get("records", []):
        by[r["method"]].append(r)
    hf = {r["id"]: r["output_token_ids"] for r in by.get("hf-generate", [])}
    sampled = set(data.get("sampled_methods") or [])
    refs = data.get("speedup_reference") or {}
    out = {}
    for m, rs in by.items():
        ref, steps = refs.get(m), max(sum(r["steps"] for r in rs), 1)
        row = {"tok_s": rate(rs), "tokens_per_step": sum(r["new_tokens"] for r in rs) / steps}
        row["ms_per_step"] = 1000 * sum(r["decode_seconds"] for r in rs) / steps
        row["prefill_ms"] = 1000 * statistics.median(r["prefill_seconds"] for r in rs)
        # decode only: the tokens after the prefill's first one, over the decode's seconds
        row["decode_tok_s"] = sum(r["new_tokens"] - 1 for r in rs) / max(sum(r["decode_seconds"] for r in rs), 1e-9)
        row |= {"prompts": len(rs), "ref": ref}
        row["vs_ref"] = rate(rs) / rate(by[ref]) if ref and by.get(ref) and m != ref else None
        row["vs_hf_generate"] = rate(rs) / rate(by["hf-generate"]) if hf and m != "hf-generate" else None
        if hf and m != "hf-generate" and m not in sampled:
            row["same_as_hf_generate"] = sum(r["output_token_ids"] == hf.get(r["id"]) for r in rs)
        out[m] = row
    # the compile anchor: what a transformers user runs with one compile line
    anchor = out.get("hf-compiled")
    for m, row in out.items():
        if anchor and m != "hf-compiled":
            row["vs_hf_compiled"] = row["tok_s"] / anchor["tok_s"]
            row["decode_vs_hf_compiled"] = row["decode_tok_s"] / max(anchor["decode_tok_s"], 1e-9)
    keep = ("exact_sampling", "warmup_seconds", "dtype", "tree", "max_new_tokens", "repeats")
    return {"methods": out, "engine": (data.get("engine") or {}).get("description")} | {k: data.get(k) for k in keep}


def bench_salvage(text: str) -> dict:
    """What a bench stopped at its limit printed: each method's e2e tok/s per prompt (median over prompts)."""
    rates: dict[str, list[float]] = defaultdict(list)
    prompts = 0
    for line in text.splitlines():
        if m := PROMPT_LINE.match(line):
            prompts += 1
            for method, value in re.findall(r"(\S+) ([\d.]+) e2e tok/s", m.group(2)):
                rates[method].append(float(value))
    medians = {m: statistics.median(v) for m, v in rates.items()}
    return {"partial": True, "prompts_done": prompts, "median_prompt_tok_s": medians}


def bench_read(ctx, jobs) -> dict:
    data = load(jobs[0].json)
    return bench_summary(data) if data else bench_salvage(log_text(jobs[0]))


def bench_words(f: dict) -> str:
    if f.get("partial"):
        rates = ", ".join(f"{m} {v:.1f}" for m, v in f["median_prompt_tok_s"].items())
        return f"stopped after {f['prompts_done']} prompts; median e2e tok/s per prompt: {rates}"
    said = []
    for m, r in f.get("methods", {}).items():
        s = f"{m} {r['tok_s']:.1f} tok/s"
        if r.get("vs_ref"):
            s += f" ({r['vs_ref']:.2f}x {r['ref']})"
        if r.get("vs_hf_generate") and m in ("baseline", "medusa-greedy", "hf-generate-static"):
            s += f" ({r['vs_hf_generate']:.2f}x hf-generate)"
        if r.get("vs_hf_compiled") and m in ("baseline", "medusa-greedy"):
            s += f" ({r['vs_hf_compiled']:.2f}x hf-compiled e2e, {r['decode_vs_hf_compiled']:.2f}x decode only)"
        if m in ("hf-compiled", "baseline"):
            s += f" [{r['ms_per_step']:.2f} ms/step]"
        if "same_as_hf_generate" in r:
            s += f" [{r['same_as_hf_generate']}/{r['prompts']} = hf-generate]"
        said.append(s)
    for m, same in (f.get("exact_sampling") or {}).items():
        said.append(f"{m} == {same['reference']}: {same['identical']}/{same['prompts']}")
    return "; ".join(said) or "not measured"


def float32_read(ctx, jobs) -> dict:
    """Every shard's outputs against model.generate's (hf-generate) on the same prompt."""
    records = [r for j in jobs for r in load(j.json).get("records", [])]
    hf = {r["id"]: r["output_token_ids"] for r in records if r["method"] == "hf-generate"}
    out = {"shards_done": sum(bool(load(j.json)) for j in jobs), "shards": len(jobs), "methods": {}}
    for r in records:
        if r["method"] == "hf-generate" or r["id"] not in hf:
            continue
        row = out["methods"].setdefault(r["method"], {"same": 0, "prompts": 0, "differ": {}})
        a, b = r["output_token_ids"], hf[r["id"]]
        row["prompts"] += 1
        row["same"] += a == b
        if a != b:
            row["differ"][r["id"]] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return out


def float32_words(f: dict) -> str:
    said = []
    for m, r in f.get("methods", {}).items():
        where = ", ".join(f"{i}@{d}" for i, d in list(r["differ"].items())[:4])
        said.append(f"{m} {r['same']}/{r['prompts']} = model.generate" + (f" (differ: {where})" if where else ""))
    return f"{f.get('shards_done')}/{f.get('shards')} shards: " + "; ".join(said) if said else "not measured"


# ------------------------------------------------------------------------- the page, the calibration, costs, graph
def page_read(ctx, jobs) -> dict:
    """page_check's rows, and its Medusa/plain in the bench's dtype against the bench's own ratio."""
    summary = load(jobs[0].json).get("summary") or []
    bench = ctx.results.get("bench") or {}
    dtype = str(bench.get("dtype") or "").removeprefix("torch.")
    row = next((s for s in summary if s.get("numerics") == dtype), summary[0] if summary else {})
    page, ref = row.get("medusa_speedup"), bench.get("methods", {}).get("medusa-greedy", {}).get("vs_ref")
    ratio = page / ref if page and ref else None
    return {"summary": summary, "page_medusa_speedup": page, "bench_medusa_speedup": ref, "page_over_bench": ratio}


def page_words(f: dict) -> str:
    rows = [
        f"{s.get('numerics')} greedy: {s.get('green')}/{s.get('prompts')} green badges, "
        f"plain {fmt(s.get('plain_tps'))} tok/s, Medusa {fmt(s.get('medusa_speedup'), '.2f', 'x')} plain"
        for s in f.get("summary") or []
    ]
    bench = fmt(f.get("bench_medusa_speedup"), ".2f", "x")
    return (
        "; ".join(rows) + f"; against {bench} in the bench (page/bench {fmt(f.get('page_over_bench'), '.2f')})"
        if rows
        else "not measured"
    )


def calibrations(cfg: dict) -> list[dict]:
    return [c for c in [cfg.get("calibration"), *(cfg.get("calibrations") or {}).values()] if isinstance(c, dict)]


def calibrate_read(ctx, jobs) -> dict:
    """The record calibrate wrote for this kind of device into the heads' copy, and from it the decode
    ms of one step of each tree size on the device's own engine (tokens/step over decode tok/s)."""
    before = calibrations(json.loads((ctx.root / HEADS / "config.json").read_text()))
    kind = "cpu" if ctx.device == "cpu" else "cuda"
    mine = [c for c in calibrations(load(jobs[0].json)) if c.get("device_kind") == kind and c not in before]
    if not mine:
        return {"error": "calibrate wrote no new calibration for this device"}
    rec = mine[0]
    plain = rec.get("plain_tok_s")
    steps = {"plain": {"nodes": 1, "tokens_per_step": 1.0, "ms_per_step": 1000 / plain if plain else None}}
    for name, t in rec.get("trees", {}).items():
        ms = 1000 * t["measured_tokens_per_step"] / t["tok_s"] if t.get("tok_s") else None
        steps[name] = {"nodes": t["nodes"], "tokens_per_step": t["measured_tokens_per_step"], "ms_per_step": ms}
        steps[name]["speedup"] = t["speedup"]
    keep = ("default_tree", "lookup", "engine", "dtype")
    return {k: rec.get(k) for k in keep} | {"step_cost": steps, "record": rec}


def calibrate_words(f: dict) -> str:
    if "step_cost" not in f:
        return f.get("error", "not measured")
    cost = ", ".join(f"{n} ({s['nodes']} nodes) {fmt(s['ms_per_step'], '.2f')} ms" for n, s in f["step_cost"].items())
    return f"default {f['default_tree']} + lookup {f['lookup']}; decode ms per step by tree: {cost}"


def costs_read(ctx, jobs) -> dict:
    rows = [COST_ROW.match(ln) for ln in log_text(jobs[0]).splitlines()]
    keys = ("body_ms", "lm_head_ms", "vs_one_token")
    return {"rows": [{"tokens": int(m[1])} | {k: float(v) for k, v in zip(keys, m.groups()[1:])} for m in rows if m]}


def costs_words(f: dict) -> str:
    return (
        ", ".join(f"{r['tokens']} tokens {r['body_ms'] + r['lm_head_ms']:.1f} ms" for r in f.get("rows", []))
        or "not measured"
    )


def graph_read(ctx, jobs) -> dict:
    """The fallback engine's bench (eager kernels in one graph a step) and its description."""
    data = load(jobs[0].json)
    return bench_summary(data) | {
        "failed": [ln for ln in log_text(jobs[0]).splitlines() if ln.startswith("Capturing ")]
    }


def graph_words(f: dict) -> str:
    """A bench of a few methods on one engine (the graph and fold parts), with the fold's ratio to the bench
    part where it has one, and the first program that fell back."""
    rows = f.get("methods") or {}
    said = [
        f"{m} {r['tok_s']:.1f} tok/s, {r['ms_per_step']:.2f} ms/step"
        + (f", {r['vs_bench']:.2f}x the bench part's" if r.get("vs_bench") else "")
        for m, r in rows.items()
    ]
    return "; ".join([*said, f"engine: {f.get('engine')}", *f.get("failed", [])[:1]]) if said else "not measured"


def fold_read(ctx, jobs) -> dict:
    """The bench with GQA folded onto the KV heads, beside the bench part's figures of the same methods
    (``vs_bench``: this part's tok/s over the bench part's, per method; other processes, so a first read)."""
    data = load(jobs[0].json)
    out = bench_summary(data)
    bench = (ctx.results.get("bench") or {}).get("methods") or {}
    for method, row in (out.get("methods") or {}).items():
        base = (bench.get(method) or {}).get("tok_s")
        if base:
            row["vs_bench"] = round(row["tok_s"] / base, 3)
    return out


def eagle_read(ctx, jobs) -> dict:
    """Each recipe's kept head: its simulated held-out tokens/step from training.json, or, for a run cut by
    the part's limit, from the history its last kept checkpoint wrote into config.json; the feature cache's
    speed; and the kept head copied to --out/<name>.safetensors and <name>.config.json to come back whole
    (``load_eagle`` reads the two back as a folder's eagle.safetensors and config.json)."""
    import shutil

    heads, out = ctx.work / "eagle", {}
    for folder in sorted(p for p in heads.glob("*") if p.is_dir()):
        weights, t = folder / "eagle.safetensors", load(folder / "training.json")
        # the best head so far, even if the run was cut
        if ctx.out is not None and weights.exists():
            shutil.copy(weights, Path(ctx.out) / f"{folder.name}.safetensors")
            if (folder / "config.json").exists():
                shutil.copy(folder / "config.json", Path(ctx.out) / f"{folder.name}.config.json")
        cfg = load(folder / "config.json")
        history = t.get("history") or (cfg.get("training") or {}).get("history") or []
        if not history:
            out[folder.name] = {"trained": False}
            continue
        kept = max(history, key=lambda h: h.get("tokens_per_step", 0))
        out[folder.name] = {
            "recipe": t.get("recipe")
            or ("EAGLE-3 (fused features)" if cfg.get("fuse_layers") else "EAGLE-1 (top feature)"),
            "tokens_per_step": kept.get("tokens_per_step"),
            "accept_rate_per_depth": kept.get("accept_rate_per_depth"),
            "kept_at": kept.get("step"),
            "batches": t.get("steps", history[-1].get("step")),
            "planned": t.get("planned_steps"),
            "minutes": t.get("minutes", history[-1].get("minutes")),
            "finished": bool(t),
        }
    speeds = [load(p) for p in sorted(ctx.eagle_cache.glob("*/speed.json"))]
    tokens, seconds = sum(s.get("tokens", 0) for s in speeds), sum(s.get("seconds", 0) for s in speeds)
    return {
        "recipes": out,
        "feature_tokens": tokens,
        "feature_tokens_per_s": round(tokens / seconds) if seconds else None,
    }


def eagle_words(f: dict) -> str:
    def one(name: str, r: dict) -> str:
        if r.get("tokens_per_step") is None:
            return f"{name}: not trained"
        said = (
            f"{name} ({r.get('recipe')}): {r['tokens_per_step']:.3f} tokens/step held-out (simulated), kept at batch "
        )
        if r.get("finished"):
            return (
                said
                + f"{r.get('kept_at')} of {r.get('batches')} run ({r.get('planned')} planned), {r.get('minutes')} min"
            )
        return said + f"{r.get('kept_at')} ({r.get('minutes')} min; the run was cut by the part's limit after it)"

    said = [one(name, r) for name, r in f.get("recipes", {}).items()]
    speed = f.get("feature_tokens_per_s")
    said.append(
        f"features: {f.get('feature_tokens', 0)} tokens at {speed} tokens/s" if speed else "features: not measured"
    )
    return "; ".join(said)
