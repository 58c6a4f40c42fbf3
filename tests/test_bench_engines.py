"""The benchmark's engines on a tiny saved model: hf-generate with a static cache, the compiled anchor, our
methods on the static engine with and without a capture, and a capture refused without the static cache."""

import json
import re

import pytest
from bench_helpers import PROMPTS, run_bench, saved_args
from conftest import tiny_tokenizer

from medusa_lib.pipeline import bench


def test_hf_generate_static_gives_hf_generates_tokens_with_its_warm_up_apart(saved, capsys):
    out = saved / "static.json"
    run_bench(saved, out, "--methods", "hf-generate,hf-generate-static", heads=None, new=12, repeats=1)
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    by = {(r["method"], r["id"]): r for r in data["records"]}
    longest = max(len(bench.chat_prompt_ids(tiny_tokenizer(), p["prompt"])) for p in PROMPTS)
    # one cache length for every prompt (so none recompiles the decode step)
    assert data["static_cache_len"] == longest + 12
    # float32 greedy: the static cache changes where the keys live, not the tokens
    for p in PROMPTS:
        ref, static = by[("hf-generate", p["id"])], by[("hf-generate-static", p["id"])]
        assert static["output_token_ids"] == ref["output_token_ids"] and len(ref["output_token_ids"]) == 12
        assert static["steps"] == ref["steps"] == 11 and static["prefill_seconds"] > 0 and static["decode_seconds"] > 0
    assert set(data["warmup_seconds"]) == {"hf-generate", "hf-generate-static"} and all(
        w > 0 for w in data["warmup_seconds"].values()
    )
    assert re.search(r"^hf-generate-static\s+\d+\.\d\s+1\.\d\d\s", printed, re.MULTILINE)
    # compared with hf-generate's output
    assert re.search(r"^\s+hf-generate-static\s+3/3$", printed, re.MULTILINE)
    assert re.search(
        r"^warm-up s \(before the timed runs, not in the tables\): hf-generate \d+\.\d\d, "
        r"hf-generate-static \d+\.\d\d$",
        printed,
        re.MULTILINE,
    )
    assert (
        "| static cache " in printed
        and bench.DEFAULT_METHODS.split(",")[0] == "hf-generate"
        and "hf-generate-static" not in bench.DEFAULT_METHODS.split(",")
    )
    assert "hf-generate-static" in bench.CUDA_DEFAULT_METHODS.split(",")


@pytest.mark.slow
def test_the_compile_anchor_gives_hf_generates_tokens_and_compiles_once_in_its_warm_up(saved, capsys):
    """hf-compiled: transformers' StaticCache + a one-token step under torch.compile (Inductor on this
    CPU), stopping as the others do; pre-packed weights (which Inductor cannot lower) are refused."""
    with pytest.raises(SystemExit, match=r"^error: hf-compiled compiles the stock model, .* add --no-prepack\.$"):
        bench.main([*saved_args(saved, heads=None), "--methods", "hf-compiled", "--dtype", "float32"])
    out = saved / "compiled.json"
    run_bench(
        saved, out, "--methods", "hf-generate,hf-compiled,baseline", "--no-prepack", heads=None, new=12, repeats=1
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    by = {(r["method"], r["id"]): r for r in data["records"]}
    for p in PROMPTS:
        ref, compiled = by[("hf-generate", p["id"])], by[("hf-compiled", p["id"])]
        assert compiled["output_token_ids"] == ref["output_token_ids"] == by[("baseline", p["id"])]["output_token_ids"]
        assert compiled["steps"] == len(ref["output_token_ids"]) - 1 and compiled["decode_seconds"] > 0
    assert data["warmup_seconds"]["hf-compiled"] > 0 and data["static_cache_len"] is not None
    assert re.search(r"^\s+hf-compiled\s+3/3$", printed, re.MULTILINE)
    assert "hf-compiled" in bench.CUDA_DEFAULT_METHODS.split(",") and "hf-compiled" not in bench.DEFAULT_METHODS


@pytest.mark.parametrize("capture", ["none", pytest.param("compile", marks=pytest.mark.slow)])
def test_our_methods_on_the_static_engine_give_generates_tokens_and_report_the_capture_apart(saved, capsys, capture):
    out = saved / f"engine-{capture}.json"
    bench.main(
        [
            *saved_args(saved),
            "--methods",
            "hf-generate,baseline,medusa-greedy,medusa-heads-only",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-new-tokens",
            "16",
            "--repeats",
            "1",
            "--cache",
            "static",
            "--capture",
            capture,
            "--json",
            str(out),
        ]
        + (["--no-prepack"] if capture == "compile" else [])
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    by = {(r["method"], r["id"]): r["output_token_ids"] for r in data["records"]}
    for p in PROMPTS:
        assert (
            by[("baseline", p["id"])]
            == by[("medusa-greedy", p["id"])]
            == by[("medusa-heads-only", p["id"])]
            == by[("hf-generate", p["id"])]
        )
    assert data["engine"]["cache"] == "static" and data["engine"]["capture"] == capture
    assert "mean ms per decode step, by phase" in printed  # the static path's phases
    if capture == "none":
        assert (
            "| static KV cache (eager) |" in printed
            and "capture s" not in printed
            and data["engine"]["capture_seconds"] == 0
        )
    else:
        # three step shapes (1 token, chain-3, chain-3 + lookup-4) compiled before the warm-up
        assert re.search(
            r"^Engine: static KV cache, each whole decode step compiled by Inductor; 3 captured in \d+\.\d s\.$",
            printed,
            re.M,
        )
        assert data["engine"]["capture_seconds"] > 0 and re.search(
            r"^capture s \(before the warm-up; not in the tables\): \d+\.\d\d$", printed, re.M
        )


def test_bench_refuses_a_capture_without_the_static_cache(saved):
    with pytest.raises(SystemExit, match="only the static cache has; use --cache static or --capture none."):
        bench.main(
            [
                *saved_args(saved, heads=None),
                "--methods",
                "baseline",
                "--device",
                "cpu",
                "--cache",
                "dynamic",
                "--capture",
                "compile",
            ]
        )
