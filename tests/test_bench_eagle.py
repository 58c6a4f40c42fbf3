"""EAGLE in the benchmark: the measured speed-ups it records beside the head, and its runs with and without
the lookup branch on a tiny saved model."""

import json

import pytest
import torch
from bench_helpers import saved_args
from conftest import make_model

from medusa_lib.pipeline import bench


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
    # the Medusa heads' speed-up of the same run, beside EAGLE's
    cal = json.loads((tmp_path / "config.json").read_text())["calibration"]
    assert cal["speedup"] == 1.6 and cal["medusa_speedup"] == 1.6 and cal["medusa_tree"] == "calibrated-3 + lookup-4"
    assert cal["draft"] == "float" and "lookup_speedup" not in cal and "medusa_heads_speedup" not in cal
    # both drafters with and without the lookup branch, int8 drafts
    record_eagle(
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
        # eagle-lookup never runs without its branch
        + (["--float-draft"] if float_draft else ["--lookup", "0"])
    )
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert f"| drafts {'float' if float_draft else 'int8'} |" in printed and data["draft_int8"] is not float_draft
    assert "eagle tree top-k 4 depth 3 nodes 6 (eagle-lookup + lookup-4)" in printed
    tokens = {m: [r["output_token_ids"] for r in data["records"] if r["method"] == m] for m in methods}
    # exact, with or without the branch
    assert tokens["eagle-greedy"] == tokens["eagle-lookup"] == tokens["baseline"]
    # the dynamic tree's 3 levels, and with the branch its 4 positions beside them
    positions = {m: len(data["acceptance"][m]["acceptance_rate_per_position"]) for m in methods[1:]}
    assert positions == {"eagle-greedy": 3, "eagle-lookup": 4}
