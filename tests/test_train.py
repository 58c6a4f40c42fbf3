"""Training and calibration pipeline on a tiny random model: targets, loss, early stopping, accuracy."""

import torch
from conftest import make_model

from medusa_lib import HeadsConfig, MedusaHeads, load_heads
from medusa_lib.calibrate import head_accuracy
from medusa_lib.train import HiddenCache, TrainConfig, Trainer, cached_hidden, frequent_tokens, train_heads

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
    result = train_heads(model, train, held, heads, cfg, out=tmp_path, log=lambda m: None)
    after = result["history"][-1]
    assert after["loss"] < before["loss"] * 0.7
    assert after["top1"][0] > before["top1"][0]
    back = load_heads(tmp_path, model=model)
    assert back.num_heads == K and back.config.num_proposal_tokens == 64
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
