"""REST, the fourth drafter (core/drafters/rest.py): retrieval, its token tree, exactness on every
engine and rule, and its place on the page, the API and the bench, read from the registry."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import PROMPT, make_model, random_heads, tiny_tokenizer

from medusa_lib import DecodeConfig
from medusa_lib.core.compose import make_decoder
from medusa_lib.core.drafters import REGISTRY
from medusa_lib.core.drafters.rest import Datastore, RestDrafter, read_datastore, token_tree, write_datastore

IDS = [5, 6, 7, 8, 9, 10, 11, 12]


def plain(model, ids, n, **kw):
    return make_decoder(model, config=DecodeConfig(max_new_tokens=n, stop_on_eos=False, **kw)).run(ids).tokens


@pytest.fixture(scope="module")
def llama():
    return make_model("llama")


@pytest.fixture(scope="module")
def store(llama):
    """A datastore that holds the tiny model's own greedy continuation of IDS (so drafts get
    accepted), among unrelated sequences."""
    answer = plain(llama, IDS, 60)
    g = torch.Generator().manual_seed(3)
    noise = [torch.randint(3, 320, (40,), generator=g).tolist() for _ in range(20)]
    return Datastore(torch.tensor([t for s in [*noise, IDS + answer] for t in (*s, -1)]), vocab_size=320)


def test_the_longest_suffix_found_decides_and_its_continuations_come_back():
    store = Datastore(torch.tensor([1, 2, 3, 4, -1, 9, 2, 3, 5, 6, -1, 2, 3, 7]), vocab_size=16)
    # the suffix (1, 2, 3) occurs once: only its continuation, cut at the sequence's end
    assert store.continuations([1, 2, 3], depth=3) == [(4,)]
    # (2, 3) alone occurs three times, the latest first; a sequence's end cuts a continuation
    assert store.continuations([8, 2, 3], depth=2) == [(7,), (5, 6), (4,)]
    assert store.continuations([2, 9], depth=2) == [] and store.continuations([3], depth=2) == []


def test_the_token_tree_keeps_the_most_frequent_prefixes_parents_first():
    paths = [(5, 6, 7), (5, 6, 8), (5, 9), (4,)]
    choices, tokens = token_tree(paths, nodes=4)
    # (5) 3 times, then (5, 6) twice, then ties by first occurrence: (4) before (5, 9) and (5, 6, 7)
    assert dict(zip(choices, tokens)) == {(0,): 5, (1,): 4, (0, 0): 6, (0, 1): 9}
    assert choices == sorted(choices, key=lambda c: (len(c), c))
    assert token_tree([], nodes=4) == ([], [])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("lookup", [0, 3])
def test_rest_greedy_equals_plain_greedy_and_generate(llama, store, cache, lookup):
    n = 40
    ref = llama.generate(torch.tensor([IDS]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    cfg = DecodeConfig(max_new_tokens=n, stop_on_eos=False, cache=cache, lookup=lookup)
    run = make_decoder(llama, method="medusa-greedy", drafter=RestDrafter(store), config=cfg).run(IDS)
    assert run.tokens == plain(llama, IDS, n) == ref[0, len(IDS) :].tolist()
    assert {s.drafter for s in run.steps[1:]} == {"rest"}
    # the datastore holds the answer: REST drafts it, several tokens a step
    assert run.tokens_per_step > 2.0 and max(s.draft_tokens for s in run.steps) <= 12 + lookup


@pytest.mark.parametrize("seed", [0, 1])
def test_rest_exact_sampling_equals_plain_sampling(llama, store, seed):
    kw = dict(temperature=0.9, seed=seed)
    cfg = DecodeConfig(max_new_tokens=40, stop_on_eos=False, **kw)
    run = make_decoder(llama, method="medusa-sample", drafter=RestDrafter(store), config=cfg).run(IDS)
    assert run.tokens == plain(llama, IDS, 40, **kw)


def test_rest_runs_with_the_dynamic_cache_and_says_so(llama, store):
    dec = make_decoder(llama, method="medusa-greedy", drafter=RestDrafter(store), config=DecodeConfig(cache="static"))
    assert not dec.static and "REST drafter runs with the dynamic cache only" in dec.note


def test_beside_rest_the_lookup_chain_stands_alone_where_the_datastore_has_nothing(llama):
    """A step where REST retrieves nothing still verifies the lookup chain under the root."""
    empty = Datastore(torch.tensor([300, 301, 302]), vocab_size=320)
    loop = [5, 6, 7, 8, 9] * 4
    cfg = DecodeConfig(max_new_tokens=30, stop_on_eos=False, lookup=3)
    run = make_decoder(llama, method="medusa-greedy", drafter=RestDrafter(empty), config=cfg).run(loop)
    assert run.tokens == plain(llama, loop, 30) and run.lookup_tokens > 0
    assert all(s.tree.num_nodes == 1 + s.tree.lookup for s in run.steps[1:] if s.draft_depth)


def test_a_damaged_datastore_is_left_out_with_one_sentence(tmp_path, llama):
    random_heads(4).save(tmp_path / "heads")
    write_datastore(tmp_path / "heads-rest", [[5, 6, 7]], vocab_size=320)
    got = RestDrafter.load(llama, folder=tmp_path / "heads")
    assert got.state is not None
    (tmp_path / "heads-rest" / "datastore.safetensors").write_bytes(b"\x00" * 40)
    read_datastore.cache_clear()
    got = RestDrafter.load(llama, folder=tmp_path / "heads")
    assert got.state is None and got.note.startswith("The REST datastore beside the Medusa heads could not be read (")
    write_datastore(tmp_path / "heads-rest", [[5, 6, 999]], vocab_size=320)
    read_datastore.cache_clear()
    assert RestDrafter.load(llama, folder=tmp_path / "heads").note == (
        "The REST datastore beside the Medusa heads is left out: its tokens are not ids of this vocabulary "
        "(0 to 319, -1 between answers)."
    )


def test_an_option_for_a_drafter_that_takes_none_is_refused():
    from medusa_lib.present.drafter_files import check_options

    with pytest.raises(
        ValueError, match=r"^The REST \(retrieval\) drafter takes no option \(got 'x'\); only eagle takes one\.$"
    ):
        check_options({"rest": "x"}, folder=None)


def test_a_bad_tree_size_gets_one_sentence(store):
    with pytest.raises(ValueError, match=r"^REST drafts 1 to 64 nodes, 1 to 8 deep \(got 0 nodes, depth 4\)\.$"):
        RestDrafter(store, nodes=0)


def test_the_shipped_datastore_is_the_training_answers_and_fits_the_default_model_only():
    from pathlib import Path

    folder = Path("assets/heads/smollm2-135m-instruct-rest")
    about = json.loads((folder / "config.json").read_text())
    assert about["vocab_size"] == 49152 and about["sequences"] == 7838 and "held-out" in about["left_out"]
    store = read_datastore(str(folder), 49152)
    assert int((store.tokens == -1).sum()) == about["sequences"] and store.tokens.numel() == 785583 + 7838
    with pytest.raises(ValueError, match="built for a vocabulary of 49,152 tokens, this model has 320"):
        read_datastore(str(folder), 320)


# ------------------------------------------------------------------ the page, the API and the bench
@pytest.fixture(scope="module")
def folders(tmp_path_factory, llama, store):
    """A tiny model folder, heads, and a REST datastore beside them (``<heads>-rest``)."""
    root = tmp_path_factory.mktemp("rest")
    llama.save_pretrained(root / "model")
    tiny_tokenizer().save_pretrained(root / "model")
    random_heads(4).save(root / "heads")
    seqs = store.tokens.tolist()
    cut = [i for i, t in enumerate(seqs) if t == -1]
    write_datastore(root / "heads-rest", [seqs[a + 1 : b] for a, b in zip([-1, *cut], cut)], vocab_size=320)
    return root


def test_rest_is_on_the_page_and_the_api_when_its_datastore_ships(folders):
    from medusa_lib.present import Playground, Settings
    from ui.handlers import Handlers

    pg = Playground.load(model=str(folders / "model"), heads=folders / "heads", device="cpu", dtype="float32")
    assert pg.drafters.available == ("medusa", "lookup", "rest") and pg.drafters.default == "medusa"
    out = pg.compare(PROMPT, Settings(max_new_tokens=12, drafter="rest"))
    assert out["drafter"] == "rest" and out["greedy_match"]["equal"]
    assert out["tree"] == "rest-retrieved (up to 12 nodes, depth 4)"
    assert out["methods"]["medusa-greedy"]["drafter"] == "rest" and out["summary"][1]["drafter"] == "REST (retrieval)"
    tree, custom, note = Handlers(pg).drafter_choice("rest")
    assert tree["interactive"] is False and custom["interactive"] is False
    assert "REST retrieves a tree of up to 12 tokens" in note["value"]
    # without the datastore it is not offered, and asking for it says what the server has
    bare = Playground.load(model=str(folders / "model"), heads=None, device="cpu", dtype="float32")
    assert "rest" not in bare.drafters.available
    with pytest.raises(ValueError, match=r"^This server has no REST \(retrieval\) for its model, so the drafter must"):
        bare.prepare(PROMPT, Settings(drafter="rest"))


def test_the_bench_runs_rest_from_the_registry_and_it_stays_exact(folders, tmp_path, capsys):
    from medusa_lib.pipeline import bench
    from medusa_lib.pipeline.bench_args import ALL_METHODS, SAMPLED_METHODS

    assert {"rest-greedy", "rest-sample", "rest-typical"} <= set(ALL_METHODS) and "rest-sample" in SAMPLED_METHODS
    prompts = [{"id": "a-1", "category": "alpha", "prompt": PROMPT}]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    argv = [
        "--model",
        str(folders / "model"),
        "--heads",
        str(folders / "heads"),
        "--prompts",
        str(tmp_path / "prompts.jsonl"),
    ]
    argv += ["--methods", "hf-generate,baseline,rest-greedy,plain-sample,rest-sample", "--temperature", "0.8"]
    argv += ["--dtype", "float32", "--device", "cpu", "--max-new-tokens", "16", "--repeats", "1"]
    bench.main([*argv, "--json", str(tmp_path / "out.json")])
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "out.json").read_text())
    by = {r["method"]: r["output_token_ids"] for r in data["records"]}
    assert by["rest-greedy"] == by["hf-generate"] and by["rest-sample"] == by["plain-sample"]
    assert re.search(r"^\s+rest-greedy\s+1/1$", printed, re.M)


def test_every_registered_drafter_is_one_complete_unit():
    """What the page, the API and the bench read of a drafter, for every drafter in the registry."""
    assert list(REGISTRY) == ["medusa", "eagle", "lookup", "rest"]
    for name, cls in REGISTRY.items():
        assert cls.name == name and cls.label and cls.drafted_by and cls.teach, name
        assert cls.levels in ("head", "depth") and isinstance(cls.tree_controls, bool)
