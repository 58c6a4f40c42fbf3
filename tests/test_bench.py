"""The benchmark CLI end to end on a tiny saved model: records, tables, exactness against generate."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import make_model, random_heads, tiny_tokenizer

from medusa_lib import load_heads
from medusa_lib.pipeline import bench

METHODS = [
    "hf-generate",
    "baseline",
    "hf-prompt-lookup",
    "medusa-greedy",
    "medusa-heads-only",
    "medusa-typical",
    "medusa-greedy-nodetail",
]
PROMPTS = [
    {"id": "a-1", "category": "alpha", "prompt": "w10 w11 w12 w13"},
    {"id": "a-2", "category": "alpha", "prompt": "w20 w21 w22 w20 w21 w22"},
    {"id": "b-1", "category": "beta", "prompt": "w30 w31"},
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    model = make_model("llama")
    model.save_pretrained(folder / "model")
    tiny_tokenizer().save_pretrained(folder / "model")
    heads = random_heads(3, shared=True)
    heads.save(folder / "heads", base_model="tiny-llama", default_tree="chain-3")
    (folder / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return folder


def saved_args(saved: Path, heads: Path | None | str = "saved") -> list[str]:
    """--model, --heads (the saved heads, another folder, or None: none) and --prompts of the ``saved`` setup."""
    heads = saved / "heads" if heads == "saved" else heads
    return [
        "--model",
        str(saved / "model"),
        *(["--heads", str(heads)] if heads is not None else []),
        "--prompts",
        str(saved / "prompts.jsonl"),
    ]


def test_bench_writes_one_record_per_method_and_prompt_and_prints_the_tables(saved, capsys):
    out = saved / "out.json"
    bench.main(
        [
            *saved_args(saved),
            "--methods",
            ",".join(METHODS),
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-new-tokens",
            "16",
            "--repeats",
            "2",
            "--json",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert (
        data["dtype"] == "torch.float32"
        and data["tree"] == "chain-3 + lookup-4"
        and data["lookup"] == 4
        and data["repeats"] == 2
    )
    recs = data["records"]
    assert sorted((r["method"], r["id"]) for r in recs) == sorted((m, p["id"]) for m in METHODS for p in PROMPTS)
    for r in recs:
        assert {
            "method",
            "id",
            "category",
            "output_token_ids",
            "new_tokens",
            "steps",
            "decode_seconds",
            "prefill_seconds",
        } <= set(r)
        assert r["new_tokens"] == len(r["output_token_ids"]) and 1 <= r["new_tokens"] <= 16
        assert r["prefill_seconds"] > 0 and r["decode_seconds"] >= 0 and len(r["total_seconds_runs"]) == 2
        assert r["category"] == {p["id"]: p["category"] for p in PROMPTS}[r["id"]]
    by = {(r["method"], r["id"]): r["output_token_ids"] for r in recs}
    for p in PROMPTS:  # float32: our loops are exact against model.generate
        ref = by[("hf-generate", p["id"])]
        assert (
            by[("baseline", p["id"])]
            == by[("medusa-greedy", p["id"])]
            == by[("medusa-heads-only", p["id"])]
            == by[("medusa-greedy-nodetail", p["id"])]
            == ref
        )
    assert all(r.get("lookup_tokens", 0) == 0 for r in recs if r["method"] == "medusa-heads-only")
    # The printed tables: one row per method, per category, per phase, and the equality count.
    for m in METHODS:
        assert re.search(rf"^{re.escape(m)}\s+\d+\.\d\s+\d+\.\d\d\s", printed, re.M), m
    assert (
        "tok/s per category" in printed
        and re.search(r"^alpha\s", printed, re.M)
        and re.search(r"^beta\s", printed, re.M)
    )
    assert "mean ms per decode step, by phase" in printed
    assert re.search(r"^\s+medusa-greedy\s+3/3$", printed, re.M) and re.search(r"^\s+baseline\s+3/3$", printed, re.M)
    assert "pre-packed linear weights" in printed and data["prepacked"] is True


def test_bench_refuses_an_unknown_method(saved):
    with pytest.raises(SystemExit, match="Unknown method 'fast'"):
        bench.main(
            ["--model", str(saved / "model"), "--prompts", str(saved / "prompts.jsonl"), "--methods", "baseline,fast"]
        )


def test_bench_can_keep_stock_weights(saved, capsys):
    bench.main(
        [
            *saved_args(saved, heads=None),
            "--methods",
            "hf-generate,baseline",
            "--dtype",
            "float32",
            "--max-new-tokens",
            "6",
            "--repeats",
            "1",
            "--no-prepack",
        ]
    )
    printed = capsys.readouterr().out
    assert "stock linear weights" in printed and re.search(r"^\s+baseline\s+3/3$", printed, re.M)


def test_bench_reports_every_drafters_acceptance_as_vllm_does(saved, capsys):
    from medusa_lib.pipeline.bench_report import method_acceptance

    out = saved / "acceptance.json"
    methods = ["baseline", "medusa-greedy", "lookup-greedy"]
    common = saved_args(saved)
    bench.main(
        [*common, "--methods", ",".join(methods), "--dtype", "float32", "--limit", "2", "--max-new-tokens", "12"]
        + ["--repeats", "1", "--json", str(out)]
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert list(data["acceptance"]) == ["medusa-greedy", "lookup-greedy"]  # the drafters; plain decoding has none
    for m in ("medusa-greedy", "lookup-greedy"):
        recs = [r for r in data["records"] if r["method"] == m]
        assert all(len(r["accept_lengths"]) == len(r["draft_depths"]) == len(r["draft_tokens"]) for r in recs)
        acc = data["acceptance"][m]
        assert acc == method_acceptance(data["records"], m).as_dict()
        assert acc["mean_acceptance_length"] == pytest.approx(1 + acc["accepted_tokens"] / acc["drafts"], abs=1e-4)
        # chain-3 + a lookup branch of 4, and a lookup chain of 4: positions 1 .. 4 each
        assert len(acc["acceptance_rate_per_position"]) == 4 and all(r["draft_positions"] == 4 for r in recs)
        assert re.search(rf"^{m}\s+\d+\.\d\d\s+\d\.\d\d\s+{acc['mean_acceptance_length']:.2f}\s", printed, re.M)
    assert "acceptance as vLLM reports it" in printed and printed.count("given the one before") == 2


def test_forward_costs_table(saved, capsys):
    bench.main(["--model", str(saved / "model"), "--dtype", "float32", "--forward-costs", "--repeats", "1"])
    printed = capsys.readouterr().out
    rows = re.findall(r"^\s+(\d+)\s+(\d+\.\d)\s+(\d+\.\d)\s+(\d+\.\d\d)x$", printed, re.M)
    assert [int(r[0]) for r in rows] == [1, 2, 5, 9, 17, 33] and rows[0][3] == "1.00"


@pytest.mark.parametrize("lookup", [None, 0, 2])  # not calibrated; calibrated without the branch; with a 2-token branch
def test_bench_and_the_playground_pick_the_same_tree_and_lookup_length(saved, tmp_path, lookup):
    from medusa_lib.present import Playground

    model = make_model("llama")
    heads = random_heads(3, shared=True)
    heads.save(
        tmp_path / "heads",
        base_model="tiny-llama",
        **({} if lookup is None else {"default_tree": "chain-2", "lookup": lookup}),
    )
    loaded = load_heads(tmp_path / "heads", model=model)
    page = Playground(model, tiny_tokenizer(), loaded).defaults
    out = tmp_path / "out.json"
    bench.main(
        [
            *saved_args(saved, heads=tmp_path / "heads"),
            "--methods",
            "medusa-greedy",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-new-tokens",
            "2",
            "--repeats",
            "1",
            "--json",
            str(out),
        ]
    )
    data = json.loads(out.read_text())
    assert data["lookup"] == page.lookup_length and data["tree"].split(" + ")[0] == page.tree
    assert (page.tree, page.lookup_length) == {None: ("topk-4x3x2-16", 4), 0: ("chain-2", 0), 2: ("chain-2", 2)}[lookup]


SAMPLED = ["plain-sample", "medusa-sample", "medusa-typical"]


def test_bench_sampled_methods_draw_from_one_seed_and_the_exact_sampler_matches_plain_sampling(saved, capsys):
    out = saved / "sampled.json"
    bench.main(
        [
            *saved_args(saved),
            "--methods",
            "hf-generate,baseline,medusa-greedy," + ",".join(SAMPLED),
            "--temperature",
            "0.8",
            "--seed",
            "3",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-new-tokens",
            "16",
            "--repeats",
            "1",
            "--json",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert (data["temperature"], data["top_p"], data["seed"]) == (0.8, 1.0, 3) and data["sampled_methods"] == SAMPLED
    by = {(r["method"], r["id"]): r["output_token_ids"] for r in data["records"]}
    for p in PROMPTS:  # float32: lossless speculative sampling == plain sampling with the same seed
        assert by[("medusa-sample", p["id"])] == by[("plain-sample", p["id"])]
    assert any(by[("plain-sample", p["id"])] != by[("baseline", p["id"])] for p in PROMPTS)  # it did sample
    assert data["exact_sampling"] == {
        "medusa-sample": {"reference": "plain-sample", "identical": 3, "prompts": 3, "first_difference": {}}
    }
    assert re.search(r"^medusa-sample == plain-sample: 3/3 identical$", printed, re.M)
    # Sampled methods' speed-ups are against plain-sample, greedy ones' against baseline.
    assert data["speedup_reference"] == {
        "hf-generate": "baseline",
        "baseline": "baseline",
        "medusa-greedy": "baseline",
        **dict.fromkeys(SAMPLED, "plain-sample"),
    }
    rows = {
        m: (vs, ref)
        for m, vs, ref in re.findall(r"^(\S+)\s.*\s(\S+x)\s+\d+\.\d\s+(baseline|plain-sample)$", printed, re.M)
    }
    assert set(rows) == {
        "hf-generate",
        "baseline",
        "medusa-greedy",
        *SAMPLED,
    }  # "vs plain" and "plain ref" of every row
    assert rows["baseline"] == ("1.00x", "baseline") and rows["plain-sample"] == ("1.00x", "plain-sample")
    assert (
        rows["medusa-greedy"][1] == "baseline"
        and rows["medusa-sample"][1] == rows["medusa-typical"][1] == "plain-sample"
    )
    assert '"plain ref": plain-sample for the sampled methods' in printed
    # The greedy equality table leaves the samples out (they are not meant to match greedy decoding).
    greedy_table = printed.split("outputs identical to hf-generate")[1].split("\n\n")[0]
    assert re.search(r"^\s+medusa-greedy\s+3/3$", greedy_table, re.M) and not any(m in greedy_table for m in SAMPLED)


def test_bench_sampled_preset_and_the_refusals(saved, capsys):
    out = saved / "preset.json"
    bench.main(
        [
            *saved_args(saved),
            "--sampled",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-new-tokens",
            "6",
            "--repeats",
            "1",
            "--limit",
            "1",
            "--top-p",
            "0.9",
            "--json",
            str(out),
        ]
    )
    data = json.loads(out.read_text())
    assert (
        sorted({r["method"] for r in data["records"]}) == sorted(SAMPLED) and data["top_p"] == 0.9 and data["seed"] == 0
    )
    assert data["exact_sampling"]["medusa-sample"]["identical"] == 1
    assert "medusa-sample == plain-sample: 1/1 identical" in capsys.readouterr().out
    common = saved_args(saved, heads=None)
    with pytest.raises(
        SystemExit,
        match=r"^plain-sample and medusa-sample need --temperature > 0 \(at 0 they are baseline and medusa-greedy\)\.$",
    ):
        bench.main([*common, "--sampled", "--temperature", "0"])
    with pytest.raises(SystemExit, match=r"^top_p must be in \(0, 1\]"):
        bench.main([*common, "--methods", "plain-sample", "--top-p", "1.5"])
    with pytest.raises(SystemExit):  # argparse: one or the other
        bench.main([*common, "--sampled", "--methods", "baseline"])


def test_hf_generate_static_gives_hf_generates_tokens_with_its_warm_up_apart(saved, capsys):
    out = saved / "static.json"
    bench.main(
        [
            *saved_args(saved, heads=None),
            "--methods",
            "hf-generate,hf-generate-static",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-new-tokens",
            "12",
            "--repeats",
            "1",
            "--json",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    by = {(r["method"], r["id"]): r for r in data["records"]}
    longest = max(len(bench.chat_prompt_ids(tiny_tokenizer(), p["prompt"])) for p in PROMPTS)
    assert (
        data["static_cache_len"] == longest + 12
    )  # one cache length for every prompt (so none recompiles the decode step)
    for p in PROMPTS:  # float32 greedy: the static cache changes where the keys live, not the tokens
        ref, static = by[("hf-generate", p["id"])], by[("hf-generate-static", p["id"])]
        assert static["output_token_ids"] == ref["output_token_ids"] and len(ref["output_token_ids"]) == 12
        assert static["steps"] == ref["steps"] == 11 and static["prefill_seconds"] > 0 and static["decode_seconds"] > 0
    assert set(data["warmup_seconds"]) == {"hf-generate", "hf-generate-static"} and all(
        w > 0 for w in data["warmup_seconds"].values()
    )
    assert re.search(r"^hf-generate-static\s+\d+\.\d\s+1\.\d\d\s", printed, re.MULTILINE)
    assert re.search(r"^\s+hf-generate-static\s+3/3$", printed, re.MULTILINE)  # compared with hf-generate's output
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
    bench.main(
        [
            *saved_args(saved, heads=None),
            "--methods",
            "hf-generate,hf-compiled,baseline",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-new-tokens",
            "12",
            "--repeats",
            "1",
            "--json",
            str(out),
            "--no-prepack",
        ]
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
    else:  # three step shapes (1 token, chain-3, chain-3 + lookup-4) compiled before the warm-up
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


def test_record_eagle_writes_the_measured_speedup_the_drafter_default_reads(tmp_path):
    import json
    from types import SimpleNamespace

    from medusa_lib.core.dynamic_tree import DynamicTreeConfig
    from medusa_lib.pipeline.bench import record_eagle

    (tmp_path / "config.json").write_text(json.dumps({"format": "medusa-playground-eagle-1"}))
    rec = lambda m, tok, steps, sec: {
        "method": m,
        "new_tokens": tok,
        "steps": steps,
        "prefill_seconds": 0.0,
        "decode_seconds": sec,
    }  # noqa: E731
    records = [
        rec("baseline", 96, 96, 4.0),
        rec("eagle-greedy", 96, 40, 2.0),
        rec("baseline", 96, 96, 4.0),
        rec("eagle-greedy", 96, 48, 3.0),
    ]
    args = SimpleNamespace(max_new_tokens=96, repeats=3)
    record_eagle(
        tmp_path,
        records,
        device="cpu",
        dtype="torch.float32",
        argv=["--methods", "baseline,eagle-greedy", "--record-eagle"],
        tree=DynamicTreeConfig(8, 5, 24),
        args=args,
    )
    cal = json.loads((tmp_path / "config.json").read_text())["calibration"]
    assert (
        cal["device_kind"] == "cpu"
        and cal["speedup"] == 1.6
        and cal["tokens_per_step"] == round(192 / 88, 3)
        and cal["tree"] == [8, 5, 24]
    )
    assert cal["command"].endswith("--record-eagle") and "medusa_speedup" not in cal
    record_eagle(
        tmp_path,
        records + [rec("medusa-greedy", 96, 45, 2.5), rec("medusa-greedy", 96, 45, 2.5)],
        device="cpu",
        dtype="torch.float32",
        argv=[],
        tree=DynamicTreeConfig(8, 5, 24),
        args=args,
        medusa_tree="calibrated-3 + lookup-4",
    )
    cal = json.loads((tmp_path / "config.json").read_text())[
        "calibration"
    ]  # the Medusa heads' speed-up of the same run, beside EAGLE's
    assert cal["speedup"] == 1.6 and cal["medusa_speedup"] == 1.6 and cal["medusa_tree"] == "calibrated-3 + lookup-4"
    assert cal["draft"] == "float" and "lookup_speedup" not in cal and "medusa_heads_speedup" not in cal
    record_eagle(  # both drafters with and without the lookup branch, int8 drafts
        tmp_path,
        records
        + [rec("medusa-greedy", 96, 45, 2.5), rec("medusa-heads-only", 96, 50, 4.0), rec("eagle-lookup", 96, 36, 2.0)],
        device="cpu",
        dtype="torch.float32",
        argv=[],
        tree=DynamicTreeConfig(8, 3, 8),
        args=args,
        medusa_tree="calibrated-3 + lookup-4",
        draft="int8",
    )
    cal = json.loads((tmp_path / "config.json").read_text())["calibration"]
    assert (cal["lookup_speedup"], cal["medusa_speedup"], cal["medusa_heads_speedup"]) == (2.0, 1.6, 1.0)
    assert cal["draft"] == "int8" and cal["tree"] == [8, 3, 8]
    with pytest.raises(SystemExit, match="needs eagle-greedy and baseline"):
        record_eagle(tmp_path, records[:1], device="cpu", dtype="x", argv=[], tree=None, args=args)


@pytest.mark.parametrize("float_draft", [False, True])
def test_eagle_runs_with_and_without_the_lookup_branch_and_says_how_it_drafts(saved, capsys, float_draft):
    from medusa_lib.core.dynamic_tree import DynamicTreeConfig
    from medusa_lib.core.eagle import new_eagle_head
    from medusa_lib.core.packing import can_int8

    if not float_draft and not can_int8(torch.zeros(4, 4)):
        pytest.skip("fbgemm's dynamic int8 linear does not run on this platform")
    folder = saved / "eagle"
    if not folder.exists():
        new_eagle_head(make_model("llama"), tree=DynamicTreeConfig(4, 3, 6)).save(folder)
    out = saved / f"eagle-{float_draft}.json"
    methods = ["baseline", "eagle-greedy", "eagle-lookup"]
    bench.main(
        [*saved_args(saved, heads=None), "--eagle", str(folder), "--methods", ",".join(methods), "--dtype", "float32"]
        + ["--limit", "2", "--max-new-tokens", "12", "--repeats", "1", "--json", str(out)]
        + (["--float-draft"] if float_draft else ["--lookup", "0"])  # eagle-lookup never runs without its branch
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert f"| drafts {'float' if float_draft else 'int8'} |" in printed and data["draft_int8"] is not float_draft
    assert "eagle tree top-k 4 depth 3 nodes 6 (eagle-lookup + lookup-4)" in printed
    tokens = {m: [r["output_token_ids"] for r in data["records"] if r["method"] == m] for m in methods}
    assert tokens["eagle-greedy"] == tokens["eagle-lookup"] == tokens["baseline"]  # exact, with or without the branch
    # the dynamic tree's 3 levels, and with the branch its 4 positions beside them
    positions = {m: len(data["acceptance"][m]["acceptance_rate_per_position"]) for m in methods[1:]}
    assert positions == {"eagle-greedy": 3, "eagle-lookup": 4}
