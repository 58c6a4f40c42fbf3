"""Calibration on tiny models: head accuracy, the simulation of accepts against real decoding, the tree pick,
the CLI end to end."""

import json

import torch
from conftest import answer_records, make_model, random_heads, tiny_tokenizer

from medusa_lib import HeadsConfig, MedusaHeads, load_heads
from medusa_lib.core.compose import run_method
from medusa_lib.pipeline import calibrate
from medusa_lib.pipeline.calibrate import split_prompts
from medusa_lib.pipeline.calibrate_accuracy import head_accuracy
from medusa_lib.pipeline.calibrate_timing import pick_default


def calibration_case(tmp_path) -> list[str]:
    """A tiny llama, random heads and 8 prompts on disk; the calibrate arguments that use them."""
    model = make_model("llama")
    model.generation_config.eos_token_id = None  # random models hit EOS at random: full-length answers
    model.save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    random_heads(3, shared=True).save(tmp_path / "heads")
    prompts = [
        {"id": f"p-{i}", "category": "c", "prompt": f"w{10 + i} w{11 + i} w{12 + i} w{10 + i} w{11 + i}"}
        for i in range(8)
    ]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return [
        "--heads",
        str(tmp_path / "heads"),
        "--model",
        str(tmp_path / "model"),
        "--prompts",
        str(tmp_path / "prompts.jsonl"),
        "--device",
        "cpu",
        "--acc-prompts",
        "5",
        "--speed-prompts",
        "2",
        "--max-new-tokens",
        "24",
        "--sizes",
        "2,4",
        "--lookup",
        "3",
        "--write",
    ]


def test_calibrate_writes_trees_the_default_and_the_lookup_length(tmp_path, capsys):
    calibrate.main([*calibration_case(tmp_path), "--dtype", "float32"])
    model = make_model("llama")
    printed = capsys.readouterr().out
    trees = json.loads((tmp_path / "heads" / "trees.json").read_text())
    cfg = json.loads((tmp_path / "heads" / "config.json").read_text())
    assert set(trees) == {"calibrated-2", "calibrated-4"} and [
        len(trees[n]) for n in ("calibrated-2", "calibrated-4")
    ] == [2, 4]
    assert cfg["default_tree"] in trees and cfg["lookup"] == 3 == cfg["calibration"]["lookup"]
    assert (
        cfg["calibration"]["device"] == f"CPU, {torch.get_num_threads()} threads"
        and cfg["calibration"]["device_kind"] == "cpu"
    )
    assert (
        cfg["calibration"]["engine"] == "dynamic KV cache (eager)"
    )  # timed on the engine the playground runs on a CPU
    assert (
        cfg["calibration"]["default_tree"] == cfg["default_tree"] and "calibrations" not in cfg
    )  # the first calibration: the top level
    assert not list((tmp_path / "heads").glob("*.tmp"))
    rows = cfg["calibration"]["trees"]
    for name in trees:
        r = rows[name]
        assert (
            r["simulated_tokens_per_step"] > r["heads_only_simulated_tokens_per_step"] >= 1.0
        )  # the branch is one more path, and these answers repeat
        assert r["measured_tokens_per_step"] >= 1.0 and r["speedup"] > 0
    assert "trees + lookup-3" in printed and f"default_tree={cfg['default_tree']} and lookup=3" in printed
    heads = load_heads(tmp_path / "heads", model=model)
    assert heads.lookup == 3 and heads.default_tree == cfg["default_tree"] and heads.tree_presets == trees


def test_a_calibration_in_other_numerics_keeps_the_trees_and_its_own_record(tmp_path, capsys):
    """float32 first (the top level), then bfloat16 with --keep-trees: the stored trees are timed as they
    are, the bfloat16 record goes to calibrations.cpu-bfloat16, and each numerics gets its own record."""
    from medusa_lib import heads_defaults

    args = calibration_case(tmp_path)
    calibrate.main([*args, "--dtype", "float32"])
    folder = tmp_path / "heads"
    trees = json.loads((folder / "trees.json").read_text())
    trees["calibrated-4"] = [[0], [0, 0], [0, 0, 0], [1]]  # not what this run's accuracies would grow
    (folder / "trees.json").write_text(json.dumps(trees))
    first = json.loads((folder / "config.json").read_text())["calibration"]
    capsys.readouterr()
    calibrate.main([*args, "--dtype", "bfloat16", "--keep-trees"])
    printed = capsys.readouterr().out
    cfg = json.loads((folder / "config.json").read_text())
    assert json.loads((folder / "trees.json").read_text()) == trees  # timed as stored
    assert "kept from trees.json: calibrated-2, calibrated-4" in printed
    assert cfg["calibration"] == first and set(cfg["calibrations"]) == {"cpu-bfloat16"}
    bf16 = cfg["calibrations"]["cpu-bfloat16"]
    assert bf16["dtype"] == "torch.bfloat16" and set(bf16["trees"]) == {"calibrated-2", "calibrated-4"}
    assert "calibrations.cpu-bfloat16 of config.json; the top-level cpu-float32 calibration is kept" in printed
    heads = load_heads(folder)
    for numerics, record in (("float32", first), ("bfloat16", bf16), ("torch.bfloat16", bf16), (None, first)):
        d = heads_defaults(heads, "cpu", numerics)
        assert (d.tree, d.calibration, d.note) == (record["default_tree"], record, None)


def test_head_accuracy_of_identity_heads_is_the_lm_head_hit_rate():
    model = make_model("llama")
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=2))  # identity: every head = lm_head
    recs = answer_records(2)
    acc = head_accuracy(model, heads, recs)
    assert acc.shape == (2, 10) and torch.all(acc >= 0) and torch.all(acc.sum(1) <= 1 + 1e-6)
    hits = total = 0
    for r in recs:
        s = r["prompt_ids"] + r["answer_ids"]
        start = len(r["prompt_ids"]) - 1
        with torch.no_grad():
            pred = model(input_ids=torch.tensor([s])).logits[0].argmax(-1)
        for t in range(start, len(s) - 2):  # head 1 at t predicts x_{t+2}
            hits += int(pred[t] == s[t + 2])
            total += 1
    assert abs(acc[0, 0].item() - hits / total) < 1e-6


def test_head_accuracy_gives_path_conditioned_heads_the_true_branch():
    model = make_model("llama")
    heads = MedusaHeads(
        HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, root_conditioned=True, path_conditioned=True)
    )
    seen = []
    real = heads.propose
    heads.propose = lambda h, lm_head, **kw: seen.append((kw["root_emb"], kw["path_emb"])) or real(h, lm_head, **kw)
    recs = answer_records(2)
    head_accuracy(model, heads, recs)
    W = model.get_input_embeddings().weight
    for r, (root, path) in zip(recs, seen):
        s = r["prompt_ids"] + r["answer_ids"]
        start = len(r["prompt_ids"]) - 1
        after = s[start + 1 :] + [0, 0, 0]
        n = len(s) - start
        assert torch.equal(root, W[torch.tensor(after[:n])])  # x_{t+1}
        assert path.shape == (n, 2, 64) and torch.equal(
            path, W[torch.tensor([[after[i + 1], after[i + 2]] for i in range(n)])]
        )  # x_{t+2}, x_{t+3}


def test_head_accuracy_gives_root_conditioned_heads_the_next_token_as_root():
    model = make_model("llama")
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=2, root_conditioned=True))
    seen = []
    real = heads.propose
    heads.propose = lambda h, lm_head, **kw: seen.append((h.shape[0], kw["root_emb"])) or real(h, lm_head, **kw)
    recs = answer_records(2)
    head_accuracy(model, heads, recs)
    W = model.get_input_embeddings().weight
    for r, (n, emb) in zip(recs, seen):
        s = r["prompt_ids"] + r["answer_ids"]
        start = len(r["prompt_ids"]) - 1
        assert n == len(s) - start and torch.equal(emb, W[torch.tensor(s[start + 1 :] + [0])])  # x_{t+1} after each h_t


def test_calibration_splits_a_category_sorted_prompt_set_into_disjoint_representative_parts():
    from collections import Counter

    # like assets/data/heldout_prompts.jsonl: sorted by category, categories of unequal size
    sizes = {
        "writing": 70,
        "roleplay": 70,
        "math": 60,
        "coding": 70,
        "stem": 70,
        "qa": 60,
        "translation": 70,
        "extraction": 60,
    }
    prompts = [{"id": f"{c}-{i}", "category": c} for c, n in sizes.items() for i in range(n)]
    acc, speed = split_prompts(prompts, 300, 8)
    assert len(acc) == 300 and len(speed) == 8
    assert not {p["id"] for p in acc} & {p["id"] for p in speed}
    assert Counter(p["category"] for p in speed) == Counter(sizes.keys())  # one speed prompt per category
    counts = Counter(p["category"] for p in acc)
    for c, n in sizes.items():  # every category in proportion (300 of 530)
        assert abs(counts[c] - n * 300 / 530) <= 1.5, (c, counts[c])
    acc, speed = split_prompts(prompts[:20], 300, 30)  # fewer prompts than asked: all of them, still disjoint
    assert len(speed) == 20 and acc == []


def test_default_tree_is_the_smallest_within_the_tie_of_the_fastest():
    nodes = {"calibrated-4": 5, "calibrated-5": 6, "calibrated-6": 7, "calibrated-8": 9}
    speeds = {
        "calibrated-4": 51.9,
        "calibrated-5": 52.4,
        "calibrated-6": 53.1,
        "calibrated-8": 48.5,
    }  # the root-only heads' calibration (session 4)
    assert pick_default(speeds, nodes, 0.02) == "calibrated-5"
    assert pick_default(speeds, nodes, 0.0) == "calibrated-6"  # no tolerance: the fastest
    assert pick_default(speeds, nodes, 0.5) == "calibrated-4"


def test_simulated_accepts_are_what_medusa_greedy_accepts_at_each_step():
    from conftest import OracleHeads

    from medusa_lib import DecodeConfig, build_tree
    from medusa_lib.pipeline.calibrate_sim import simulated_accepts, simulated_tokens_per_step

    model = make_model("llama")
    prompt = [1, 17, 33, 250, 99]
    answer = run_method(model, prompt, method="plain", config=DecodeConfig(max_new_tokens=60, stop_on_eos=False)).tokens
    heads = OracleHeads(model, prompt + answer)  # proposes the greedy future, at rank 1 now and then
    tree = build_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]])
    record = {"id": "r", "prompt_ids": prompt, "answer_ids": answer}
    sim = simulated_accepts(model, heads, {"t": tree}, [record])["t"][0]
    assert sim.shape == (len(answer),) and sim.max() == 3 and sim.min() == 0  # long runs, and the end of the answer
    res = run_method(
        model,
        prompt,
        method="medusa-greedy",
        heads=heads,
        tree=tree,
        config=DecodeConfig(max_new_tokens=60, stop_on_eos=False),
    )
    assert res.tokens == answer
    emitted, checked = len(res.steps[0].tokens), 0
    for step in res.steps[1:-1]:  # (the last step is cut at max_new_tokens)
        root = emitted - 1  # the step's root is answer[root]: the simulation's position root
        if root + tree.depth < len(answer) - 1:
            assert step.accept_length == int(sim[root]), step.index
            checked += 1
        emitted += len(step.tokens)
    assert checked >= 10
    import pytest

    from medusa_lib.pipeline.calibrate_accuracy import answer_states

    assert torch.equal(
        simulated_accepts(model, heads, {"t": tree}, [record], states=answer_states(model, [record]))["t"][0], sim
    )  # states computed once, as calibrate does
    walked = simulated_tokens_per_step(model, heads, {"t": tree}, [record])[
        "t"
    ]  # the walk decoding takes through the answer
    assert walked == pytest.approx(res.tokens_per_step) and walked != pytest.approx(1 + sim.float().mean().item())


def test_simulation_with_the_lookup_branch_is_what_decoding_accepts():
    import pytest

    from medusa_lib import DecodeConfig, build_tree
    from medusa_lib.pipeline.calibrate_sim import simulated_accepts, simulated_tokens_per_step

    model = make_model("llama")
    prompt = [5, 6, 7, 8, 5, 6, 7]  # the tiny model's answer soon repeats itself
    answer = run_method(model, prompt, method="plain", config=DecodeConfig(max_new_tokens=80, stop_on_eos=False)).tokens
    heads = random_heads(4, shared=True)  # untrained: nearly everything accepted comes from the lookup branch
    tree = build_tree([[0], [1], [0, 0]])
    record = {"id": "r", "prompt_ids": prompt, "answer_ids": answer}
    alone = simulated_accepts(model, heads, {"t": tree}, [record])["t"][0]
    sim = simulated_accepts(model, heads, {"t": tree}, [record], lookup=4)["t"][0]
    assert (sim >= alone).all() and sim.max() == 4 and sim.sum() > alone.sum()
    res = run_method(
        model,
        prompt,
        method="medusa-greedy",
        heads=heads,
        tree=tree,
        config=DecodeConfig(max_new_tokens=80, stop_on_eos=False, lookup=4),
    )
    assert res.tokens == answer and res.lookup_tokens > 0
    emitted, checked = len(res.steps[0].tokens), 0
    for step in res.steps[1:-1]:
        root = emitted - 1
        if root + 4 < len(answer) - 1:
            assert step.accept_length == int(sim[root]), step.index
            checked += 1
        emitted += len(step.tokens)
    assert checked >= 10
    assert simulated_tokens_per_step(model, heads, {"t": tree}, [record], lookup=4)["t"] == pytest.approx(
        res.tokens_per_step
    )


def test_calibration_speed_is_the_median_of_speed_ups_paired_by_prompt(monkeypatch):
    from types import SimpleNamespace

    import medusa_lib.pipeline.calibrate_timing as cal

    # tokens/s by (decoder, prompt): the tree is 3x plain on the short prompt and 1.5x on the long one
    rates = {("plain", 1): 10.0, ("plain", 2): 40.0, ("tree", 1): 30.0, ("tree", 2): 60.0}

    class FakeDecoder:
        def __init__(self, model, *, method, config, heads=None, tree=None, static_kv=None):
            self.name = "plain" if method == "plain" else "tree"

        def run(self, ids):
            return SimpleNamespace(
                tokens_per_second=rates.get((self.name, len(ids)), 1.0),
                tokens_per_step=1.0 if self.name == "plain" else 2.5,
            )

    monkeypatch.setattr(cal, "make_decoder", FakeDecoder)
    out = cal.measure(None, None, {"tree": None}, [[7], [7, 8]], max_new_tokens=4, repeats=2)
    assert out["plain"]["speedup"] == 1.0 and out["tree"]["tokens_per_step"] == 2.5
    assert out["tree"]["speedup"] == 2.25  # median of 3.0, 3.0, 1.5, 1.5 (a ratio of medians would say 45 / 25 = 1.8)
    assert out["tree"]["tok_s"] == 45.0


def test_a_calibration_on_another_device_kind_joins_the_first_one(tmp_path):
    """The shipped heads (calibrated on a CPU, before records named their device kind) plus a CUDA
    calibration: the CUDA record goes to calibrations.cuda, the CPU one stays, trees.json gains the
    new trees; a second CPU calibration replaces the top level and keeps the CUDA record."""
    import shutil
    from pathlib import Path

    from medusa_lib import heads_defaults
    from medusa_lib.pipeline.calibrate_record import write_calibration

    folder = tmp_path / "heads"
    shutil.copytree(Path(__file__).resolve().parents[1] / "assets/heads/smollm2-135m-instruct", folder)
    before, stored = json.loads((folder / "config.json").read_text()), json.loads((folder / "trees.json").read_text())
    assert "device_kind" not in before["calibration"]  # a legacy record: made on a CPU
    wide = [
        [0],
        [1],
        [2],
        [3],
        [4],
        [5],
        [6],
        [7],
        [0, 0],
        [0, 1],
        [1, 0],
        [0, 0, 0],
        [0, 0, 1],
        [0, 0, 0, 0],
        [0, 2],
        [2, 0],
        [1, 1],
    ]
    cuda = {
        "default_tree": "calibrated-17",
        "lookup": 0,
        "device": "NVIDIA H100 80GB HBM3",
        "device_kind": "cuda",
        "dtype": "torch.bfloat16",
        "trees": {"calibrated-12": {"nodes": 13, "speedup": 2.1}, "calibrated-17": {"nodes": 18, "speedup": 2.4}},
    }
    said: list[str] = []
    where = write_calibration(
        folder, cuda, {"calibrated-12": stored["calibrated-12"], "calibrated-17": wide}, say=said.append
    )
    cfg, trees = json.loads((folder / "config.json").read_text()), json.loads((folder / "trees.json").read_text())
    assert where == "calibrations.cuda-bfloat16 of config.json; the top-level cpu-bfloat16 calibration is kept"
    assert said == [
        f"wrote {folder / 'trees.json'}, default_tree=calibrated-17 and lookup=0 (CUDA bfloat16 calibration: {where})"
    ]
    # shipped: the float32 CPU record beside the bfloat16 one, and an H200's, which a new CUDA bfloat16 one replaces
    assert set(before["calibrations"]) == {"cpu-float32", "cuda-bfloat16"}
    others = {k: v for k, v in before["calibrations"].items() if k != "cuda-bfloat16"}
    assert others["cpu-float32"]["dtype"] == "torch.float32"
    assert {k: v for k, v in cfg.items() if k != "calibrations"} == {
        k: v for k, v in before.items() if k != "calibrations"
    } and cfg["calibrations"] == {**others, "cuda-bfloat16": cuda}  # the CPU records untouched
    assert trees == {**stored, "calibrated-17": wide} and list(trees) == sorted(
        trees, key=lambda n: len(trees[n])
    )  # the union, smallest first
    heads = load_heads(folder)
    assert heads.calibrations == {**others, "cuda-bfloat16": cuda} and heads.tree_presets == trees
    on_gpu, on_cpu = heads_defaults(heads, "cuda:0"), heads_defaults(heads, "cpu")
    assert (on_gpu.tree, on_gpu.lookup_length, on_gpu.calibration, on_gpu.note) == ("calibrated-17", 0, cuda, None)
    assert (on_cpu.tree, on_cpu.lookup_length, on_cpu.calibration, on_cpu.note) == (
        before["default_tree"],
        before["lookup"],
        before["calibration"],
        None,
    )
    in_f32 = heads_defaults(heads, "cpu", "float32")  # the page's numerics: its own record
    assert (in_f32.tree, in_f32.calibration, in_f32.note) == (
        others["cpu-float32"]["default_tree"],
        others["cpu-float32"],
        None,
    )

    # CUDA again, with other choices under a name already stored: the newer ones win, and it is said
    said.clear()
    write_calibration(folder, {**cuda, "default_tree": "calibrated-12"}, {"calibrated-12": wide[:12]}, say=said.append)
    cfg, trees = json.loads((folder / "config.json").read_text()), json.loads((folder / "trees.json").read_text())
    assert (
        cfg["calibrations"]["cuda-bfloat16"]["default_tree"] == "calibrated-12"
        and cfg["calibration"] == before["calibration"]
    )
    assert trees["calibrated-12"] == wide[:12] and trees["calibrated-5"] == stored["calibrated-5"]
    assert said[0].startswith(
        "note: calibrated-12 in trees.json had other choices from an earlier calibration; kept this one's"
    )

    # CPU again: the top level is replaced (with its kind now named), the CUDA record stays
    cpu = {**before["calibration"], "default_tree": "calibrated-4", "lookup": 3, "device_kind": "cpu"}
    assert (
        write_calibration(folder, cpu, {"calibrated-4": stored["calibrated-4"]}, say=said.append)
        == "the top level of config.json"
    )
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["default_tree"], cfg["lookup"], cfg["calibration"]) == ("calibrated-4", 3, cpu) and set(
        cfg["calibrations"]
    ) == {"cuda-bfloat16", "cpu-float32"}
    assert not list(folder.glob("*.tmp"))

    # a record under an older name (the device kind alone) is replaced, not kept beside the new one
    cfg["calibrations"] = {"cuda": cuda, "cpu-float32": others["cpu-float32"]}
    (folder / "config.json").write_text(json.dumps(cfg))
    write_calibration(folder, {**cuda, "default_tree": "calibrated-4"}, {}, say=said.append)
    cfg = json.loads((folder / "config.json").read_text())
    assert set(cfg["calibrations"]) == {"cuda-bfloat16", "cpu-float32"}
    assert cfg["calibrations"]["cuda-bfloat16"]["default_tree"] == "calibrated-4"
