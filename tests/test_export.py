"""Export to vLLM (medusa_lib.pipeline.export): Medusa heads round trip through our own loader; an EAGLE head's
layout computes, by vLLM's EAGLE-1 rules, what our head computes; one-sentence refusals, before anything is
written. The runs in a real vLLM are tests/test_vllm.py (slow)."""

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
    assert json.loads((out / "vllm.json").read_text()) == {"speculative_method": "medusa", "num_speculative_tokens": K}

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
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "vllm.json"]
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
        "give the folder that holds medusa_lm_head.safetensors (Medusa heads) or eagle.safetensors (an EAGLE head) "
        "and config.json."
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


def test_the_cli_shows_progress_and_exits_with_one_line(tmp_path, model_folder):
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
            "--model",
            str(model_folder),
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


# ---------------------------------------------------------------------- the EAGLE head
EAGLE_SHIPPED = ROOT / "assets" / "heads" / "smollm2-135m-instruct-eagle"


def tiny_eagle(folder: Path, *, proposal: bool = True, seed: int = 5) -> Path:
    """A random EAGLE-1 head for the tiny Llama (fc bias and both norms far from their initial values), saved."""
    from medusa_lib.core.eagle import new_eagle_head

    model = make_model("llama")
    torch.manual_seed(seed)
    head = new_eagle_head(model, proposal_ids=torch.randperm(VOCAB)[:100] if proposal else None, base_model="tiny")
    for name, p in head.named_parameters():
        torch.nn.init.normal_(p, mean=1.0 if "norm" in name else 0.0, std=0.3 if "norm" in name else 0.2)
    return head.save(folder)


def vllm_eagle_forward(out: Path, embed: torch.Tensor, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """g [T, d] as vLLM 0.32's EagleLlamaForCausalLM (llama_eagle.py) computes it from an exported folder, over
    one causal sequence: fc without bias on [e ; f]; Llama decoder layers built from config.json, the first
    without its input RMSNorm; o_proj's bias as attention_bias gives it, q/k/v without one (qkv_bias false)."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    raw = json.loads((out / "config.json").read_text())
    assert raw["attention_bias"] is True and raw["qkv_bias"] is False and raw["model_type"] == "llama"
    cfg = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("qkv_bias", "exported_by")})
    state = load_file(str(out / "model.safetensors"))
    T = tokens.numel()
    pos = torch.arange(T)[None]
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
    x = torch.cat([embed[tokens], features], dim=-1) @ state["fc.weight"].T
    pe = LlamaRotaryEmbedding(config=cfg)(x[None], pos)
    h = x[None]
    for i in range(cfg.num_hidden_layers):
        layer = LlamaDecoderLayer(cfg, layer_idx=i).eval()
        ours = {k[len(f"layers.{i}.") :]: v for k, v in state.items() if k.startswith(f"layers.{i}.")}
        missing = set(layer.load_state_dict(ours, strict=False).missing_keys)
        no_bias = {f"self_attn.{p}_proj.bias" for p in "qkv"}  # vLLM builds q/k/v without a bias
        assert missing == no_bias | ({"input_layernorm.weight"} if i == 0 else set()), missing
        for name in no_bias:
            layer.get_parameter(name).data.zero_()
        if i == 0:
            layer.input_layernorm = torch.nn.Identity()  # vLLM's first EAGLE layer has none
        h = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    return h[0]


@pytest.mark.parametrize("proposal", [True, False], ids=["proposal-vocabulary", "full-vocabulary"])
def test_the_exported_eagle_head_computes_by_vllms_rules_what_ours_computes(proposal, model_folder, tmp_path):
    from medusa_lib.core.eagle_io import load_eagle

    model = make_model("llama")  # the same weights as model_folder (seed 0)
    tiny_eagle(tmp_path / "eagle", proposal=proposal)
    out = export_vllm(tmp_path / "eagle", tmp_path / "vllm", model=str(model_folder), progress=False)

    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in keys)  # vLLM shares the target's
    assert "fc.bias" not in keys and "layers.0.input_layernorm.weight" not in keys  # vLLM has neither
    method = json.loads((out / "vllm.json").read_text())
    assert method["speculative_method"] == "eagle"
    assert (method["differs"] is not None) is proposal  # the one difference is said, never silent
    readme = (out / "README.md").read_text()
    assert '"method": "eagle"' in readme and "vllm serve" in readme and "LLM(" in readme

    head = load_eagle(tmp_path / "eagle", model=model, int8=False)
    torch.manual_seed(0)
    T = 12
    features, tokens = torch.randn(T, HIDDEN), torch.randint(0, VOCAB, (T,))
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        ours = head(features[None], tokens[None], torch.arange(T)[None], attention_mask=mask)[0]
        theirs = vllm_eagle_forward(out, model.get_input_embeddings().weight, features, tokens)
        dropped = theirs - head.fc.bias  # what vLLM would compute from a layer without the pass-through's bias
    torch.testing.assert_close(theirs, ours, atol=2e-5, rtol=1e-4)
    assert not torch.allclose(dropped, ours, atol=1e-2)  # the bias matters: the comparison can fail
    lm_head = model.get_output_embeddings().weight
    assert torch.equal((theirs @ lm_head.T).argmax(-1), (ours @ lm_head.T).argmax(-1))  # vLLM's drafts, full vocab


def test_the_shipped_eagle_head_exports_with_its_one_difference_said(tmp_path, capsys):
    main(["--heads", str(EAGLE_SHIPPED), "--to", "vllm", "--out", str(tmp_path / "out")])
    err = capsys.readouterr()
    differs = (
        "vLLM's EAGLE-1 has no token map, so it drafts the top token of all 49,152 with the target's lm_head "
        "where this head drafts over its 8,192 proposal tokens: its drafts differ from ours only where the top "
        "token is outside the proposal vocabulary (the target verifies every draft: output unchanged)."
    )
    assert f"note: {differs}" in err.err and err.out.startswith(f"wrote {tmp_path / 'out'}")
    method = json.loads((tmp_path / "out" / "vllm.json").read_text())
    assert method == {
        "speculative_method": "eagle",
        "num_speculative_tokens": 3,
        "draft_vocabulary": 49152,
        "trained_proposal_tokens": 8192,
        "differs": differs,
    }
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (576, 2, 49152)


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


REFUSALS = {
    "medusa heads passed as eagle": (
        ["--drafter", "eagle"],
        "error: {heads} holds Medusa heads, not an EAGLE head (no eagle.safetensors); give the EAGLE head's folder "
        "(such as assets/heads/smollm2-135m-instruct-eagle) or leave out --drafter eagle.",
    ),
    "eagle head passed as medusa": (
        ["--drafter", "medusa"],
        "error: {eagle} holds an EAGLE head (eagle.safetensors), not Medusa heads; give a Medusa heads folder "
        "(such as assets/heads/smollm2-135m-instruct-plain) or leave out --drafter medusa.",
    ),
    "an unknown drafter": (["--drafter", "hydra"], "error: Unknown drafter 'hydra' for --drafter; use medusa or eagle"),
    "eagle head for another model": (
        [],
        "error: This EAGLE head was trained for a model with hidden size 64 and 999 tokens, but {model} has 64 and "
        "320; export with --model set to the model it was trained for (someone/other-model).",
    ),
    "medusa heads for another model": (
        [],
        "error: These heads were trained for a model with hidden size 32 and 320 tokens, but {model} has 64 and 320; "
        "export with --model set to the model they were trained for.",
    ),
    "eagle head of another family": (
        [],
        "error: This EAGLE head drafts for a qwen2 model; the export writes vLLM's EAGLE drafter for Llama models "
        "only (EagleLlamaForCausalLM), so export a head trained for a Llama model.",
    ),
    "eagle-3 head": (
        [],
        "error: This EAGLE head fuses base layers [0, 1] (the EAGLE-3 recipe), which vLLM's EAGLE drafter cannot run: "
        "its EAGLE-1 reads the final hidden state only and its EAGLE-3 is another layer; export an EAGLE-1 head "
        "(fuse_layers null, such as assets/heads/smollm2-135m-instruct-eagle).",
    ),
    "eagle weights cut short": (
        [],
        "error: The EAGLE weights {eagle}/eagle.safetensors are not a readable safetensors file (",
    ),
    "eagle weights of random bytes": (
        [],
        "error: The EAGLE weights {eagle}/eagle.safetensors are not a readable safetensors file (",
    ),
    "eagle config.json damaged": ([], "error: {eagle}/config.json cannot be read ("),
    "medusa weights cut short": (
        [],
        "error: The heads file {heads}/medusa_lm_head.safetensors is not a readable safetensors file (",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_cannot_be_exported_is_refused_in_one_sentence_before_anything_is_written(case, model_folder, tmp_path):
    heads, eagle = tmp_path / "heads", tmp_path / "eagle"
    random_heads(hidden=32 if case == "medusa heads for another model" else HIDDEN).save(heads)
    tiny_eagle(eagle)
    config = json.loads((eagle / "config.json").read_text())
    edits = {
        "eagle head for another model": {"vocab_size": 999, "base_model": "someone/other-model"},
        "eagle head of another family": {"model_type": "qwen2"},
        "eagle-3 head": {"fuse_layers": [0, 1]},
    }
    (eagle / "config.json").write_text(json.dumps({**config, **edits.get(case, {})}))
    if case == "eagle weights cut short":
        _cut(eagle / "eagle.safetensors")
    elif case == "eagle weights of random bytes":
        (eagle / "eagle.safetensors").write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    elif case == "eagle config.json damaged":
        (eagle / "config.json").write_text('{"format": "medusa-playground-eagle-1", ')
    elif case == "medusa weights cut short":
        _cut(heads / "medusa_lm_head.safetensors")
    source = heads if case.startswith(("medusa", "an unknown")) else eagle
    flags, message = REFUSALS[case]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as err:
        main(["--heads", str(source), "--to", "vllm", "--out", str(out), "--model", str(model_folder), *flags])
    said = str(err.value)
    assert said.startswith(message.format(heads=heads, eagle=eagle, model=model_folder)), said
    assert "\n" not in said and said.endswith(".") and said.count(". ") == 0, said  # one sentence
    assert not out.exists() and not list(tmp_path.glob("*.tmp-export"))


def test_an_eagle_head_named_for_another_model_is_refused_for_the_default_model(tmp_path):
    import shutil

    folder = tmp_path / "eagle"
    shutil.copytree(EAGLE_SHIPPED, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "base_model": "HuggingFaceTB/SmolLM2-135M"}))
    with pytest.raises(SystemExit) as err:
        main(["--heads", str(folder), "--to", "vllm", "--out", str(tmp_path / "out")])
    assert str(err.value) == (
        "error: This EAGLE head was trained for HuggingFaceTB/SmolLM2-135M, not HuggingFaceTB/SmolLM2-135M-Instruct; "
        "export with --model set to a local folder of HuggingFaceTB/SmolLM2-135M."
    )
    assert not (tmp_path / "out").exists()


def test_the_page_says_whether_the_eagle_head_exports_and_with_which_command(monkeypatch):
    """The EAGLE section's line: the shipped EAGLE-1 head exports (its folder, relative to where the app runs);
    a head that fuses base layers (EAGLE-3 recipe) cannot, in the export's own sentence."""
    from dataclasses import replace
    from types import SimpleNamespace

    from medusa_lib.core.eagle_io import read_eagle_config
    from medusa_lib.present.export import eagle_export_hint

    monkeypatch.chdir(ROOT)
    folder = ROOT / "assets" / "heads" / "smollm2-135m-instruct-eagle"
    cfg = read_eagle_config(folder)
    assert eagle_export_hint(SimpleNamespace(config=cfg, folder=folder)) == (
        "**Serving in vLLM:** this EAGLE head exports to vLLM's EAGLE drafter (a top-1 chain, drafting over the "
        "whole vocabulary there): `python -m medusa_lib.pipeline.export --heads "
        "assets/heads/smollm2-135m-instruct-eagle --to vllm --out OUT` (docs/serving.md#serving-your-heads)."
    )
    fused = eagle_export_hint(SimpleNamespace(config=replace(cfg, fuse_layers=(2, 15, 28)), folder=folder))
    assert fused.startswith("**Serving in vLLM:** This EAGLE head fuses base layers [2, 15, 28] (the EAGLE-3 recipe)")
