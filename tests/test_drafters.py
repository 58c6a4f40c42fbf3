"""The drafter seam: the verifier runs any drafter, and the prompt lookup drafter keeps every guarantee."""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from conftest import make_model

from medusa_lib.core import decoding, fused
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.config import DecodeConfig, DecodeError
from medusa_lib.core.drafters import Draft, Drafter, DraftRun, LookupDrafter
from medusa_lib.core.kv import StaticKV
from medusa_lib.core.tree import build_tree, chain_choices

LOOP = [1, 17, 33, 250, 99, 4, 61, 17, 33, 250, 99, 4, 61, 17, 33]  # repeats: the lookup drafter finds matches
N_NEW = 48
CACHES = ["dynamic", "static"]


@pytest.fixture(scope="module")
def models():
    return {arch: make_model(arch) for arch in ("llama", "qwen2", "gpt2")}


def tokens(model, method, *, cache="dynamic", temperature=0.0, seed=0, drafter=None, prompt=LOOP):
    cfg = DecodeConfig(max_new_tokens=N_NEW, temperature=temperature, seed=seed, stop_on_eos=False, cache=cache)
    return run_method(model, prompt, method=method, config=cfg, drafter=drafter)


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_lookup_drafter_greedy_equals_plain_greedy_and_generate(models, arch, cache):
    model = models[arch]
    ref = model.generate(
        torch.tensor([LOOP]), max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(LOOP) :].tolist()
    run = tokens(model, "medusa-greedy", cache=cache, drafter=LookupDrafter(4))
    assert run.tokens == tokens(model, "plain", cache=cache).tokens == ref
    assert {s.drafter for s in run.steps[1:]} == {"lookup"}
    assert run.tokens_per_step > 1.0  # the repeating prompt: some steps copy several tokens
    accepted = sum(s.accept_length for s in run.steps)
    # every accepted candidate was copied from the context (a captured step's nodes past the match are dead)
    assert run.lookup_tokens == accepted


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("seed", [0, 3])
def test_lookup_drafter_exact_sampling_equals_plain_sampling(models, cache, seed):
    model = models["llama"]
    plain = tokens(model, "plain", cache=cache, temperature=0.8, seed=seed).tokens
    ours = tokens(model, "medusa-sample", cache=cache, temperature=0.8, seed=seed, drafter=LookupDrafter(3))
    assert ours.tokens == plain


def test_lookup_drafter_without_a_match_makes_plain_steps():
    model = make_model("llama")
    run = tokens(model, "medusa-greedy", drafter=LookupDrafter(4), prompt=[1, 2, 3])
    first = next(i for i, s in enumerate(run.steps[1:], 1) if s.tree is not None and s.tree.num_nodes > 1)
    assert all(s.tree.num_nodes == 1 for s in run.steps[1:first])  # nothing to copy yet: the root alone
    assert run.steps[first].tree.lookup == run.steps[first].tree.num_nodes - 1  # then one chain


def test_lookup_drafter_length_is_checked():
    with pytest.raises(ValueError, match=r"copies 1 to 8 tokens a step \(got 0\)"):
        LookupDrafter(0)
    with pytest.raises(DecodeError, match="must be a Drafter"):
        make_decoder(make_model("llama"), method="medusa-greedy", drafter="lookup")


class _EchoRun(DraftRun):
    """A drafter written outside the library: it guesses that the root repeats twice."""

    def __init__(self, d):
        self.d = d

    def propose(self, root, *, history, seq_len):
        return Draft(self.d.buffers.cpu, torch.cat([root.view(1)] * 3), self.d.buffers)


class EchoDrafter(Drafter):
    name = "echo"
    depth = 2

    def _bind(self, dec):
        self.buffers = dec.build(build_tree(chain_choices(2)))

    def open(self):
        return _EchoRun(self)


@pytest.mark.parametrize("method,temperature", [("medusa-greedy", 0.0), ("medusa-sample", 0.9)])
def test_a_new_drafter_is_one_class_and_the_verifier_keeps_it_exact(models, method, temperature):
    model = models["qwen2"]
    plain = tokens(model, "plain", temperature=temperature, seed=5).tokens
    run = tokens(model, method, temperature=temperature, seed=5, drafter=EchoDrafter())
    assert run.tokens == plain
    assert {s.drafter for s in run.steps[1:]} == {"echo"} and run.steps[1].tree.num_nodes == 3
    dec = make_decoder(model, method=method, config=DecodeConfig(cache="static"), drafter=EchoDrafter())
    assert not dec.static and dec.note.endswith("so the run uses the dynamic cache.")  # no static form


def test_the_verifier_never_names_a_drafter_kind():
    forbidden = [
        "EagleRun",
        "EagleInput",
        "eagle_run",
        "isinstance(draft",
        "heads.draft",
        "self.eagle",
        '"eagle"',
        '"medusa"',
    ]
    for module in (decoding, fused):
        source = inspect.getsource(module)
        assert [f for f in forbidden if f in source] == [], module.__name__


def test_a_static_lookup_drafter_step_is_one_program_and_matches_the_dynamic_tokens(models):
    model = models["llama"]
    kv = StaticKV(model, max_len=256)
    dec = make_decoder(model, method="medusa-greedy", config=DecodeConfig(max_new_tokens=N_NEW, cache="static"),
                  static_kv=kv, drafter=LookupDrafter(4))  # fmt: skip
    assert dec.static and dec.static_draft.key[:2] == ("lookup", 4) and dec.step_sizes[1] == 5
    assert dec.run(LOOP).tokens == tokens(model, "plain").tokens
    assert len(kv.programs) == 2  # the chain step and the root-only step


def test_prompt_lookup_on_the_page_and_the_api():
    from conftest import tiny_playground

    from medusa_lib.present import Settings
    from ui.handlers import Handlers

    pg = tiny_playground(oracle=False)
    assert "lookup" in pg.drafters.available and pg.drafters.default == "medusa"
    out = pg.compare("w10 w11 w12 w10 w11 w12 w10 w11", Settings(max_new_tokens=12, drafter="lookup", tree="chain-2"))
    assert out["drafter"] == "lookup" and out["greedy_match"]["equal"]
    assert out["methods"]["medusa-greedy"]["drafter"] == "lookup" and out["methods"]["plain"]["drafter"] is None
    tree, custom, note = Handlers(pg).drafter_choice("lookup")
    assert tree["interactive"] is False and custom["interactive"] is False and note["visible"] is True
    assert "Prompt lookup copies the tokens that followed" in note["value"]


def test_bench_runs_prompt_lookup_as_a_drafter_and_it_stays_exact(tmp_path, capsys):
    import json

    from conftest import tiny_tokenizer

    from medusa_lib.pipeline import bench

    make_model("llama").save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    prompts = [{"id": "a-1", "category": "alpha", "prompt": "w20 w21 w22 w20 w21 w22 w20 w21"}]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    methods = "hf-generate,baseline,lookup-greedy,plain-sample,lookup-sample,lookup-typical"
    argv = ["--model", str(tmp_path / "model"), "--prompts", str(tmp_path / "prompts.jsonl"), "--methods", methods]
    argv += ["--temperature", "0.8", "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "16"]
    bench.main([*argv, "--repeats", "1", "--json", str(tmp_path / "out.json")])
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "out.json").read_text())
    by = {r["method"]: r["output_token_ids"] for r in data["records"]}
    assert by["lookup-greedy"] == by["hf-generate"] and by["lookup-sample"] == by["plain-sample"]
    assert data["exact_sampling"]["lookup-sample"]["identical"] == 1
    assert re.search(r"^\s+lookup-greedy\s+1/1$", printed, re.M)
