"""Training and calibration pipeline on a tiny random model: targets, loss, early stopping, accuracy."""

import torch
from conftest import make_model, random_heads

from medusa_lib import HeadsConfig, MedusaHeads, load_heads
from medusa_lib.pipeline.calibrate import head_accuracy, pick_default, split_prompts
from medusa_lib.pipeline.train import HiddenCache, TrainConfig, Trainer, cached_hidden, frequent_tokens, start_from, train_heads

K = 3


def records(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, 300, (5 + i,), generator=g).tolist()
        # a repetitive answer: learnable structure for the heads
        answer = [(10 + i + j % 4) for j in range(20 + i)]
        out.append({"id": str(i), "prompt_ids": prompt, "answer_ids": answer})
    return out


def test_hidden_cache_targets_are_the_tokens_k_plus_one_ahead():
    model = make_model("llama")
    recs = records(3)
    cache = HiddenCache.build(model, recs, num_heads=K, log=lambda m: None)
    # positions: from the last prompt token to the end, for every sequence
    assert len(cache) == sum(len(r["answer_ids"]) + 1 for r in recs)
    # Cache rows are grouped by sequence (shortest first): find the first sequence's rows.
    seqs = sorted(recs, key=lambda r: len(r["prompt_ids"]) + len(r["answer_ids"]))
    s = seqs[0]["prompt_ids"] + seqs[0]["answer_ids"]
    start = len(seqs[0]["prompt_ids"]) - 1
    with torch.no_grad():
        h = model.base_model(input_ids=torch.tensor([s])).last_hidden_state[0]
    n = len(s) - start
    assert torch.allclose(cache.hidden[:n].float(), h[start:], atol=2e-2)  # stored in bfloat16
    for j, t in enumerate(range(start, len(s))):
        for k in range(1, K + 1):
            want = s[t + k + 1] if t + k + 1 < len(s) else -1
            assert cache.next_ids[j, k - 1].item() == want


def test_hidden_cache_of_an_added_answers_file_runs_only_the_new_answers(tmp_path, monkeypatch):
    model = make_model("llama")
    recs = records(5)
    first = cached_hidden(model, recs[:3], [3], tmp_path, "train", K)
    assert (tmp_path / f"train_hidden_3x{K}.pt").exists()
    built = []
    real_build = HiddenCache.build.__func__
    monkeypatch.setattr(HiddenCache, "build", classmethod(lambda cls, m, r, **kw: built.append(len(r)) or real_build(cls, m, r, **kw)))
    both = cached_hidden(model, recs, [3, 5], tmp_path, "train", K)
    assert built == [2]  # only the added file's answers went through the model
    rest = real_build(HiddenCache, model, recs[3:], num_heads=K, log=lambda m: None)
    want = HiddenCache.concat([first, rest])
    assert len(both) == len(first) + len(rest) == sum(len(r["answer_ids"]) + 1 for r in recs)
    assert torch.equal(both.hidden, want.hidden) and torch.equal(both.next_ids, want.next_ids)
    assert torch.equal(both.seq_end[len(first):], rest.seq_end + len(first))
    again = cached_hidden(model, recs, [3, 5], tmp_path, "train", K)  # now cached whole: nothing runs
    assert built == [2] and torch.equal(again.hidden, both.hidden)
    other = records(5, seed=1)
    other[0]["answer_ids"] = other[0]["answer_ids"][:-3]  # another first file with 3 answers: a cache of 3 answers that does not fit
    (tmp_path / f"train_hidden_5x{K}.pt").unlink()
    rebuilt = cached_hidden(model, other, [3, 5], tmp_path, "train", K)
    assert built == [2, 5] and len(rebuilt) == sum(len(r["answer_ids"]) + 1 for r in other)


def test_frequent_tokens_keeps_eos_and_has_fixed_size():
    recs = records(4)
    ids = frequent_tokens(recs, 8, 320, always=[2])
    assert ids.numel() == 8 and 2 in ids.tolist() and ids.tolist() == sorted(ids.tolist())
    assert set(range(10, 14)) <= set(ids.tolist())  # the answer tokens


def test_training_lowers_held_out_loss_and_saves_the_best_heads(tmp_path):
    model = make_model("llama")
    model.requires_grad_(False)
    train, held = HiddenCache.build(model, records(8, 0), num_heads=K, log=lambda m: None), HiddenCache.build(model, records(3, 1), num_heads=K, log=lambda m: None)
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=K, num_proposal_tokens=64))
    heads.proposal_ids.copy_(frequent_tokens(records(8, 0), 64, 320))
    cfg = TrainConfig(num_heads=K, proposal_tokens=64, batch_size=64, epochs=25, eval_every=25, patience=50, lr=1e-2, soft_weight=0.0)
    before = Trainer(model, heads, cfg, dtype=torch.float32).evaluate(held)
    result = train_heads(model, train, held, heads, cfg, out=tmp_path, log=lambda m: None, base_model="tiny/llama")
    after = result["history"][-1]
    assert after["loss"] < before["loss"] * 0.7
    assert after["top1"][0] > before["top1"][0]
    back = load_heads(tmp_path, model=model)
    assert back.num_heads == K and back.config.num_proposal_tokens == 64
    assert back.config.base_model == "tiny/llama"  # the model trained on, not a fixed name
    assert (tmp_path / "train_state.pt").exists()


def test_head_accuracy_of_identity_heads_is_the_lm_head_hit_rate():
    model = make_model("llama")
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=2))  # identity: every head = lm_head
    recs = records(2)
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


def test_root_ids_are_the_next_tokens_and_the_greedy_pick_at_each_answer_start():
    model = make_model("llama")
    recs = records(3)
    cache = HiddenCache.build(model, recs, num_heads=K, log=lambda m: None)
    roots = cache.root_ids(model.lm_head)
    assert roots.shape == (len(cache),)
    offset = 0
    for r in sorted(recs, key=lambda r: len(r["prompt_ids"]) + len(r["answer_ids"])):  # the cache's order
        s = r["prompt_ids"] + r["answer_ids"]
        start = len(r["prompt_ids"]) - 1
        with torch.no_grad():
            first = model(input_ids=torch.tensor([s[: start + 1]])).logits[0, -1].argmax().item()
        got = roots[offset : offset + len(s) - start].tolist()
        assert got[0] == first  # what the distilled answer would start with
        assert got[1:-1] == s[start + 2 :]  # x_{t+1} inside the sequence
        assert got[-1] == 0  # past the end: no head has a target there
        offset += len(s) - start
    assert offset == len(cache)


def alternating_records(n: int, seed: int) -> list[dict]:
    """Answers of 30 tokens in which every other token is random and the others are a function of
    the token before them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        a = torch.randint(10, 40, (30,), generator=g).tolist()
        answer = [a[0]]
        for j in range(1, 30):
            answer.append(a[j] if j % 2 else 10 + (answer[-1] * 7) % 30)
        out.append({"id": str(i), "prompt_ids": [1, 5 + i], "answer_ids": answer})
    return out


def train_on_alternating_records(tmp_path, **conditioning) -> tuple[dict, MedusaHeads]:
    """Two heads trained on :func:`alternating_records` with ``conditioning`` (root_conditioned /
    path_conditioned): their last held-out evaluation, and the saved heads read back."""
    model = make_model("llama")
    model.requires_grad_(False)
    train, held = (HiddenCache.build(model, alternating_records(n, seed), num_heads=2, log=lambda m: None) for n, seed in ((16, 0), (4, 1)))
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=2, **conditioning))
    cfg = TrainConfig(num_heads=2, proposal_tokens=0, batch_size=64, epochs=30, eval_every=30, patience=50, lr=1e-2, soft_weight=0.0, **conditioning)
    out = tmp_path / "-".join(f"{k}={v}" for k, v in conditioning.items())
    last = train_heads(model, train, held, heads, cfg, out=out, log=lambda m: None)["history"][-1]
    return last, load_heads(out, model=model)


def test_root_conditioned_heads_learn_what_plain_heads_cannot(tmp_path):
    # The answer token after x_{t+1} depends on x_{t+1} only: root-conditioned heads can learn
    # head 1 exactly, so they must beat plain heads trained the same way.
    plain, _ = train_on_alternating_records(tmp_path, root_conditioned=False)
    root, back = train_on_alternating_records(tmp_path, root_conditioned=True)
    assert root["top1"][0] > plain["top1"][0] + 0.1
    assert back.root_conditioned and any(r.weight.abs().sum() > 0 for r in back.root)


def test_path_conditioned_heads_learn_what_root_conditioned_heads_cannot(tmp_path):
    # Every other answer token is a function of the token before it, and the others are random:
    # head 2 (x_{t+3}) can only get the dependent ones right by reading x_{t+2}, its branch token.
    root, _ = train_on_alternating_records(tmp_path, root_conditioned=True, path_conditioned=False)
    path, back = train_on_alternating_records(tmp_path, root_conditioned=True, path_conditioned=True)
    assert path["top1"][1] > root["top1"][1] + 0.2
    assert back.path_conditioned and back.path[1][0].weight.abs().sum() > 0


def test_head_accuracy_gives_path_conditioned_heads_the_true_branch():
    model = make_model("llama")
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, root_conditioned=True, path_conditioned=True))
    seen = []
    real = heads.propose
    heads.propose = lambda h, lm_head, **kw: seen.append((kw["root_emb"], kw["path_emb"])) or real(h, lm_head, **kw)
    recs = records(2)
    head_accuracy(model, heads, recs)
    W = model.get_input_embeddings().weight
    for r, (root, path) in zip(recs, seen):
        s = r["prompt_ids"] + r["answer_ids"]
        start = len(r["prompt_ids"]) - 1
        after = s[start + 1 :] + [0, 0, 0]
        n = len(s) - start
        assert torch.equal(root, W[torch.tensor(after[:n])])  # x_{t+1}
        assert path.shape == (n, 2, 64) and torch.equal(path, W[torch.tensor([[after[i + 1], after[i + 2]] for i in range(n)])])  # x_{t+2}, x_{t+3}


def test_head_accuracy_gives_root_conditioned_heads_the_next_token_as_root():
    model = make_model("llama")
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=2, root_conditioned=True))
    seen = []
    real = heads.propose
    heads.propose = lambda h, lm_head, **kw: seen.append((h.shape[0], kw["root_emb"])) or real(h, lm_head, **kw)
    recs = records(2)
    head_accuracy(model, heads, recs)
    W = model.get_input_embeddings().weight
    for r, (n, emb) in zip(recs, seen):
        s = r["prompt_ids"] + r["answer_ids"]
        start = len(r["prompt_ids"]) - 1
        assert n == len(s) - start and torch.equal(emb, W[torch.tensor(s[start + 1 :] + [0])])  # x_{t+1} after each h_t


def test_calibration_splits_a_category_sorted_prompt_set_into_disjoint_representative_parts():
    from collections import Counter

    # like assets/data/heldout_prompts.jsonl: sorted by category, categories of unequal size
    sizes = {"writing": 70, "roleplay": 70, "math": 60, "coding": 70, "stem": 70, "qa": 60, "translation": 70, "extraction": 60}
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
    speeds = {"calibrated-4": 51.9, "calibrated-5": 52.4, "calibrated-6": 53.1, "calibrated-8": 48.5}  # the root-only heads' calibration (session 4)
    assert pick_default(speeds, nodes, 0.02) == "calibrated-5"
    assert pick_default(speeds, nodes, 0.0) == "calibrated-6"  # no tolerance: the fastest
    assert pick_default(speeds, nodes, 0.5) == "calibrated-4"


def test_init_heads_seeds_root_conditioned_and_deeper_heads_with_plain_ones_and_refuses_other_layouts(tmp_path):
    import pytest
    from conftest import random_heads

    plain = random_heads(3, shared=True, hidden=64, vocab=320)
    plain.save(tmp_path / "plain")
    root = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, root_conditioned=True))
    for r in root.root:
        torch.nn.init.normal_(r.weight)
    start_from(root, tmp_path / "plain")
    assert all(torch.equal(root.heads.state_dict()[k], v) for k, v in plain.heads.state_dict().items())
    # the plain heads carry no root projections: R stays as it was built (zero in training; random here)
    h = torch.randn(4, 64)
    zero = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, root_conditioned=True))
    start_from(zero, tmp_path / "plain")
    assert torch.equal(zero.hidden(h, root_emb=torch.randn(4, 64)), plain.hidden(h))  # starts as the plain heads
    # deeper heads (shared lm_head) start as the given ones: the blocks they add are zero, the identity
    deeper = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, num_layers=3))
    start_from(deeper, tmp_path / "plain")
    assert torch.equal(deeper.hidden(h), plain.hidden(h))
    assert all(torch.count_nonzero(deeper.heads[i][j].linear.weight) == 0 for i in range(3) for j in (1, 2))
    deeper.save(tmp_path / "deeper")
    with pytest.raises(SystemExit, match=r"another layout than this run \(not in this run: heads.0.1.linear.weight"):
        start_from(plain, tmp_path / "deeper")  # never shallower
    own = random_heads(3, shared=False, hidden=64, vocab=320)
    own.save(tmp_path / "own")
    with pytest.raises(SystemExit, match=r"another layout than this run \(missing: heads.0.1.linear.weight"):
        start_from(MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, num_layers=2, shared_lm_head=False)), tmp_path / "own")  # own projections sit after the blocks
    pruned = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, num_proposal_tokens=64))
    with pytest.raises(SystemExit, match="not in this run|missing: proposal_ids"):
        start_from(pruned, tmp_path / "plain")
    with pytest.raises(SystemExit, match="--init-heads: No Medusa heads found"):
        start_from(plain, tmp_path / "nowhere")
    # root-conditioned heads seed path-conditioned ones, which start as them (P = 0)
    for r in zero.root:
        torch.nn.init.normal_(r.weight)
    zero.save(tmp_path / "root")
    path = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, root_conditioned=True, path_conditioned=True))
    start_from(path, tmp_path / "root")
    e, branch = torch.randn(4, 64), torch.randn(4, 2, 64)
    assert torch.equal(path.hidden(h, root_emb=e, path_emb=branch), zero.hidden(h, root_emb=e))


def test_train_cli_refuses_an_unknown_save_dtype(tmp_path):
    import pytest

    from medusa_lib.pipeline.train import main

    with pytest.raises(SystemExit, match="--save-dtype must be float32 or bfloat16 \\(got 'int8'\\)"):
        main(["--save-dtype", "int8", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")])


def test_simulated_accepts_are_what_medusa_greedy_accepts_at_each_step():
    from conftest import OracleHeads

    from medusa_lib import DecodeConfig, build_tree, run_method
    from medusa_lib.pipeline.calibrate import simulated_accepts, simulated_tokens_per_step

    model = make_model("llama")
    prompt = [1, 17, 33, 250, 99]
    answer = run_method(model, prompt, method="plain", config=DecodeConfig(max_new_tokens=60, stop_on_eos=False)).tokens
    heads = OracleHeads(model, prompt + answer)  # proposes the greedy future, at rank 1 now and then
    tree = build_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]])
    record = {"id": "r", "prompt_ids": prompt, "answer_ids": answer}
    sim = simulated_accepts(model, heads, {"t": tree}, [record])["t"][0]
    assert sim.shape == (len(answer),) and sim.max() == 3 and sim.min() == 0  # long runs, and the end of the answer
    res = run_method(model, prompt, method="medusa-greedy", heads=heads, tree=tree, config=DecodeConfig(max_new_tokens=60, stop_on_eos=False))
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

    from medusa_lib.pipeline.calibrate import answer_states

    assert torch.equal(simulated_accepts(model, heads, {"t": tree}, [record], states=answer_states(model, [record]))["t"][0], sim)  # states computed once, as calibrate does
    walked = simulated_tokens_per_step(model, heads, {"t": tree}, [record])["t"]  # the walk decoding takes through the answer
    assert walked == pytest.approx(res.tokens_per_step) and walked != pytest.approx(1 + sim.float().mean().item())


def test_simulation_with_the_lookup_branch_is_what_decoding_accepts():
    import pytest

    from medusa_lib import DecodeConfig, build_tree, run_method
    from medusa_lib.pipeline.calibrate import simulated_accepts, simulated_tokens_per_step

    model = make_model("llama")
    prompt = [5, 6, 7, 8, 5, 6, 7]  # the tiny model's answer soon repeats itself
    answer = run_method(model, prompt, method="plain", config=DecodeConfig(max_new_tokens=80, stop_on_eos=False)).tokens
    heads = random_heads(4, shared=True)  # untrained: nearly everything accepted comes from the lookup branch
    tree = build_tree([[0], [1], [0, 0]])
    record = {"id": "r", "prompt_ids": prompt, "answer_ids": answer}
    alone = simulated_accepts(model, heads, {"t": tree}, [record])["t"][0]
    sim = simulated_accepts(model, heads, {"t": tree}, [record], lookup=4)["t"][0]
    assert (sim >= alone).all() and sim.max() == 4 and sim.sum() > alone.sum()
    res = run_method(model, prompt, method="medusa-greedy", heads=heads, tree=tree, config=DecodeConfig(max_new_tokens=80, stop_on_eos=False, lookup=4))
    assert res.tokens == answer and res.lookup_tokens > 0
    emitted, checked = len(res.steps[0].tokens), 0
    for step in res.steps[1:-1]:
        root = emitted - 1
        if root + 4 < len(answer) - 1:
            assert step.accept_length == int(sim[root]), step.index
            checked += 1
        emitted += len(step.tokens)
    assert checked >= 10
    assert simulated_tokens_per_step(model, heads, {"t": tree}, [record], lookup=4)["t"] == pytest.approx(res.tokens_per_step)


def test_calibration_speed_is_the_median_of_speed_ups_paired_by_prompt(monkeypatch):
    from types import SimpleNamespace

    import medusa_lib.pipeline.calibrate as cal

    # tokens/s by (decoder, prompt): the tree is 3x plain on the short prompt and 1.5x on the long one
    rates = {("plain", 1): 10.0, ("plain", 2): 40.0, ("tree", 1): 30.0, ("tree", 2): 60.0}

    class FakeDecoder:
        def __init__(self, model, *, method, config, heads=None, tree=None):
            self.name = "plain" if method == "plain" else "tree"

        def run(self, ids):
            return SimpleNamespace(tokens_per_second=rates.get((self.name, len(ids)), 1.0), tokens_per_step=1.0 if self.name == "plain" else 2.5)

    monkeypatch.setattr(cal, "Decoder", FakeDecoder)
    out = cal.measure(None, None, {"tree": None}, [[7], [7, 8]], max_new_tokens=4, repeats=2)
    assert out["plain"]["speedup"] == 1.0 and out["tree"]["tokens_per_step"] == 2.5
    assert out["tree"]["speedup"] == 2.25  # median of 3.0, 3.0, 1.5, 1.5 (a ratio of medians would say 45 / 25 = 1.8)
    assert out["tree"]["tok_s"] == 45.0
