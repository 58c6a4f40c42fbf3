"""Head training on a tiny random model: targets, hidden-state caches, loss, early stopping, conditioning,
--init-heads."""

import torch
from conftest import answer_records, make_model

from medusa_lib import HeadsConfig, MedusaHeads, load_heads
from medusa_lib.pipeline.hidden_cache import HiddenCache, cached_hidden, frequent_tokens
from medusa_lib.pipeline.medusa_trainer import TrainConfig, Trainer, train_heads
from medusa_lib.pipeline.train import start_from

K = 3


def test_hidden_cache_targets_are_the_tokens_k_plus_one_ahead():
    model = make_model("llama")
    recs = answer_records(3)
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
    recs = answer_records(5)
    first = cached_hidden(model, recs[:3], [3], tmp_path, "train", K)
    assert (tmp_path / f"train_hidden_3x{K}.pt").exists()
    built = []
    real_build = HiddenCache.build.__func__
    monkeypatch.setattr(
        HiddenCache, "build", classmethod(lambda cls, m, r, **kw: built.append(len(r)) or real_build(cls, m, r, **kw))
    )
    both = cached_hidden(model, recs, [3, 5], tmp_path, "train", K)
    assert built == [2]  # only the added file's answers went through the model
    rest = real_build(HiddenCache, model, recs[3:], num_heads=K, log=lambda m: None)
    want = HiddenCache.concat([first, rest])
    assert len(both) == len(first) + len(rest) == sum(len(r["answer_ids"]) + 1 for r in recs)
    assert torch.equal(both.hidden, want.hidden) and torch.equal(both.next_ids, want.next_ids)
    assert torch.equal(both.seq_end[len(first) :], rest.seq_end + len(first))
    again = cached_hidden(model, recs, [3, 5], tmp_path, "train", K)  # now cached whole: nothing runs
    assert built == [2] and torch.equal(again.hidden, both.hidden)
    other = answer_records(5, seed=1)
    other[0]["answer_ids"] = other[0]["answer_ids"][
        :-3
    ]  # another first file with 3 answers: a cache of 3 answers that does not fit
    (tmp_path / f"train_hidden_5x{K}.pt").unlink()
    rebuilt = cached_hidden(model, other, [3, 5], tmp_path, "train", K)
    assert built == [2, 5] and len(rebuilt) == sum(len(r["answer_ids"]) + 1 for r in other)


def test_frequent_tokens_keeps_eos_and_has_fixed_size():
    recs = answer_records(4)
    ids = frequent_tokens(recs, 8, 320, always=[2])
    assert ids.numel() == 8 and 2 in ids.tolist() and ids.tolist() == sorted(ids.tolist())
    assert set(range(10, 14)) <= set(ids.tolist())  # the answer tokens


def test_training_lowers_held_out_loss_and_saves_the_best_heads(tmp_path):
    model = make_model("llama")
    model.requires_grad_(False)
    train, held = (
        HiddenCache.build(model, answer_records(8, 0), num_heads=K, log=lambda m: None),
        HiddenCache.build(model, answer_records(3, 1), num_heads=K, log=lambda m: None),
    )
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=K, num_proposal_tokens=64))
    heads.proposal_ids.copy_(frequent_tokens(answer_records(8, 0), 64, 320))
    cfg = TrainConfig(
        num_heads=K, proposal_tokens=64, batch_size=64, epochs=25, eval_every=25, patience=50, lr=1e-2, soft_weight=0.0
    )
    before = Trainer(model, heads, cfg, dtype=torch.float32).evaluate(held)
    result = train_heads(model, train, held, heads, cfg, out=tmp_path, log=lambda m: None, base_model="tiny/llama")
    after = result["history"][-1]
    assert after["loss"] < before["loss"] * 0.7
    assert after["top1"][0] > before["top1"][0]
    back = load_heads(tmp_path, model=model)
    assert back.num_heads == K and back.config.num_proposal_tokens == 64
    assert back.config.base_model == "tiny/llama"  # the model trained on, not a fixed name
    assert (tmp_path / "train_state.pt").exists()


def test_root_ids_are_the_next_tokens_and_the_greedy_pick_at_each_answer_start():
    model = make_model("llama")
    recs = answer_records(3)
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
    train, held = (
        HiddenCache.build(model, alternating_records(n, seed), num_heads=2, log=lambda m: None)
        for n, seed in ((16, 0), (4, 1))
    )
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=2, **conditioning))
    cfg = TrainConfig(
        num_heads=2,
        proposal_tokens=0,
        batch_size=64,
        epochs=30,
        eval_every=30,
        patience=50,
        lr=1e-2,
        soft_weight=0.0,
        **conditioning,
    )
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
        start_from(
            MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, num_layers=2, shared_lm_head=False)),
            tmp_path / "own",
        )  # own projections sit after the blocks
    pruned = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, num_proposal_tokens=64))
    with pytest.raises(SystemExit, match="not in this run|missing: proposal_ids"):
        start_from(pruned, tmp_path / "plain")
    with pytest.raises(SystemExit, match="--init-heads: No Medusa heads found"):
        start_from(plain, tmp_path / "nowhere")
    # root-conditioned heads seed path-conditioned ones, which start as them (P = 0)
    for r in zero.root:
        torch.nn.init.normal_(r.weight)
    zero.save(tmp_path / "root")
    path = MedusaHeads(
        HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, root_conditioned=True, path_conditioned=True)
    )
    start_from(path, tmp_path / "root")
    e, branch = torch.randn(4, 64), torch.randn(4, 2, 64)
    assert torch.equal(path.hidden(h, root_emb=e, path_emb=branch), zero.hidden(h, root_emb=e))


def test_train_cli_refuses_an_unknown_save_dtype(tmp_path):
    import pytest

    from medusa_lib.pipeline.train import main

    with pytest.raises(SystemExit, match="--save-dtype must be float32 or bfloat16 \\(got 'int8'\\)"):
        main(["--save-dtype", "int8", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")])
