"""Export to vLLM's Medusa format (medusa_lib.pipeline.export): round trip through our own loader,
one-sentence refusals. The run in a real vLLM is tests/test_vllm.py (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HIDDEN, VOCAB, make_model, random_heads
from safetensors import safe_open

from medusa_lib import HeadsConfig, MedusaHeads, load_heads
from medusa_lib.core.vllm_format import to_vllm_medusa, vllm_refusal
from medusa_lib.pipeline.export import export_vllm, main

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SENTENCE = (
    "only plain heads export to vLLM (such as assets/heads/smollm2-135m-instruct-plain), so train them without "
    "--root-conditioned or --path-conditioned (python -m medusa_lib.pipeline.train --out DIR) and export those."
)


def proposal_heads(*, layers: int = 2, shared: bool = True, seed: int = 3) -> MedusaHeads:
    """Plain heads on a 100-token proposal vocabulary, random everywhere (the shipped plain heads' layout)."""
    torch.manual_seed(seed)
    heads = MedusaHeads(
        HeadsConfig(
            hidden_size=HIDDEN,
            vocab_size=VOCAB,
            num_heads=4,
            num_layers=layers,
            shared_lm_head=shared,
            num_proposal_tokens=100,
        )
    )
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.5)
    heads.proposal_ids.copy_(torch.randperm(VOCAB)[:100])
    return heads.eval()


HEADS = {
    "shared-lm-head-proposal-vocabulary": lambda: proposal_heads(),
    "shared-lm-head-full-vocabulary": lambda: random_heads(shared=True),
    "own-projections-full-vocabulary": lambda: random_heads(shared=False),
}


@pytest.mark.parametrize("kind", list(HEADS))
def test_exported_heads_loaded_back_from_vllm_layout_propose_what_the_source_proposes(kind, model_folder, tmp_path):
    model = make_model("llama")  # the same weights as model_folder (seed 0)
    source = HEADS[kind]()
    source.save(tmp_path / "heads")
    out = export_vllm(tmp_path / "heads", tmp_path / "vllm", model=str(model_folder), progress=False)

    config = json.loads((out / "config.json").read_text())
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        token_map = f.get_tensor("token_map") if "token_map" in keys else None
    K, L = source.num_heads, source.config.num_layers
    assert {f"blocks.{i}.layers.{j}.{p}" for i in range(K) for j in range(L) for p in ("weight", "bias")} <= keys
    assert config["medusa_fc_bias"] is True and config["medusa_num_heads"] == K and config["medusa_num_layers"] == L
    assert config["original_lm_head"] is source.config.shared_lm_head
    assert ("lm_heads.0.weight" in keys) and (("lm_heads.1.weight" in keys) is not source.config.shared_lm_head)
    if source.proposal_ids is not None:
        assert config["truncated_vocab_size"] == 100 < config["vocab_size"] == VOCAB
        assert token_map.dtype == torch.int64 and torch.equal(token_map, source.proposal_ids)
    else:
        assert token_map is None and config["truncated_vocab_size"] == VOCAB
    assert "vllm serve" in (out / "README.md").read_text() and "enable_weights_track" in (out / "README.md").read_text()

    back = load_heads(out, model=model)  # our own loader, reading vLLM's layout
    h = torch.randn(64, HIDDEN)
    lm_head = model.get_output_embeddings()
    for topk in (1, 3):
        assert torch.equal(back.propose(h, lm_head, topk=topk), source.propose(h, lm_head, topk=topk))


def test_bfloat16_export_halves_the_file(model_folder, tmp_path):
    proposal_heads().save(tmp_path / "heads")
    f32 = export_vllm(tmp_path / "heads", tmp_path / "f32", model=str(model_folder), progress=False)
    bf16 = export_vllm(tmp_path / "heads", tmp_path / "bf16", model=str(model_folder), dtype="bfloat16", progress=False)
    with safe_open(str(bf16 / "model.safetensors"), framework="pt") as f:
        assert (
            f.get_tensor("blocks.0.layers.0.weight").dtype == torch.bfloat16
            and f.get_tensor("token_map").dtype == torch.int64
        )
    assert (bf16 / "model.safetensors").stat().st_size < 0.6 * (f32 / "model.safetensors").stat().st_size


def test_export_replaces_an_earlier_export_but_never_another_folder(model_folder, tmp_path):
    proposal_heads().save(tmp_path / "heads")
    out = tmp_path / "vllm"
    export_vllm(tmp_path / "heads", out, model=str(model_folder), progress=False)
    export_vllm(tmp_path / "heads", out, model=str(model_folder), progress=False)  # again: replaced
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert not list(tmp_path.glob("*.tmp-export"))
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep me")
    with pytest.raises(SystemExit) as err:
        main(["--heads", str(tmp_path / "heads"), "--to", "vllm", "--out", str(other), "--model", str(model_folder)])
    assert str(err.value) == f"error: {other} exists and is not an earlier export; give --out a new or empty folder."
    assert (other / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize("kind", ["root", "path"])
def test_conditioned_heads_are_refused_with_the_heads_that_can_be_exported(kind, tmp_path):
    heads = random_heads(root=True, path=kind == "path")
    heads.save(tmp_path / "heads")
    what = {
        "root": "root-conditioned (they also read the tree's root token)",
        "path": "path-conditioned (each head also reads the tree's root and its own branch)",
    }[kind]
    expected = (
        f"error: These heads are {what}, which vLLM's Medusa cannot run: it feeds its heads the hidden state only; "
        f"{TRAIN_SENTENCE}"
    )
    with pytest.raises(SystemExit) as err:
        main(["--heads", str(tmp_path / "heads"), "--to", "vllm", "--out", str(tmp_path / "out")])
    assert str(err.value) == expected
    assert not (tmp_path / "out").exists()
    assert vllm_refusal(heads) == expected[len("error: ") :]
    with pytest.raises(ValueError, match="cannot run"):
        to_vllm_medusa(heads)


def test_own_projections_onto_a_proposal_vocabulary_are_refused(tmp_path):
    """vLLM 0.32 sizes per-head projections to the full vocabulary: only a shared head takes token_map."""
    proposal_heads(layers=1, shared=False).save(tmp_path / "heads")
    with pytest.raises(SystemExit) as err:
        main(["--heads", str(tmp_path / "heads"), "--to", "vllm", "--out", str(tmp_path / "out")])
    assert str(err.value) == (
        "error: These heads have their own projections onto a 100-token proposal vocabulary, "
        "which vLLM's Medusa cannot load "
        "(it restricts the vocabulary only for one head shared by all); train heads on the shared lm_head "
        "(the default: python -m medusa_lib.pipeline.train --out DIR) or with full-vocabulary projections "
        "(--proposal-tokens 0), and export those."
    )


def test_bad_command_lines_get_one_sentence(tmp_path):
    missing = tmp_path / "no-such-heads"
    with pytest.raises(SystemExit) as err:
        main(["--heads", str(missing), "--to", "vllm", "--out", str(tmp_path / "out")])
    assert (
        str(err.value) == f"error: No heads folder at {str(missing)!r}; "
        "give the folder that holds medusa_lm_head.safetensors and config.json."
    )
    with pytest.raises(SystemExit) as err:
        main(["--heads", str(missing), "--to", "tgi", "--out", str(tmp_path / "out")])
    assert str(err.value) == "error: Unknown target 'tgi' for --to; the heads export to: vllm."
    random_heads(shared=False).save(tmp_path / "heads")
    with pytest.raises(SystemExit) as err:
        main(["--heads", str(tmp_path / "heads"), "--to", "vllm", "--out", str(tmp_path / "out"), "--dtype", "int8"])
    assert str(err.value) == "error: Unknown dtype 'int8' for the export; use float32 or bfloat16."


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "out under a file",
            "error: --out '{tmp}/afile/out' is under '{tmp}/afile', which is a file, not a folder; give another path.",
        ),
        ("out in /proc", "error: --out '/proc/medusa-export' cannot be written: '/proc' takes no files ("),
        (
            "heads config.json of []",
            "error: {tmp}/heads/config.json holds a list, not an object of settings; "
            "copy the heads again or train new ones.",
        ),
    ],
)
def test_a_bad_out_or_heads_config_is_one_sentence(tmp_path, case, message):
    random_heads(shared=False).save(tmp_path / "heads")
    (tmp_path / "afile").write_text("x")
    out = {"out under a file": tmp_path / "afile" / "out", "out in /proc": Path("/proc/medusa-export")}.get(
        case, tmp_path / "out"
    )
    if case == "heads config.json of []":
        (tmp_path / "heads" / "config.json").write_text("[]")
    with pytest.raises(SystemExit) as err:
        main(["--heads", str(tmp_path / "heads"), "--to", "vllm", "--out", str(out)])
    assert str(err.value).startswith(message.format(tmp=tmp_path)), err.value
    assert not (tmp_path / "out").exists()


def test_the_cli_shows_progress_and_exits_with_one_line(tmp_path):
    heads = tmp_path / "heads"
    random_heads(root=True).save(heads)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "medusa_lib.pipeline.export",
            "--heads",
            str(heads),
            "--to",
            "vllm",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "export to vllm" in out.stderr  # the tqdm line
    assert out.stderr.strip().splitlines()[-1].startswith("error: These heads are root-conditioned")
    random_heads(shared=False).save(heads)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "medusa_lib.pipeline.export",
            "--heads",
            str(heads),
            "--to",
            "vllm",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "4/4" in out.stderr and out.stdout.startswith(f"wrote {tmp_path / 'out'}")


def test_the_page_says_whether_the_heads_export_and_with_which_command(tmp_path, monkeypatch):
    from medusa_lib.present.export import export_hint

    monkeypatch.chdir(tmp_path)
    proposal_heads().save(tmp_path / "plain")
    random_heads(root=True, path=True).save(tmp_path / "hydra")
    plain, hydra = load_heads(tmp_path / "plain"), load_heads(tmp_path / "hydra")
    assert export_hint(plain) == (
        "**Serving in vLLM:** these plain heads export to vLLM's Medusa drafter (a top-1 chain, no tree): "
        "`python -m medusa_lib.pipeline.export --heads plain --to vllm --out OUT` (docs/serving.md#serving-your-heads)."
    )
    assert export_hint(hydra) == (
        "**Serving in vLLM:** these path-conditioned heads cannot be exported (vLLM's Medusa reads the hidden state "
        "only); "
        "plain heads can: train them without path conditioning (`python -m medusa_lib.pipeline.train --out DIR`), "
        "then `python -m medusa_lib.pipeline.export --heads DIR --to vllm --out OUT` "
        "(docs/serving.md#serving-your-heads)."
    )
