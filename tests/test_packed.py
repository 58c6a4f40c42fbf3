"""Pre-packed oneDNN linear weights (CPU): the same maths as nn.Linear, for every caller of the model."""

import copy

import pytest
import torch
from conftest import OracleHeads, make_model, random_heads

from medusa_lib import (
    DecodeConfig,
    HeadsConfig,
    MedusaHeads,
    build_tree,
    chain_choices,
    get_tree,
    load_heads,
)
from medusa_lib.core.compose import run_method
from medusa_lib.core.packing import (
    FEW_ROWS,
    PackedLinear,
    can_prepack,
    choose_few_row_kernels,
    few_row_kernels,
    mkl_linear,
    prepack_linear_weights,
)

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="oneDNN is not part of this torch build"
)
PROMPT = [1, 17, 33, 250, 99, 4, 61]


def packable(dtype: torch.dtype):
    """Skip a case whose dtype this CPU's oneDNN cannot pre-pack (bfloat16 needs AVX512-BW/VL/DQ or
    AVX-NE-CONVERT); ``load_model`` then keeps the stock weights, which the other tests cover."""
    if not can_prepack(torch.zeros(8, 8, dtype=dtype)):
        pytest.skip(f"oneDNN cannot pre-pack {dtype} weights on this CPU")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_nn_linear(dtype, bias):
    packable(dtype)
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 200, bias=bias).to(dtype).requires_grad_(False)
    packed = PackedLinear(lin)
    assert packed.weight is lin.weight and "packed=oneDNN" in repr(packed)
    for shape in [(1, 96), (9, 96), (1, 5, 96), (2, 3, 96)]:
        x = torch.randn(shape).to(dtype)
        got, want = packed(x), lin(x)
        assert got.shape == want.shape == (*shape[:-1], 200)
        if dtype == torch.bfloat16:
            assert torch.equal(got, want)  # the same oneDNN kernel, only packed once
        else:
            assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_packed_linear_falls_back_where_the_packed_copy_cannot_serve():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16)
    packed = PackedLinear(lin)  # weight still requires grad: autograd must flow through it
    x = torch.randn(4, 32, requires_grad=True)
    packed(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None
    packed.double()  # the module moved to another dtype than its packed copy
    with torch.no_grad():
        assert torch.allclose(packed(x.double()), torch.nn.functional.linear(x.double(), packed.weight, packed.bias))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prepacked_model_keeps_its_state_and_its_logits(arch):
    stock = make_model(arch)
    model = copy.deepcopy(stock).requires_grad_(False)
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    keys = list(model.state_dict())
    lm_weight = model.lm_head.weight
    assert prepack_linear_weights(model) == n_linear > 0
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert list(model.state_dict()) == keys and model.lm_head.weight is lm_weight
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, stock(input_ids=ids).logits, atol=1e-5)
    assert prepack_linear_weights(model) == 0  # already packed


def test_gpt2_conv1d_layers_are_left_alone():
    model = make_model("gpt2")
    assert prepack_linear_weights(model) == 1  # only its (tied) lm_head is an nn.Linear


def test_medusa_greedy_equals_plain_and_generate_on_a_prepacked_model():
    model = make_model("llama").requires_grad_(False)
    prepack_linear_weights(model)
    cfg = DecodeConfig(max_new_tokens=48, stop_on_eos=False)
    plain = run_method(model, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=56, stop_on_eos=False)).tokens
    gen = model.generate(torch.tensor([PROMPT]), max_new_tokens=48, do_sample=False, eos_token_id=None, pad_token_id=0)[
        0, len(PROMPT) :
    ].tolist()
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=OracleHeads(model, PROMPT + plain),
        tree=get_tree("mc_sim_7b_63"),
        config=cfg,
    )
    assert res.tokens == plain[:48] == gen
    assert res.tokens_per_step > 3.0  # long tree paths, verified with packed weights


@pytest.mark.parametrize("bias", [False, True])
def test_few_row_products_through_mkl_equal_nn_linear_and_one_row_stays_packed(bias, monkeypatch):
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 200, bias=bias).requires_grad_(False)
    packed = PackedLinear(lin)
    packed.mkl_rows = frozenset({2, 4})
    calls = []
    monkeypatch.setattr("medusa_lib.core.packing.mkl_linear", lambda *a: calls.append(a[0].shape) or mkl_linear(*a))
    for shape in [(2, 96), (1, 2, 96), (1, 4, 96), (2, 2, 96), (1, 96), (1, 3, 96)]:
        x = torch.randn(shape)
        got, want = packed(x), lin(x)
        assert got.shape == want.shape and got.is_contiguous()
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert calls == [(2, 96), (1, 2, 96), (1, 4, 96), (2, 2, 96)]  # 2 and 4 rows (2 x 2 too), never 1 or 3


def test_the_few_row_choice_is_timed_once_and_shared_by_every_packed_linear():
    model = make_model("llama").requires_grad_(False)
    assert few_row_kernels(model) == ()  # nothing packed, nothing chosen
    prepack_linear_weights(model)
    chosen = choose_few_row_kernels(model, rounds=1)
    assert set(chosen) <= set(FEW_ROWS) and few_row_kernels(model) == tuple(sorted(chosen))
    assert {m.mkl_rows for m in model.modules() if isinstance(m, PackedLinear)} == {frozenset(chosen)}
    # a margin no kernel can win by keeps oneDNN everywhere
    assert choose_few_row_kernels(model, rounds=1, margin=1e9) == () == few_row_kernels(model)


def test_greedy_stays_exact_with_every_few_row_product_through_mkl():
    model = make_model("llama").requires_grad_(False)
    prepack_linear_weights(model)
    for m in model.modules():
        if isinstance(m, PackedLinear):
            m.mkl_rows = frozenset(FEW_ROWS)
    plain = run_method(model, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=56, stop_on_eos=False)).tokens
    gen = model.generate(torch.tensor([PROMPT]), max_new_tokens=48, do_sample=False, eos_token_id=None, pad_token_id=0)
    for tree in (get_tree("mc_sim_7b_63"), build_tree(chain_choices(4))):  # 64 rows (oneDNN), 5 rows (MKL)
        res = run_method(
            model,
            PROMPT,
            method="medusa-greedy",
            heads=OracleHeads(model, PROMPT + plain),
            tree=tree,
            config=DecodeConfig(max_new_tokens=48, stop_on_eos=False),
        )
        assert res.tokens == plain[:48] == gen[0, len(PROMPT) :].tolist(), tree.name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_proposals_through_packed_rows_equal_the_plain_matmul(dtype):
    packable(dtype)
    model = make_model("llama").to(dtype).requires_grad_(False)
    heads = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, num_proposal_tokens=100))
    torch.manual_seed(1)
    heads.proposal_ids.copy_(torch.randperm(320)[:100].sort().values)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.3)
    heads.to(dtype)
    rows = model.lm_head.weight[heads.proposal_ids]
    assert can_prepack(rows)
    h = torch.randn(64).to(dtype)
    with torch.no_grad():
        z = heads.hidden(h)
        want = z @ rows.T
        got = heads(h, model.lm_head)
        assert torch.allclose(got.float(), want.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-5)
        assert torch.equal(heads.propose(h, model.lm_head, topk=5), heads.proposal_ids[want.topk(5, -1).indices])


def packed_and_stock(tmp_path, heads):
    """(stock model, pre-packed copy, heads loaded for the packed one, the same heads loaded for the stock one)."""
    stock = make_model("llama").requires_grad_(False)
    model = copy.deepcopy(stock)
    prepack_linear_weights(model)
    heads.save(tmp_path)
    return stock, model, load_heads(tmp_path, model=model), load_heads(tmp_path, model=stock)


def test_heads_loaded_for_a_prepacked_model_are_prepacked_too(tmp_path):
    stock, model, packed, plain = packed_and_stock(
        tmp_path, random_heads(3, shared=False)
    )  # own projections: 3 ResBlocks + 3 Linear(d, V)
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 6
    assert not any(isinstance(m, PackedLinear) for m in plain.modules())
    assert list(packed.state_dict()) == list(plain.state_dict())
    h = torch.randn(5, 64)
    with torch.no_grad():
        assert torch.allclose(packed(h), plain(h), atol=1e-4)
        assert torch.equal(packed.propose(h[0], None, topk=4), plain.propose(h[0], None, topk=4))


def test_prepacked_root_conditioned_heads_propose_the_same(tmp_path):
    stock, model, packed, plain = packed_and_stock(tmp_path, random_heads(3, shared=True, root=True))
    assert sum(isinstance(m, PackedLinear) for m in packed.root.modules()) == 3  # the root projections are packed too
    h, root = torch.randn(64), torch.tensor(17)
    e = plain.root_embedding(stock.get_input_embeddings(), root)
    with torch.no_grad():
        assert torch.equal(
            packed.propose(h, model.lm_head, topk=4, root_emb=e), plain.propose(h, stock.lm_head, topk=4, root_emb=e)
        )


def test_a_platform_where_packing_fails_keeps_stock_weights(monkeypatch):
    import medusa_lib.core.packing as M

    monkeypatch.setattr(M, "_PACKING_WORKS", {})

    def broken(*args, **kwargs):
        raise RuntimeError("no oneDNN kernel for this CPU")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", broken)
    model = make_model("llama")
    assert prepack_linear_weights(model) == 0
    assert any(type(m) is torch.nn.Linear for m in model.modules())


def test_prepacked_path_conditioned_heads_draft_the_same(tmp_path):
    from medusa_lib import build_tree

    stock, model, packed, plain = packed_and_stock(tmp_path, random_heads(3, shared=True, path=True))
    assert sum(isinstance(m, PackedLinear) for m in packed.path.modules()) == 3  # the branch projections are packed too
    tree = build_tree([[0], [1], [0, 0], [1, 0], [0, 0, 0]])
    with torch.no_grad():
        h = torch.randn(64)
        assert torch.equal(
            packed.draft(h, model.lm_head, tree, torch.tensor(17), model.get_input_embeddings()),
            plain.draft(h, stock.lm_head, tree, torch.tensor(17), stock.get_input_embeddings()),
        )


# ---------------------------------------------------------------------- int8 drafts
def int8_here():
    from medusa_lib.core.packing import can_int8

    if not can_int8(torch.zeros(8, 8)):
        pytest.skip("fbgemm's dynamic int8 linear does not run on this platform")


@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_is_the_float_map_up_to_int8_rounding_and_falls_back_for_autograd(bias):
    from medusa_lib.core.packing import Int8Linear

    int8_here()
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 300, bias=bias)
    q = Int8Linear(lin)
    assert q.weight is lin.weight and "int8" in repr(q)
    with torch.no_grad():
        for shape in [(1, 96), (8, 96), (1, 5, 96)]:
            x = torch.randn(shape)
            got, want = q(x), lin(x)
            assert got.shape == want.shape == (*shape[:-1], 300)
            assert not torch.equal(got, want)  # int8 arithmetic, not the float map
            assert (got - want).abs().max() < 0.03 * want.abs().max()
            assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75
    x = torch.randn(4, 96, requires_grad=True)  # autograd: the float weight, exactly
    y = q(x)
    assert torch.equal(y, lin(x))
    y.sum().backward()
    assert x.grad is not None and lin.weight.grad is not None


def prepacked_llama():
    model = make_model("llama").requires_grad_(False)
    prepack_linear_weights(model)
    return model


def test_eagle_drafts_in_int8_on_a_prepacked_float32_model_and_decodes_exactly(tmp_path):
    from medusa_lib.core.eagle import new_eagle_head
    from medusa_lib.core.eagle_io import load_eagle
    from medusa_lib.core.packing import Int8Linear

    int8_here()
    model = prepacked_llama()
    new_eagle_head(model).save(tmp_path)
    head, floats = load_eagle(tmp_path, model=model), load_eagle(tmp_path, model=model, int8=False)
    assert head.int8 and not floats.int8
    assert sum(isinstance(m, Int8Linear) for m in head.layer.modules()) == 7  # q, k, v, o, gate, up, down
    assert not isinstance(head.fc, Int8Linear) and not any(isinstance(m, Int8Linear) for m in floats.modules())
    assert list(head.state_dict()) == list(floats.state_dict())  # the same checkpoint, saved as it was
    g = torch.randn(3, 64)
    with torch.no_grad():
        head.logits(g)
        assert isinstance(head._proj, Int8Linear)
        assert torch.allclose(head.logits(g), floats.logits(g), atol=0.05 * floats.logits(g).abs().max().item())
    n = 40
    cfg = DecodeConfig(max_new_tokens=n, stop_on_eos=False)
    gen = model.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    res = run_method(model, PROMPT, method="medusa-greedy", eagle=head, config=cfg)
    assert res.tokens == gen[0, len(PROMPT) :].tolist()


def test_heads_project_their_drafts_in_int8_on_a_prepacked_float32_model(tmp_path):
    from medusa_lib.core.packing import Int8Linear

    int8_here()
    model = prepacked_llama()
    made = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, num_proposal_tokens=100))
    torch.manual_seed(1)
    made.proposal_ids.copy_(torch.randperm(320)[:100].sort().values)
    made.save(tmp_path)
    heads, floats = load_heads(tmp_path, model=model), load_heads(tmp_path, model=model, int8=False)
    assert heads.int8 and not floats.int8
    assert isinstance(heads.proposal_projection(model.lm_head), Int8Linear)
    assert isinstance(floats.proposal_projection(model.lm_head), PackedLinear)
    assert not any(isinstance(m, Int8Linear) for m in heads.modules())  # the ResBlocks stay float
    cfg = DecodeConfig(max_new_tokens=32, stop_on_eos=False)
    plain = run_method(model, PROMPT, method="plain", config=cfg).tokens
    tree = get_tree("topk-3x2x1")
    assert run_method(model, PROMPT, method="medusa-greedy", heads=heads, tree=tree, config=cfg).tokens == plain


def test_int8_drafts_only_where_they_run(monkeypatch, tmp_path):
    import medusa_lib.core.packing as M
    from medusa_lib.core.eagle import new_eagle_head
    from medusa_lib.core.eagle_io import load_eagle

    stock = make_model("llama")  # not pre-packed: the stock float drafts
    assert not M.int8_fits(stock)
    assert not M.int8_fits(prepacked_llama().to(torch.bfloat16))  # bfloat16 CPUs keep their float drafts

    def broken(*args, **kwargs):
        raise RuntimeError("no fbgemm on this platform")

    monkeypatch.setattr(M, "_INT8_WORKS", [])
    monkeypatch.setattr(torch.ops.quantized, "linear_prepack", broken)
    model = prepacked_llama()
    assert not M.int8_fits(model)
    new_eagle_head(model).save(tmp_path)
    head = load_eagle(tmp_path, model=model)
    assert not head.int8 and not any(isinstance(m, M.Int8Linear) for m in head.modules())


def test_int8_linear_packs_again_after_its_weight_changes_in_place():
    from medusa_lib.core.packing import Int8Linear

    int8_here()
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 128).requires_grad_(False)
    q = Int8Linear(lin)
    x = torch.randn(4, 64)
    before = q(x)
    lin.weight.mul_(-2.0)  # a training step or a load_state_dict writes the same parameter
    lin.bias.add_(1.0)
    after, want = q(x), lin(x)
    assert not torch.allclose(after, before)
    assert (after - want).abs().max() < 0.03 * want.abs().max()
    with torch.inference_mode():  # rows gathered under inference mode (a drafter's projection) keep no version count
        rows = torch.randn(32, 64)
        frozen = Int8Linear(torch.nn.Linear(64, 32, bias=False))
        frozen.weight = torch.nn.Parameter(rows, requires_grad=False)
        frozen._pack()
        assert (frozen(x) - x @ rows.T).abs().max() < 0.03 * (x @ rows.T).abs().max()


def test_asking_for_int8_where_it_cannot_run_keeps_float_drafts_and_says_nothing_of_int8(tmp_path):
    from medusa_lib.core.eagle import new_eagle_head
    from medusa_lib.core.eagle_io import load_eagle
    from medusa_lib.core.packing import Int8Linear
    from medusa_lib.present.drafter import Drafters

    model = make_model("llama").to(torch.bfloat16).requires_grad_(False)  # int8 drafts need float32
    new_eagle_head(model).save(tmp_path / "eagle")
    head = load_eagle(tmp_path / "eagle", model=model, int8=True)
    assert not head.int8 and not any(isinstance(m, Int8Linear) for m in head.modules())
    made = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, num_proposal_tokens=100))
    made.save(tmp_path / "heads")
    heads = load_heads(tmp_path / "heads", model=model, int8=True)
    assert not heads.int8 and not isinstance(heads.proposal_projection(model.lm_head), Int8Linear)
    assert "int8" not in Drafters({"eagle": {"bfloat16": head}}, "medusa").note_of("eagle")


def test_the_page_names_the_numerics_whose_eagle_drafts_in_int8(tmp_path):
    from medusa_lib.core.eagle import new_eagle_head
    from medusa_lib.core.eagle_io import load_eagle
    from medusa_lib.present.drafter import Drafters

    int8_here()
    model = prepacked_llama()
    new_eagle_head(model).save(tmp_path)
    bf16 = load_eagle(tmp_path, model=make_model("llama").to(torch.bfloat16))
    note = Drafters({"eagle": {"bfloat16": bf16, "float32": load_eagle(tmp_path, model=model)}}, "medusa").note_of(
        "eagle"
    )
    assert note.endswith("In float32 it drafts in int8 here (its projection, attention and MLP); decoding stays exact.")


def test_heads_switched_to_int8_and_back_rebuild_their_projection(tmp_path):
    from medusa_lib.core.packing import Int8Linear

    int8_here()
    model = prepacked_llama()
    made = MedusaHeads(HeadsConfig(hidden_size=64, vocab_size=320, num_heads=3, num_proposal_tokens=100))
    made.save(tmp_path)
    heads = load_heads(tmp_path, model=model, int8=False)
    assert isinstance(heads.proposal_projection(model.lm_head), PackedLinear)
    heads.int8 = True
    assert isinstance(heads.proposal_projection(model.lm_head), Int8Linear)
    heads.int8 = False
    assert isinstance(heads.proposal_projection(model.lm_head), PackedLinear)
