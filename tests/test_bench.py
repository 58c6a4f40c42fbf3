"""The benchmark CLI end to end on a tiny saved model: records, tables, exactness against generate, acceptance,
the tree and lookup length it picks, the sampled methods. The engines (static cache, compile) are in
test_bench_engines.py, EAGLE in test_bench_eagle.py."""

import json
import re

import pytest
from bench_helpers import PROMPTS, run_bench, saved_args
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


def test_bench_writes_one_record_per_method_and_prompt_and_prints_the_tables(saved, capsys):
    out = saved / "out.json"
    run_bench(saved, out, "--methods", ",".join(METHODS), new=16, repeats=2)
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
    # float32: our loops are exact against model.generate
    for p in PROMPTS:
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
    # the drafters; plain decoding has none
    assert list(data["acceptance"]) == ["medusa-greedy", "lookup-greedy"]
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


# lookup: not calibrated; calibrated without the branch; with a 2-token branch
@pytest.mark.parametrize("lookup", [None, 0, 2])
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
    run_bench(saved, out, "--methods", "medusa-greedy", heads=tmp_path / "heads", new=2, repeats=1)
    data = json.loads(out.read_text())
    assert data["lookup"] == page.lookup_length and data["tree"].split(" + ")[0] == page.tree
    assert (page.tree, page.lookup_length) == {None: ("topk-4x3x2-16", 4), 0: ("chain-2", 0), 2: ("chain-2", 2)}[lookup]


SAMPLED = ["plain-sample", "medusa-sample", "medusa-typical"]


def test_bench_sampled_methods_draw_from_one_seed_and_the_exact_sampler_matches_plain_sampling(saved, capsys):
    out = saved / "sampled.json"
    run_bench(
        saved,
        out,
        "--methods",
        "hf-generate,baseline,medusa-greedy," + ",".join(SAMPLED),
        "--temperature",
        "0.8",
        "--seed",
        "3",
        new=16,
        repeats=1,
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert (data["temperature"], data["top_p"], data["seed"]) == (0.8, 1.0, 3) and data["sampled_methods"] == SAMPLED
    by = {(r["method"], r["id"]): r["output_token_ids"] for r in data["records"]}
    # float32: lossless speculative sampling == plain sampling with the same seed
    for p in PROMPTS:
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
    # "vs plain" and "plain ref" of every row
    assert set(rows) == {"hf-generate", "baseline", "medusa-greedy", *SAMPLED}
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
