"""A smaller proposal vocabulary for the EAGLE drafter (issue #34, item 4): drafting onto a subset keeps
the drafter's logits over the kept tokens, decoding stays exact, and the sweep measures each size with
the simulation the training keeps checkpoints by (tiny models, float32)."""

import json

import pytest
import torch
from conftest import VOCAB, make_model

from medusa_lib import DecodeConfig
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.dynamic_tree import DynamicTreeConfig
from medusa_lib.core.eagle import EagleError, new_eagle_head
from medusa_lib.core.eagle_io import load_eagle
from medusa_lib.core.eagle_run import EagleRun
from medusa_lib.pipeline.eagle_loss import simulated_acceptance
from medusa_lib.pipeline.eagle_tune import proposal_subsets, sweep, write_size
from medusa_lib.pipeline.feature_cache import FeatureCache
from medusa_lib.pipeline.hidden_cache import frequent_tokens

PROMPTS = [[1, 17, 33, 250, 99, 4, 61], [1, 5, 9, 12], [1, 200, 201, 202, 7, 8, 30, 31, 40]]
TREE = DynamicTreeConfig(top_k=2, depth=3, num_nodes=6)


@pytest.fixture(scope="module")
def model():
    return make_model("llama")


@pytest.fixture(scope="module")
def records(model):
    cfg = DecodeConfig(max_new_tokens=24, stop_on_eos=False)
    return [{"prompt_ids": p, "answer_ids": run_method(model, p, method="plain", config=cfg).tokens} for p in PROMPTS]


def head_on(model, records, n=64):
    """A random head drafting onto the n most frequent answer tokens, as train_eagle builds it."""
    torch.manual_seed(0)
    ids = frequent_tokens(records, n, VOCAB, always=[2])
    return new_eagle_head(model, proposal_ids=ids, tree=TREE).eval().requires_grad_(False)


def test_a_subset_keeps_the_drafters_logits_over_the_kept_tokens_and_decoding_exact(model, records):
    head = head_on(model, records)
    full = head.proposal_ids.clone()
    g = torch.randn(3, head.config.hidden_size)
    before = head.logits(g)
    keep = full[::3]
    head.set_proposal(keep[torch.randperm(len(keep))])  # any order: kept sorted
    assert torch.equal(head.proposal_ids, keep) and head.config.num_proposal_tokens == len(keep)
    assert torch.equal(head.logits(g), before[:, ::3])  # the same rows, the projection rebuilt
    run = EagleRun(head, TREE)
    f = torch.randn(5, head.config.hidden_size)
    run.extend(f, torch.tensor(PROMPTS[0][1:6]), 0)
    drafted = run.draft(torch.tensor(PROMPTS[0][5]))
    assert torch.isin(drafted.tokens[1:], keep).all()  # only kept tokens are drafted
    for r in records:
        cfg = DecodeConfig(max_new_tokens=len(r["answer_ids"]), stop_on_eos=False)
        res = make_decoder(model, method="medusa-greedy", eagle=head, config=cfg).run(r["prompt_ids"])
        assert res.tokens == r["answer_ids"]  # verification decides: any proposal set is exact
    for bad in (torch.tensor([], dtype=torch.long), torch.tensor([3, 3]), torch.tensor([VOCAB])):
        with pytest.raises(EagleError) as err:
            head.set_proposal(bad)
        assert str(err.value) == (
            f"A proposal vocabulary must be distinct token ids from 0 to {VOCAB - 1}; "
            "choose them from the head's proposal_ids."
        )
    assert torch.equal(head.proposal_ids, keep)  # a refusal changes nothing


def test_the_sweep_measures_each_size_by_the_simulation_and_restores_the_head(model, records):
    head = head_on(model, records)
    full = head.proposal_ids.clone()
    cache = FeatureCache.build(model, records, dtype=torch.float32)
    subsets = proposal_subsets(head, records, [64, 16, 4], [2])
    assert torch.equal(subsets[64], full) and torch.equal(subsets[16], frequent_tokens(records, 16, VOCAB, always=[2]))
    assert all(torch.isin(subsets[n], full).all() for n in (16, 4))
    seqs = list(range(len(cache)))
    rows = sweep(head, cache, seqs, subsets, repeats=2, log=lambda _: None)
    assert [r["proposal_tokens"] for r in rows] == [64, 16, 4] and torch.equal(head.proposal_ids, full)
    assert all(r["draft_ms"] > 0 and r["steps"] > 0 for r in rows)
    for r in rows:  # each row is the training's own simulation on that subset
        head.set_proposal(subsets[r["proposal_tokens"]])
        sim = simulated_acceptance(head, cache, seqs, TREE)
        assert abs(r["tokens_per_step"] - sim["tokens_per_step"]) < 1e-3 and r["steps"] == sim["steps"]
    head.set_proposal(full)
    with pytest.raises(SystemExit) as err:
        proposal_subsets(head, records, [65], [2])
    assert str(err.value) == "error: --sizes 65 is more than the head's 64 proposal tokens; give sizes up to 64."


def test_writing_a_size_keeps_the_weights_and_records_the_sweep(model, records, tmp_path):
    head = head_on(model, records)
    head.save(tmp_path / "eagle")
    ids = proposal_subsets(head, records, [16], [2])[16]
    write_size(tmp_path / "eagle", ids, {"rows": [], "kept": 16})
    back = load_eagle(tmp_path / "eagle", model=model)
    cfg = json.loads((tmp_path / "eagle" / "config.json").read_text())
    assert back.config.num_proposal_tokens == 16 == cfg["num_proposal_tokens"] and cfg["proposal_sweep"]["kept"] == 16
    assert torch.equal(back.proposal_ids, ids)
    for k, v in head.state_dict().items():
        if k != "proposal_ids" and not k.startswith("rotary."):
            assert torch.equal(back.state_dict()[k], v), k


def test_the_node_sweep_times_each_tree_against_plain_and_writes_the_chosen_one(tmp_path, capsys):
    """eagle_tune --trees end to end on a tiny saved model: every tree decodes the same prompts as plain,
    the smallest within the tie of the fastest becomes the head's tree, and the sweep is recorded."""
    from conftest import tiny_tokenizer

    from medusa_lib.pipeline import eagle_tune

    model = make_model("llama")
    model.generation_config.eos_token_id = None
    model.save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    new_eagle_head(model, tree=TREE).save(tmp_path / "eagle")
    prompts = [{"id": f"p-{i}", "category": "c", "prompt": f"w{10 + i} w{11 + i} w{12 + i}"} for i in range(4)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    common = ["--model", str(tmp_path / "model"), "--heads", str(tmp_path / "eagle"), "--dtype", "float32"]
    eagle_tune.main(
        [
            *common,
            *("--trees", "2,2,2", "2,3,6", "--prompts", str(tmp_path / "prompts.jsonl"), "--speed-prompts", "2"),
            *("--max-new-tokens", "12", "--repeats", "1", "--write-tree", "--json", str(tmp_path / "sweep.json")),
        ]
    )
    printed = capsys.readouterr().out
    sweep_json = json.loads((tmp_path / "sweep.json").read_text())["tree_sweep"]
    cfg = json.loads((tmp_path / "eagle" / "config.json").read_text())
    rows = {r["tree"]: r for r in sweep_json["rows"]}
    assert list(rows) == ["plain", "2,2,2", "2,3,6"] and rows["plain"]["speedup"] == 1.0
    assert all(r["tok_s"] > 0 and r["tokens_per_step"] >= 1.0 for r in rows.values())
    fastest = max(rows[n]["speedup"] for n in ("2,2,2", "2,3,6"))
    want = "2,2,2" if rows["2,2,2"]["speedup"] >= fastest * (1 - 0.02) else "2,3,6"
    assert sweep_json["chosen"] == want == f"{cfg['top_k']},{cfg['depth']},{cfg['num_nodes']}"
    assert cfg["tree_sweep"] == sweep_json and f"wrote tree {want}" in printed
    assert load_eagle(tmp_path / "eagle", model=model).config.tree == DynamicTreeConfig(*map(int, want.split(",")))
    for bad, message in [
        (["--trees", "8,3"], "error: --trees takes top-k,depth,nodes triples like 8,3,12 (got '8,3')."),
        (["--trees", "2,2,9"], "error: --trees 2,2,9: The dynamic tree keeps between 1 and 6 nodes "),
        ([], "error: Give --sizes (proposal vocabularies to simulate), --trees (dynamic trees to time), or both."),
        (
            ["--sizes", "16", "--write", "8"],
            "error: --write 8 is not one of --sizes '16'; measure it ",
        ),
    ]:
        with pytest.raises(SystemExit) as err:
            eagle_tune.main([*common, *bad])
        assert str(err.value).startswith(message)


def test_a_head_on_the_whole_vocabulary_is_swept_and_given_back_as_it_came(model, records):
    torch.manual_seed(0)
    head = new_eagle_head(model, tree=TREE).eval().requires_grad_(False)  # no proposal vocabulary
    cache = FeatureCache.build(model, records, dtype=torch.float32)
    subsets = proposal_subsets(head, records, [VOCAB, 16], [2])
    rows = sweep(head, cache, list(range(len(cache))), subsets, repeats=1, log=lambda _: None)
    assert [r["proposal_tokens"] for r in rows] == [VOCAB, 16]
    assert head.proposal_ids is None and head.config.num_proposal_tokens is None  # restored
    assert torch.equal(head.token_ids(torch.tensor([5, 7])), torch.tensor([5, 7]))


def test_machine_keys_name_the_device_the_numerics_and_a_cpus_bfloat16_instructions(monkeypatch):
    from medusa_lib.core.defaults import machine_key, sweep_key

    monkeypatch.setattr("medusa_lib.core.device.cpu_has_native_bf16", lambda: False)
    assert machine_key("cpu", torch.float32) == "cpu-float32" == machine_key(torch.device("cpu"), "float32")
    assert machine_key("cuda:0", torch.bfloat16) == "cuda-bfloat16"
    monkeypatch.setattr("medusa_lib.core.device.cpu_has_native_bf16", lambda: True)
    assert machine_key("cpu", torch.float32) == "cpu-float32-native-bf16"
    assert machine_key("cpu", torch.bfloat16) == "cpu-bfloat16-native-bf16"
    assert machine_key("cuda", "float16") == "cuda-float16"  # a GPU's CPU flags do not matter
    # The first sweeps named no key: read from their dtype and machine line.
    assert (
        sweep_key({"dtype": "float32", "machine": "AMD EPYC, 2 cores, flags: avx2, torch threads 2"}) == "cpu-float32"
    )
    assert sweep_key({"dtype": "bfloat16", "machine": "AMD EPYC, flags: avx2 avx512f avx512_bf16"}) == (
        "cpu-bfloat16-native-bf16"
    )
    assert sweep_key({"key": "cuda-bfloat16", "dtype": "bfloat16"}) == "cuda-bfloat16"


def test_a_tree_swept_on_another_kind_of_machine_is_kept_apart_and_loaded_there_only(tmp_path, monkeypatch):
    """write_tree: the first sweep and any of the same kind of machine set the top-level tree; a sweep on
    another kind goes under tree_sweeps[key], and load_eagle takes it on that kind only."""
    from medusa_lib.pipeline.eagle_tune import write_tree

    model = make_model("llama")
    folder = tmp_path / "eagle"
    new_eagle_head(model, tree=TREE).save(folder)
    monkeypatch.setattr("medusa_lib.core.device.cpu_has_native_bf16", lambda: False)
    here = {"chosen": "2,2,2", "key": "cpu-float32", "rows": []}
    assert write_tree(folder, DynamicTreeConfig(2, 2, 2), here) == "the top-level tree"
    other = {"chosen": "2,3,5", "key": "cpu-float32-native-bf16", "rows": []}
    assert write_tree(folder, DynamicTreeConfig(2, 3, 5), other) == "tree_sweeps['cpu-float32-native-bf16']"
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["top_k"], cfg["depth"], cfg["num_nodes"]) == (2, 2, 2) and cfg["tree_sweep"] == here
    assert cfg["tree_sweeps"] == {"cpu-float32-native-bf16": other}
    assert load_eagle(folder, model=model).config.tree == DynamicTreeConfig(2, 2, 2)  # an AVX2-only CPU
    monkeypatch.setattr("medusa_lib.core.device.cpu_has_native_bf16", lambda: True)
    assert load_eagle(folder, model=model).config.tree == DynamicTreeConfig(2, 3, 5)  # AVX512-BF16, float32
    again = {"chosen": "2,3,6", "key": "cpu-float32", "rows": []}  # the top level's kind again
    assert write_tree(folder, DynamicTreeConfig(2, 3, 6), again) == "the top-level tree"
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_nodes"] == 6 and cfg["tree_sweeps"] == {"cpu-float32-native-bf16": other}
    cfg["tree_sweeps"]["cpu-float32-native-bf16"]["chosen"] = "2,2,9"  # more nodes than top-k 2, depth 2 can give
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EagleError) as err:
        load_eagle(folder, model=model)
    assert "tree_sweeps: The dynamic tree keeps between 1 and 6 nodes" in str(err.value)
    assert str(err.value).endswith("Time the trees again (eagle_tune).")
