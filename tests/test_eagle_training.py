"""EAGLE training: the feature cache (shards, resume), training-time test against what the drafter
computes at run time, acceptance simulated from cached features against the real decoder, resumed
training, and the EAGLE-3 drafter that reads fused layer inputs (tiny models, float32)."""

import json

import pytest
import torch
from conftest import make_model

from medusa_lib import DecodeConfig
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.dynamic_tree import DynamicTreeConfig
from medusa_lib.core.eagle import EagleError, new_eagle_head
from medusa_lib.core.eagle_io import load_eagle
from medusa_lib.core.eagle_run import EagleRun
from medusa_lib.pipeline.eagle_loss import accepted_length, eagle_loss, simulated_lengths, unrolled
from medusa_lib.pipeline.eagle_trainer import train
from medusa_lib.pipeline.feature_cache import FeatureCache, build_cache, fused_layers, read_cache
from medusa_lib.present.drafter import Drafters

PROMPTS = [[1, 17, 33, 250, 99, 4, 61], [1, 5, 9, 12], [1, 200, 201, 202, 7, 8, 30, 31, 40]]
TREE = DynamicTreeConfig(top_k=2, depth=3, num_nodes=6)


@pytest.fixture(scope="module")
def model():
    return make_model("llama", num_hidden_layers=6)


@pytest.fixture(scope="module")
def records(model):
    """The model's own greedy answers: what greedy verification accepts after every position."""
    cfg = DecodeConfig(max_new_tokens=24, stop_on_eos=False)
    return [{"prompt_ids": p, "answer_ids": run_method(model, p, method="plain", config=cfg).tokens} for p in PROMPTS]


@pytest.fixture(scope="module")
def cache(model, records):
    with pytest.MonkeyPatch.context() as mp:  # float32 forwards on every CPU: the comparisons below are exact-ish
        mp.setattr("medusa_lib.pipeline.feature_cache.cpu_has_native_bf16", lambda: False)
        return FeatureCache.build(model, records, layers=fused_layers(6))


def test_a_cpu_with_bfloat16_instructions_caches_features_from_bfloat16_forwards(model, records, monkeypatch):
    """Where the CPU has bfloat16 instructions the cache's forwards run under bfloat16 autocast (the
    fast numerics, issue #34): the features are the autocast forward's, not float32's."""
    monkeypatch.setattr("medusa_lib.pipeline.feature_cache.cpu_has_native_bf16", lambda: True)
    fast = FeatureCache.build(model, records[:1], layers=fused_layers(6))
    ids = records[0]["prompt_ids"] + records[0]["answer_ids"]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.base_model(input_ids=torch.tensor([ids]))
    torch.testing.assert_close(fast.seq(0)[0].float(), out.last_hidden_state[0].float(), rtol=0.02, atol=0.02)


def fitted(model, cache, *, fuse=False, steps=1, batches=80):
    head = new_eagle_head(model, tree=TREE, fuse_layers=fused_layers(6) if fuse else None)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    proj = head.projection_weight().detach().float()
    for _ in range(batches):
        loss, _ = eagle_loss(head, proj, cache, list(range(len(cache))), noise=0.0, steps=steps)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval().requires_grad_(False)


# ------------------------------------------------------------------ the cache
def test_the_cache_holds_the_base_models_features_and_layer_inputs(model, records, cache):
    layers = fused_layers(6)
    assert layers == (2, 3, 3) and fused_layers(30) == (2, 15, 27)  # the reference's 2, L // 2, L - 3
    for i, r in enumerate(records):
        ids = r["prompt_ids"] + r["answer_ids"]
        with torch.no_grad():
            out = model.base_model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        f, tok, p = cache.seq(i)
        assert tok.tolist() == ids and p == len(r["prompt_ids"])
        bf16 = dict(rtol=2**-7, atol=1e-4)  # kept in bfloat16: one rounding of a batched forward's float32
        torch.testing.assert_close(f.float(), out.last_hidden_state[0], **bf16)
        for j, k in enumerate(layers):
            torch.testing.assert_close(cache.seq_layers(i)[:, j].float(), out.hidden_states[k][0], **bf16)


def test_build_cache_writes_shards_and_resumes_at_the_first_missing_one(model, records, cache, tmp_path, monkeypatch):
    monkeypatch.setattr("medusa_lib.pipeline.feature_cache.cpu_has_native_bf16", lambda: False)  # as the fixture
    lines = []
    built = build_cache(model, records, tmp_path, batch_tokens=40, shard_tokens=20, log=lines.append)
    shards = sorted(tmp_path.glob("shard_*.pt"))
    assert len(shards) == 3 and "0 of 3 shards cached" in lines[0]
    bf16 = dict(rtol=2**-7, atol=1e-4)  # batched otherwise than the fixture's cache: one bfloat16 rounding apart
    for i in range(len(records)):  # record order, whatever the shards' order
        torch.testing.assert_close(built.seq(i)[0].float(), cache.seq(i)[0].float(), **bf16)
        torch.testing.assert_close(built.seq_layers(i).float(), cache.seq_layers(i).float(), **bf16)
    shards[1].unlink()
    lines.clear()
    again = build_cache(model, records, tmp_path, batch_tokens=40, shard_tokens=20, log=lines.append)
    assert "2 of 3 shards cached" in lines[0] and torch.equal(again.features, built.features)
    assert json.loads((tmp_path / "speed.json").read_text())["tokens"] < len(built.ids)  # one shard's tokens
    with pytest.raises(SystemExit, match="does not hold these answers"):
        read_cache(tmp_path, records[:2])
    sub = built.subset([2, 0])
    assert torch.equal(sub.seq(0)[1], built.seq(2)[1]) and torch.equal(sub.seq_layers(1), built.seq_layers(0))


# ------------------------------------------------------------------ training-time test
@pytest.mark.parametrize("fuse", [False, True])
def test_training_time_test_computes_what_the_drafter_computes_at_depth_two_and_three(model, cache, fuse):
    """Step j of the unrolled training forward at position t equals the drafter's node at depth j + 1
    after verifying 0..t: same input, token, position, cache entries and mask."""
    head = new_eagle_head(model, tree=TREE, fuse_layers=fused_layers(6) if fuse else None).eval()
    f, ids, _ = cache.seq(0)
    feats = (cache.seq_layers(0) if fuse else f).float()
    T = len(ids) - 3
    with torch.no_grad():
        gs = unrolled(head, head.draft_input(feats[:T])[None], ids[None, 1 : T + 3], 3)
        for t in (0, 5, T - 1):
            run = EagleRun(head, TREE)
            run.extend(feats[: t + 1], ids[1 : t + 2], 0)
            torch.testing.assert_close(run.last, gs[0][0, t])
            g, seen = run.last, torch.ones(1, 1, dtype=torch.bool)
            for j in (1, 2):  # the node at depth j + 1 reads its parent's g and token x_{t+1+j}
                pos = torch.tensor([[t + j]])
                g = head(
                    g[None, None], ids[None, None, t + 1 + j], pos, attention_mask=run._mask(seen), cache=run.cache
                )
                g = g[0, 0]
                seen = torch.ones(1, j + 1, dtype=torch.bool)
                torch.testing.assert_close(g, gs[j][0, t], rtol=1e-4, atol=1e-5)


def test_one_step_is_eagle_one_and_more_steps_score_deeper_drafts(model, cache, monkeypatch):
    # float32 on every CPU (a CPU with bfloat16 instructions trains under bfloat16 autocast): the maths by hand
    monkeypatch.setattr("medusa_lib.pipeline.eagle_loss.cpu_has_native_bf16", lambda: False)
    head = new_eagle_head(model, tree=TREE)
    proj = head.projection_weight().detach().float()
    one, m1 = eagle_loss(head, proj, cache, [0, 1, 2], noise=0.0)
    three, m3 = eagle_loss(head, proj, cache, [0, 1, 2], noise=0.0, steps=3)
    assert set(m3) >= {"top1_0", "top1_1", "top1_2"} and "top1_1" not in m1
    assert m1["ploss"] == m3["ploss"] and float(three) > float(one)  # step 0 is the same; steps 1, 2 add
    f, ids, p = cache.seq(0)  # EAGLE-1 by hand on one sequence: SmoothL1 + 0.1 CE from the last prompt token on
    g = head(f[None, :-1].float(), ids[None, 1:], torch.arange(len(ids) - 1)[None])[0, p - 1 :]
    target = f[p:].float()
    ce = -(torch.softmax(target @ proj.T, -1) * torch.log_softmax(g @ proj.T, -1)).sum(-1).mean()
    by_hand = torch.nn.functional.smooth_l1_loss(g, target) + 0.1 * ce
    torch.testing.assert_close(eagle_loss(head, proj, cache, [0], noise=0.0)[0], by_hand)


# ------------------------------------------------------------------ simulated acceptance
def test_accepted_length_is_the_longest_matching_path():
    tokens = torch.tensor([7, 10, 11, 20, 22])
    retrieve = torch.tensor([[0, -1, -1], [0, 1, -1], [0, 2, -1], [0, 1, 3], [0, 2, 4]])
    assert accepted_length(tokens, retrieve, torch.tensor([11, 22])) == 2
    assert accepted_length(tokens, retrieve, torch.tensor([10, 22])) == 1
    assert accepted_length(tokens, retrieve, torch.tensor([12, 20])) == 0


@pytest.mark.parametrize("fuse", [False])  # fused: a float near-tie moves one step; its inputs are checked below
def test_simulated_acceptance_equals_the_decoders_on_the_models_own_answers(model, records, fuse):
    cache = FeatureCache.build(model, records, layers=fused_layers(6), dtype=torch.float32)  # the decoder's numerics
    head = fitted(model, cache, fuse=fuse, steps=2)
    total = 0
    for i, r in enumerate(records):
        sim = simulated_lengths(head, cache, i, TREE)
        cfg = DecodeConfig(max_new_tokens=len(r["answer_ids"]), stop_on_eos=False)
        res = make_decoder(model, method="medusa-greedy", eagle=head, config=cfg).run(r["prompt_ids"])
        assert res.tokens == r["answer_ids"]
        real = [s.accept_length for s in res.steps[1:]][: len(sim)]
        assert real == sim
        total += sum(sim)
    assert total > 0  # the fitted head drafts accepted tokens


# ------------------------------------------------------------------ the EAGLE-3 drafter
def test_a_fused_drafter_reads_the_layer_inputs_of_the_rows_it_verified(model, records, monkeypatch):
    """What the decoder hands the EAGLE-3 run after the prefill and every step is the fused layers' inputs
    at exactly the committed positions (the cache's, computed in one forward of the whole answer)."""
    from medusa_lib.core.drafters import eagle_head as drafters

    monkeypatch.setattr("medusa_lib.pipeline.feature_cache.cpu_has_native_bf16", lambda: False)  # float32 forwards
    cache = FeatureCache.build(model, records, layers=fused_layers(6), dtype=torch.float32)
    head = new_eagle_head(model, tree=TREE, fuse_layers=fused_layers(6)).eval()
    got, verified = [], drafters._EagleRun.verified

    def spy(self, features, tokens, start, rows=None):
        verified(self, features, tokens, start, rows=rows)
        got.append((self.pending[-1][0], start))

    monkeypatch.setattr(drafters._EagleRun, "verified", spy)
    r = records[0]
    cfg = DecodeConfig(max_new_tokens=len(r["answer_ids"]), stop_on_eos=False)
    assert (
        make_decoder(model, method="medusa-greedy", eagle=head, config=cfg).run(r["prompt_ids"]).tokens
        == r["answer_ids"]
    )
    assert [s for _, s in got][:2] == [0, len(r["prompt_ids"])] and len(got) > 3
    for features, start in got:
        assert features.shape[1:] == (3, 64)
        torch.testing.assert_close(features, cache.seq_layers(0)[start : start + len(features)], rtol=1e-4, atol=1e-5)


def test_a_fused_head_decodes_exactly_saves_loads_and_lets_go_of_the_model(model, records, cache, tmp_path):
    head = fitted(model, cache, fuse=True, steps=2, batches=30)
    assert head.config.recipe.startswith("EAGLE-3")
    head.save(tmp_path / "e3")
    meta = json.loads((tmp_path / "e3" / "config.json").read_text())
    meta["about"] = "trained on three answers."
    (tmp_path / "e3" / "config.json").write_text(json.dumps(meta))
    loaded = load_eagle(tmp_path / "e3", model=model)
    assert loaded.config.fuse_layers == (2, 3, 3)
    note = Drafters({"eagle": {"float32": loaded}}, "medusa").note_of("eagle")  # what the page says under the choice
    assert note.endswith("This is EAGLE-3 (fused features): trained on three answers.")
    cfg = DecodeConfig(max_new_tokens=24, stop_on_eos=False)
    for r in records:
        assert (
            make_decoder(model, method="medusa-greedy", eagle=loaded, config=cfg).run(r["prompt_ids"]).tokens
            == (r["answer_ids"])
        )
    steps = make_decoder(model, method="medusa-greedy", eagle=loaded, config=cfg).steps(PROMPTS[0])
    next(steps), next(steps)
    steps.close()  # a run abandoned mid-way
    assert not any(layer._forward_pre_hooks for layer in model.base_model.layers)
    meta = json.loads((tmp_path / "e3" / "config.json").read_text())
    meta["fuse_layers"] = [2, "x"]
    (tmp_path / "e3" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(EagleError, match="fuse_layers=.*list of layer numbers"):
        load_eagle(tmp_path / "e3", model=model)
    meta["fuse_layers"] = [2, 9]
    (tmp_path / "e3" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(EagleError, match="fuses layer 9 but the model has 6 layers"):
        load_eagle(tmp_path / "e3", model=model)


# ------------------------------------------------------------------ resumed training
def test_a_stopped_training_resumes_to_the_same_head(model, cache, tmp_path):
    class Stopped(Exception):
        pass

    def run(out, stop_at_eval=None):
        torch.manual_seed(0)  # the same initial head, as train_eagle's main builds it
        head, evals = new_eagle_head(model, tree=TREE), []

        def log(line):  # a kill at the second evaluation: the state of the first is on disk
            evals.append(line)
            if stop_at_eval and sum("held-out at batch" in e for e in evals) == stop_at_eval:
                raise Stopped

        kw = dict(lr=3e-3, epochs=2, batch_tokens=40, eval_every=2, seed=0, save_dtype=torch.float32)
        result = train(head, cache, cache, out=out, minutes=60, steps=2, sim_prompts=2, sim_tree=TREE, log=log, **kw)
        return head, result, evals

    whole, result, _ = run(tmp_path / "whole")
    assert result["steps"] == result["planned_steps"] > 4
    kept = json.loads((tmp_path / "whole" / "config.json").read_text())["training"]
    best = max(h["tokens_per_step"] for h in kept["history"])
    assert kept["history"][[h["step"] for h in kept["history"]].index(kept["kept"])]["tokens_per_step"] == best
    with pytest.raises(Stopped):
        run(tmp_path / "parts", stop_at_eval=2)
    resumed, again, lines = run(tmp_path / "parts")
    assert lines[0].startswith("resuming at batch 3 of") and again["steps"] == result["steps"]
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("fuse", [False, True])
def test_the_loss_under_bfloat16_autocast_is_the_float32_loss_to_bfloat16_precision(model, cache, fuse, monkeypatch):
    """A GPU (and a CPU with native bfloat16) trains under bfloat16 autocast: the loss of every unrolled
    step and its gradients agree with float32's to bfloat16 precision, and the head stays float32."""
    import medusa_lib.pipeline.eagle_loss as eagle_loss_module

    head = new_eagle_head(model, tree=TREE, fuse_layers=fused_layers(6) if fuse else None)
    proj = head.projection_weight().detach().float()
    batch = list(range(len(cache)))
    runs = []
    for native in (False, True):
        monkeypatch.setattr(eagle_loss_module, "cpu_has_native_bf16", lambda native=native: native)
        head.zero_grad()
        loss, m = eagle_loss(head, proj, cache, batch, noise=0.0, steps=3)
        loss.backward()
        runs.append((float(loss), m, head.fc.weight.grad.clone()))
    (l32, m32, g32), (l16, m16, g16) = runs
    assert head.fc.weight.dtype == torch.float32 and torch.isfinite(g16).all()
    assert l16 == pytest.approx(l32, rel=0.03) and m16["n"] == m32["n"]
    assert torch.nn.functional.cosine_similarity(g16.flatten(), g32.flatten(), dim=0) > 0.98


def test_a_training_can_start_from_another_heads_weights_of_the_same_recipe(model, tmp_path):
    """--init (a head trained on a GPU, say): the new head starts with exactly its weights; a head of
    another recipe is refused in one sentence."""
    from medusa_lib.pipeline.train_eagle import init_from

    torch.manual_seed(1)
    trained = new_eagle_head(model, tree=TREE, proposal_ids=torch.arange(40))
    trained.save(tmp_path / "gpu", dtype=torch.bfloat16)
    torch.manual_seed(2)
    fresh = new_eagle_head(model, tree=TREE, proposal_ids=torch.arange(40))
    assert not torch.equal(fresh.fc.weight, trained.fc.weight)
    init_from(fresh, tmp_path / "gpu", model)
    saved = load_eagle(tmp_path / "gpu", model=model)
    for (k, a), (_, b) in zip(fresh.state_dict().items(), saved.state_dict().items()):
        assert a.dtype == (torch.float32 if a.is_floating_point() else torch.long) and torch.equal(a, b.to(a.dtype)), k
    fused = new_eagle_head(model, tree=TREE, proposal_ids=torch.arange(40), fuse_layers=fused_layers(6))
    with pytest.raises(SystemExit, match=r"is another recipe \(its fused layers or proposal tokens differ"):
        init_from(fused, tmp_path / "gpu", model)
    with pytest.raises(SystemExit, match="give a head trained with the same flags"):
        init_from(new_eagle_head(model, tree=TREE, proposal_ids=torch.arange(1, 41)), tmp_path / "gpu", model)


def test_the_model_cards_acceptance_counts_the_decoders_full_steps(model, cache):
    """eagle_card.acceptance_per_depth: tokens/step and the rates per depth of the decoder's full steps."""
    from medusa_lib.pipeline.eagle_card import acceptance_per_depth

    head = fitted(model, cache, batches=40)
    got = acceptance_per_depth(model, head, PROMPTS, max_new_tokens=16, tree=TREE)
    cfg = DecodeConfig(max_new_tokens=16, stop_on_eos=True, record_detail=False)
    runs = [make_decoder(model, method="medusa-greedy", eagle=head, tree=TREE, config=cfg).run(p) for p in PROMPTS]
    a = [s.accept_length for r in runs for s in r.steps[1:] if s.finish_reason is None]
    reached = [sum(x >= k for x in a) for k in range(TREE.depth + 1)]  # reached[0]: every full step
    assert got["steps"] == len(a) > 0 and sum(a) > 0
    assert got["tokens_per_step"] == round(1 + sum(a) / len(a), 3)
    assert got["accepted_at_least"] == [round(reached[k] / len(a), 3) for k in range(1, TREE.depth + 1)]
    assert got["accept_rate_per_depth"] == [
        round(reached[k] / reached[k - 1], 3) if reached[k - 1] else 0.0 for k in range(1, TREE.depth + 1)
    ]


def test_the_model_card_names_the_recipe_with_its_training_time_test_steps():
    from medusa_lib.pipeline.eagle_card import recipe_name

    assert recipe_name({"recipe": "EAGLE-1 (top feature)", "ttt_steps": 1}) == "EAGLE-1 (top feature)"
    assert (
        recipe_name({"recipe": "EAGLE-1 (top feature)", "ttt_steps": 2})
        == "EAGLE-1 (top feature) + training-time test (2 steps)"
    )
    assert recipe_name({"recipe": "EAGLE-3 (fused features)", "ttt_steps": 3}).endswith("(3 steps)")
    assert recipe_name({}) == "EAGLE-1 (top feature)"
