"""Medusa heads: ResBlock layout, the three public checkpoint formats and ours, mismatch messages."""

import dataclasses
import json

import pytest
import torch
from conftest import HIDDEN, VOCAB, make_model, random_heads
from safetensors.torch import save_file

from medusa_lib import HeadsConfig, HeadsError, MedusaHeads, ResBlock, load_heads


@pytest.fixture(scope="module")
def model():
    return make_model("llama")


def test_resblock_starts_as_identity_and_blocks_are_independent(model):
    x = torch.randn(3, HIDDEN)
    assert torch.equal(ResBlock(HIDDEN)(x), x)
    heads = MedusaHeads(
        HeadsConfig(hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=2, num_layers=3, shared_lm_head=False)
    )
    blocks = [m for m in heads.modules() if isinstance(m, ResBlock)]
    assert len(blocks) == 6 and len({id(b.linear.weight) for b in blocks}) == 6  # not [ResBlock] * L
    heads.init_from_lm_head(model.lm_head)
    h = torch.randn(HIDDEN)
    # Fresh heads = identity + a copy of lm_head: every head predicts what lm_head predicts.
    assert torch.allclose(heads(h), model.lm_head(h).expand(2, VOCAB), atol=1e-6)


def test_shared_projection_is_one_matmul_on_lm_head(model):
    heads = random_heads(3, shared=True)
    h = torch.randn(HIDDEN)
    logits = heads(h, model.lm_head)
    assert logits.shape == (3, VOCAB)
    for k in range(3):
        assert torch.allclose(logits[k], model.lm_head(heads.heads[k](h)), atol=1e-5)
    with pytest.raises(HeadsError, match="pass it as lm_head"):
        heads(h)
    assert heads.propose(h, model.lm_head, topk=10, num_heads=2).shape == (2, 10)


def _same_logits(a, b, model):
    h = torch.randn(5, HIDDEN)
    return torch.allclose(a(h, model.lm_head), b(h, model.lm_head), atol=1e-6)


def test_format1_heads_only_pt_trusts_tensors_over_config(tmp_path, model):
    src = random_heads(5, shared=False)
    torch.save(src.heads.state_dict(), tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(
        json.dumps({"base_model_name_or_path": "tiny", "medusa_num_heads": 3, "medusa_num_layers": 1})
    )
    heads = load_heads(tmp_path, model=model)
    assert heads.num_heads == 5 and not heads.config.shared_lm_head and heads.config.base_model == "tiny"
    assert _same_logits(heads, src, model)


def test_format2_full_model_with_medusa_head_keys(tmp_path, model):
    src = random_heads(4, shared=False)
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    state.update({f"medusa_head.{k}": v.clone() for k, v in src.heads.state_dict().items()})
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(tmp_path)
    heads = load_heads(tmp_path, model=model)
    assert heads.num_heads == 4 and _same_logits(heads, src, model)


def test_format2_sharded_full_model(tmp_path, model):
    src = random_heads(2, shared=False)
    body = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    medusa = {f"medusa_head.{k}": v.clone() for k, v in src.heads.state_dict().items()}
    save_file(body, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(medusa, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in body} | {
        k: "model-00002-of-00002.safetensors" for k in medusa
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    heads = load_heads(tmp_path, model=model)
    assert heads.num_heads == 2 and _same_logits(heads, src, model)


def test_format3_resblock_only_safetensors_shares_lm_head(tmp_path, model):
    src = random_heads(3, shared=True)
    save_file(
        {k: v.contiguous() for k, v in src.heads.state_dict().items()}, str(tmp_path / "medusa_lm_head.safetensors")
    )
    heads = load_heads(tmp_path, model=model)  # no config at all: vocabulary from the model
    assert heads.config.shared_lm_head and heads.num_heads == 3
    assert _same_logits(heads, src, model)


def test_our_format_round_trips(tmp_path, model):
    for shared in (True, False):
        src = random_heads(4, shared=shared)
        src.save(tmp_path / str(shared), base_model="tiny-llama")
        back = load_heads(tmp_path / str(shared), model=model)
        assert back.config == dataclasses.replace(src.config, base_model="tiny-llama")
        assert _same_logits(back, src, model)
    cfg = json.loads((tmp_path / "True" / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 4 and cfg["base_model_name_or_path"] == "tiny-llama"
    assert not list(tmp_path.rglob("*.tmp"))


def test_pruned_vocabulary_heads_round_trip(tmp_path, model):
    cfg = HeadsConfig(hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=2, shared_lm_head=False, num_proposal_tokens=50)
    src = MedusaHeads(cfg)
    src.proposal_ids.copy_(torch.arange(100, 150))
    src.init_from_lm_head(model.lm_head)
    h = torch.randn(HIDDEN)
    ids = src.propose(h, model.lm_head, topk=5)
    assert ids.min() >= 100 and ids.max() < 150
    # Identity heads restricted to 50 tokens rank them exactly as lm_head does.
    assert ids[0].tolist() == (torch.topk(model.lm_head(h)[100:150], 5).indices + 100).tolist()
    src.save(tmp_path)
    back = load_heads(tmp_path, model=model)
    assert back.config.num_proposal_tokens == 50 and torch.equal(back.propose(h, model.lm_head, topk=5), ids)


def test_mismatched_heads_are_refused(tmp_path, model):
    random_heads(2, hidden=32).save(tmp_path / "small")
    with pytest.raises(HeadsError, match="made for hidden size 32, but the model has hidden size 64"):
        load_heads(tmp_path / "small", model=model)
    random_heads(2, vocab=100, shared=False).save(tmp_path / "vocab")
    with pytest.raises(HeadsError, match="vocabulary of 100 tokens, but the model's has 320"):
        load_heads(tmp_path / "vocab", model=model)


def test_bad_checkpoints_get_clear_messages(tmp_path, model):
    with pytest.raises(HeadsError, match="holds no Medusa heads"):
        load_heads(tmp_path, model=model)
    (tmp_path / "x").mkdir()
    save_file({"foo.weight": torch.zeros(2)}, str(tmp_path / "x" / "medusa_lm_head.safetensors"))
    with pytest.raises(HeadsError, match="Unexpected tensor 'foo.weight'"):
        load_heads(tmp_path / "x", model=model)
    (tmp_path / "pickle").mkdir()
    torch.save(
        {"0.0.linear.weight": torch.zeros(2, 2), "evil": HeadsConfig(1, 1)}, tmp_path / "pickle" / "medusa_lm_head.pt"
    )
    with pytest.raises(HeadsError, match="not loaded, for safety"):
        load_heads(tmp_path / "pickle", model=model)
    with pytest.raises(HeadsError, match="No Medusa heads found at './missing'"):
        load_heads("./missing", model=model)
    with pytest.raises(HeadsError, match="Could not fetch Medusa heads 'nobody/no-such-heads'"):
        load_heads("nobody/no-such-heads", model=model)  # offline in tests


def test_root_conditioned_heads_read_the_root_and_round_trip(tmp_path, model):
    h, root = torch.randn(5, HIDDEN), torch.tensor([4, 9, 9, 200, 31])
    emb = model.get_input_embeddings()
    fresh = MedusaHeads(HeadsConfig(hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=3, root_conditioned=True))
    plain = MedusaHeads(HeadsConfig(hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=3))
    # R starts at zero: a fresh root-conditioned head is a plain Medusa head
    assert torch.equal(fresh(h, model.lm_head, root_emb=fresh.root_embedding(emb, root)), plain(h, model.lm_head))
    assert plain.root_embedding(emb, root) is None
    with pytest.raises(HeadsError, match="root-conditioned; pass the root token's embedding"):
        fresh(h, model.lm_head)
    src = random_heads(3, shared=True, root=True)
    e = src.root_embedding(emb, root)
    assert torch.equal(e, emb.weight[root])
    z = src.hidden(h, root_emb=e)
    x = h + src.root[1](e)  # head 2 by hand: ResBlocks on h + R2 e(root)
    for j in range(src.config.num_layers):
        x = x + torch.nn.functional.silu(src.heads[1][j].linear(x))
    assert torch.allclose(z[:, 1], x, atol=1e-5)
    # another root, other proposals, from the same hidden state
    assert not torch.equal(
        src.propose(h[0], model.lm_head, topk=5, root_emb=e[0]), src.propose(h[0], model.lm_head, topk=5, root_emb=e[3])
    )
    src.save(tmp_path, base_model="tiny-llama")
    assert json.loads((tmp_path / "config.json").read_text())["root_conditioned"] is True
    back = load_heads(tmp_path, model=model)
    assert back.config == dataclasses.replace(src.config, base_model="tiny-llama") and back.root_conditioned
    assert torch.allclose(back(h, model.lm_head, root_emb=e), src(h, model.lm_head, root_emb=e), atol=1e-6)


def test_root_conditioned_heads_are_checked_against_config_and_model(tmp_path, model):
    random_heads(2, shared=True).save(tmp_path)  # plain heads ...
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**cfg, "root_conditioned": True})
    )  # ... whose config says otherwise
    with pytest.raises(HeadsError, match="says the heads are root-conditioned, but the checkpoint holds no root"):
        load_heads(tmp_path, model=model)
    random_heads(2, shared=True, root=True).save(tmp_path / "root")
    narrow = make_model("llama")
    narrow.set_input_embeddings(torch.nn.Embedding(VOCAB, HIDDEN // 2))  # embeddings narrower than the hidden state
    with pytest.raises(HeadsError, match="input embeddings have width 32; use plain Medusa heads"):
        load_heads(tmp_path / "root", model=narrow)
    load_heads(tmp_path / "root", model=model)  # fits


def test_path_conditioned_heads_read_their_branch_and_round_trip(tmp_path, model):
    h, root = torch.randn(5, HIDDEN), torch.tensor([4, 9, 9, 200, 31])
    branch = torch.randint(0, VOCAB, (5, 2), generator=torch.Generator().manual_seed(0))  # x_{t+2}, x_{t+3}
    emb = model.get_input_embeddings()
    W = emb.weight
    with pytest.raises(HeadsError, match="Path-conditioned heads read the root token too"):
        MedusaHeads(HeadsConfig(hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=3, path_conditioned=True))
    # P starts at zero: fresh path heads carrying root heads' weights are those root heads
    rooted = random_heads(3, shared=True, root=True)
    fresh = MedusaHeads(
        HeadsConfig(hidden_size=HIDDEN, vocab_size=VOCAB, num_heads=3, root_conditioned=True, path_conditioned=True)
    )
    fresh.load_state_dict(rooted.state_dict(), strict=False)
    e = rooted.root_embedding(emb, root)
    assert torch.equal(fresh(h, model.lm_head, root_emb=e, path_emb=W[branch]), rooted(h, model.lm_head, root_emb=e))
    with pytest.raises(
        HeadsError,
        match=r"path-conditioned; pass the embeddings of the 2 branch tokens after the root as path_emb \[..., 2, d\]",
    ):
        fresh(h, model.lm_head, root_emb=e)
    assert fresh.hidden(h, num_heads=1, root_emb=e).shape == (5, 1, HIDDEN)  # head 1 has no branch above it
    src = random_heads(3, shared=True, path=True)
    assert [len(p) for p in src.path] == [0, 1, 2]
    z = src.hidden(h, root_emb=e, path_emb=W[branch])
    x = h + src.root[2](e) + src.path[2][0](W[branch[:, 0]]) + src.path[2][1](W[branch[:, 1]])  # head 3 by hand
    for j in range(src.config.num_layers):
        x = x + torch.nn.functional.silu(src.heads[2][j].linear(x))
    assert torch.allclose(z[:, 2], x, atol=1e-5)
    other = branch.clone()
    other[:, 1] = (other[:, 1] + 1) % VOCAB  # another x_{t+3}: only head 3 reads it
    z2 = src.hidden(h, root_emb=e, path_emb=W[other])
    assert torch.equal(z2[:, :2], z[:, :2]) and not torch.allclose(z2[:, 2], z[:, 2])
    src.save(tmp_path, base_model="tiny-llama")
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["root_conditioned"] is True and meta["path_conditioned"] is True
    back = load_heads(tmp_path, model=model)
    assert back.config == dataclasses.replace(src.config, base_model="tiny-llama") and back.path_conditioned
    assert torch.allclose(
        back(h, model.lm_head, root_emb=e, path_emb=W[branch]),
        src(h, model.lm_head, root_emb=e, path_emb=W[branch]),
        atol=1e-6,
    )


def test_path_conditioned_checkpoints_are_checked(tmp_path, model):
    from safetensors.torch import load_file

    random_heads(2, shared=True, root=True).save(tmp_path)  # root heads ...
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "path_conditioned": True}))  # ... whose config says path
    with pytest.raises(HeadsError, match="says the heads are path-conditioned, but the checkpoint holds no path"):
        load_heads(tmp_path, model=model)
    random_heads(2, shared=True, path=True).save(tmp_path / "p")
    state = load_file(tmp_path / "p" / "medusa_lm_head.safetensors")
    save_file(
        {k: v for k, v in state.items() if not k.startswith("root.")}, tmp_path / "p" / "medusa_lm_head.safetensors"
    )
    with pytest.raises(HeadsError, match=r"branch \(path.\*\) tensors but no root.\* tensors"):
        load_heads(tmp_path / "p", model=model)


@pytest.mark.parametrize("kind", ["plain", "root", "path"])
@pytest.mark.parametrize("shared", [True, False])
def test_draft_gives_every_node_its_parent_head_rank_reading_the_branch_above(model, kind, shared):
    from medusa_lib.core.tree import build_tree

    heads = random_heads(3, shared=shared, root=kind == "root", path=kind == "path")
    tree = build_tree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 3], [0, 0, 0], [0, 0, 4], [1, 0, 2], [0, 1, 0]])
    emb = model.get_input_embeddings()
    W = emb.weight
    h, root = torch.randn(HIDDEN), torch.tensor(7)
    with torch.no_grad():
        got = heads.draft(h, model.lm_head, tree, root, emb)
        token = {(): 7}
        for c in tree.choices:  # parents first: by hand, one node at a time
            branch = [token[c[:d]] for d in range(1, len(c))] + [0] * (3 - len(c))  # x_{t+2}.. of this node, padded
            ids = heads.propose(
                h,
                model.lm_head,
                topk=10,
                root_emb=heads.root_embedding(emb, root),
                path_emb=W[torch.tensor(branch)] if kind == "path" else None,
            )
            token[c] = int(ids[len(c) - 1, c[-1]])
    assert got.tolist() == [7] + [token[c] for c in tree.choices]
    hs, roots = torch.stack([torch.randn(HIDDEN), h, torch.randn(HIDDEN)]), torch.tensor([3, 7, 250])
    with torch.no_grad():  # a batch of trees (calibration) is the trees one at a time
        batch = heads.draft(hs, model.lm_head, tree, roots, emb)
        assert batch.shape == (3, tree.num_nodes) and torch.equal(batch[1], got)
        assert all(torch.equal(batch[i], heads.draft(hs[i], model.lm_head, tree, roots[i], emb)) for i in (0, 2))
    if kind != "path":  # the reference layout: [root, head-1 top-k, head-2 top-k, ...][tree_indices]
        ids = heads.propose(h, model.lm_head, topk=10, num_heads=3, root_emb=heads.root_embedding(emb, root))
        assert torch.equal(got, torch.cat([root.view(1), ids.flatten()])[tree.tree_indices])
    else:  # the same rank of the same head, under different branches, is another token
        assert token[(0, 0)] != token[(1, 0)] or token[(0, 0, 0)] != token[(0, 1, 0)]


def test_heads_can_be_saved_in_bfloat16_at_half_the_size(tmp_path, model):
    from safetensors import safe_open

    src = MedusaHeads(
        HeadsConfig(
            hidden_size=HIDDEN,
            vocab_size=VOCAB,
            num_heads=2,
            num_proposal_tokens=VOCAB // 2,
            root_conditioned=True,
            path_conditioned=True,
        )
    )
    for p in src.parameters():
        torch.nn.init.normal_(p, std=0.5)
    src.proposal_ids.copy_(torch.arange(0, VOCAB, 2))  # a pruned vocabulary: its ids stay integers
    src.save(tmp_path / "f32")
    src.save(tmp_path / "bf16", dtype=torch.bfloat16)
    with safe_open(str(tmp_path / "bf16" / "medusa_lm_head.safetensors"), framework="pt") as f:
        dtypes = {k: f.get_tensor(k).dtype for k in f.keys()}
    assert dtypes.pop("proposal_ids") == torch.int64 and set(dtypes.values()) == {torch.bfloat16}
    size = lambda name: (tmp_path / name / "medusa_lm_head.safetensors").stat().st_size  # noqa: E731
    assert size("bf16") < 0.55 * size("f32")
    back = load_heads(tmp_path / "bf16", model=model)  # loaded in the model's dtype
    assert next(back.parameters()).dtype == torch.float32 and torch.equal(back.proposal_ids, src.proposal_ids)
    for k, v in src.state_dict().items():
        assert torch.equal(back.state_dict()[k], v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v), k


def test_calibrations_per_device_kind_are_read_and_a_malformed_one_gets_one_sentence(tmp_path, model):
    cuda = {"default_tree": "chain-3", "lookup": 0, "device": "NVIDIA H100 80GB HBM3", "device_kind": "cuda"}
    random_heads(3, shared=True).save(
        tmp_path / "ok",
        default_tree="chain-2",
        lookup=4,
        calibration={"device": "CPU, 2 threads"},
        calibrations={"cuda": cuda},
    )
    heads = load_heads(tmp_path / "ok", model=model)
    assert (
        heads.calibrations == {"cuda": cuda}
        and heads.calibration == {"device": "CPU, 2 threads"}
        and (heads.default_tree, heads.lookup) == ("chain-2", 4)
    )
    random_heads(3, shared=True).save(tmp_path / "one")
    assert load_heads(tmp_path / "one", model=model).calibrations == {}  # calibrated on one kind of device, or never
    where = str(tmp_path / "bad" / "config.json")
    for bad, message in [
        (
            [cuda],
            f"{where} has calibrations=[{cuda!r}]; it must map a device kind and numerics (cuda-bfloat16) "
            "to a calibration record, or be left out.",
        ),
        (
            {"cuda": "chain-3"},
            f"{where} has a 'cuda' calibration that is not a record; recalibrate on that device or delete "
            "calibrations.cuda.",
        ),
        (
            {"cuda": {"lookup": 2}},
            f"{where} has a 'cuda' calibration without a default_tree name; recalibrate on that device or delete "
            "calibrations.cuda.",
        ),
        (
            {"cuda": {**cuda, "lookup": 99}},
            f"{where} has a 'cuda' calibration with lookup=99; it must be a whole number from 0 (no lookup branch) to "
            "8.",
        ),
    ]:
        random_heads(3, shared=True).save(tmp_path / "bad", calibrations=bad)
        with pytest.raises(HeadsError) as err:
            load_heads(tmp_path / "bad", model=model)
        assert str(err.value) == message
