"""The static path (core/kv.py): fixed-shape steps over a StaticCache, shared captured caches, capture.

Exactness with both caches is tested in test_decoding.py (every exactness test runs both kinds);
here: the shapes really are fixed, the lookup branch is always there, a shared cache serves one
run at a time and is left clean, refusals and bad settings get one sentence, and a compiled
capture gives the eager tokens without compiling inside a run."""

import pytest
import torch
from conftest import OracleHeads, make_model, random_heads

from medusa_lib import DecodeConfig, DecodeError, build_tree, cartesian_choices, chain_choices
from medusa_lib.core.attention import use_packed_gqa
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.kv import StaticKV, compact_cache, new_cache, new_static_cache
from medusa_lib.core.tree import tree_attention_bias

PROMPT = [1, 17, 33, 250, 99, 4, 61]
TREE = build_tree(cartesian_choices([3, 2, 2]))


@pytest.fixture(scope="module")
def llama():
    model = make_model("llama")
    use_packed_gqa(model)
    return model


def plain(model, n, cache="dynamic"):
    return run_method(
        model, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=n, stop_on_eos=False, cache=cache)
    ).tokens


def forward_shapes(model):
    """(query length, key length of the mask) of every forward the body makes, via a pre-hook."""
    seen = []
    hook = model.base_model.register_forward_pre_hook(
        lambda m, args, kw: seen.append(
            (kw["input_ids"].shape[1], None if kw.get("attention_mask") is None else kw["attention_mask"].shape[-1])
        ),
        with_kwargs=True,
    )
    return seen, hook


@pytest.mark.parametrize("method", ["plain", "medusa-greedy", "medusa-sample", "medusa-typical"])
def test_every_decode_step_has_one_fixed_shape(llama, method):
    ref = plain(llama, 48)
    heads = None if method == "plain" else OracleHeads(llama, PROMPT + ref + [0] * 8)
    cfg = DecodeConfig(
        max_new_tokens=40,
        stop_on_eos=False,
        cache="static",
        lookup=3,
        temperature=0.8 if method != "medusa-greedy" and method != "plain" else 0.0,
    )
    dec = make_decoder(llama, method=method, heads=heads, tree=None if method == "plain" else TREE, config=cfg)
    seen, hook = forward_shapes(llama)
    try:
        res = dec.run(PROMPT)
    finally:
        hook.remove()
    seen = [
        s for s in seen if s != (1, None)
    ]  # the one-token forward that allocates a new static cache (StaticKV.bind)
    prefill, steps = seen[0], seen[1:]
    assert prefill[0] == len(PROMPT)
    width = 1 if method == "plain" else TREE.num_nodes + 3  # the tree and its lookup branch, every step
    max_len = (
        -(-(len(PROMPT) + 40 + width) // 64) * 64
    )  # the run's own cache, its length rounded up to a multiple of 64
    assert steps and set(steps) == {(width, max_len)}, set(steps)
    assert len(steps) == res.decode_steps and res.engine == "static"


def test_the_lookup_branch_is_always_there_and_dead_where_the_context_has_no_match(llama):
    heads = random_heads(4, shared=True)
    cfg = DecodeConfig(max_new_tokens=12, stop_on_eos=False, cache="static", lookup=4)
    res = run_method(llama, PROMPT, method="medusa-greedy", heads=heads, tree=build_tree(chain_choices(2)), config=cfg)
    assert res.tokens == plain(llama, 12)
    for s in res.steps[1:]:
        # the fixed shape: the heads' chain of 2 and the lookup chain of 4
        assert s.tree.lookup == 4 and s.tree.num_nodes == 3 + 4
        # The prompt's tokens are all different: nothing matched, so no chain node is ever accepted
        # (they are dead that step) and no token counts as a lookup token.
        assert all(j < 3 for j in s.accepted_nodes) and s.lookup_accepted == 0


def test_dynamic_and_static_lookup_runs_agree_token_for_token(llama):
    ref = plain(llama, 60)
    heads = OracleHeads(llama, PROMPT + ref + [0] * 8)
    for lookup in (0, 2, 5):
        runs = [
            run_method(
                llama,
                PROMPT,
                method="medusa-greedy",
                heads=heads,
                tree=TREE,
                config=DecodeConfig(max_new_tokens=60, stop_on_eos=False, cache=c, lookup=lookup),
            )
            for c in ("dynamic", "static")
        ]
        assert runs[0].tokens == runs[1].tokens == ref[:60]
        assert runs[1].tokens_per_step > 2.5


def test_a_shared_static_cache_serves_one_run_at_a_time_and_is_left_clean(llama):
    ref = plain(llama, 30)
    kv = StaticKV(llama, max_len=128)
    cfg = DecodeConfig(max_new_tokens=30, stop_on_eos=False, cache="static")
    dec = make_decoder(
        llama, method="medusa-greedy", heads=random_heads(4, shared=True), tree=TREE, config=cfg, static_kv=kv
    )
    a, b = dec.steps(PROMPT), dec.steps(PROMPT)
    first_a = next(a)  # run a holds the shared cache while it is suspended
    assert not kv.claim()
    tokens_b = [t for s in b for t in s.tokens]  # run b gets a fresh cache of its own
    tokens_a = list(first_a.tokens) + [t for s in a for t in s.tokens]
    assert tokens_a == tokens_b == ref
    assert kv.claim()  # a finished: the cache is free again
    kv.release()
    for _ in range(2):  # reused: stale slots of the previous run are masked, never read
        assert dec.run(PROMPT).tokens == ref
    stopped = dec.steps(PROMPT)
    next(stopped)
    stopped.close()  # a consumer that stops early frees it too
    assert kv.claim()
    kv.release()


def test_a_run_too_long_for_the_shared_cache_gets_its_own(llama):
    kv = StaticKV(llama, max_len=20)
    cfg = DecodeConfig(max_new_tokens=30, stop_on_eos=False, cache="static")
    dec = make_decoder(llama, method="plain", config=cfg, static_kv=kv)
    assert dec.run(PROMPT).tokens == plain(llama, 30)
    assert kv.claim()  # never taken


@pytest.mark.parametrize("accepted", [[0, 2, 7], [0, 1, 5], [0], [0, 1, 4]])  # moved, last slot moved, in place
def test_static_compaction_equals_a_fresh_cache_of_the_accepted_path(llama, accepted):
    tree = TREE
    torch.manual_seed(5)
    tokens = torch.randint(3, 300, (tree.num_nodes,))
    nodes = torch.tensor(accepted)
    P, n, S = len(PROMPT), len(accepted), 64
    body = llama.base_model
    with torch.no_grad():
        cache = new_static_cache(llama, S)
        body(
            input_ids=torch.tensor([PROMPT]), position_ids=torch.arange(P)[None], past_key_values=cache, use_cache=True
        )
        mask = torch.full((1, 1, tree.num_nodes, S), torch.finfo(torch.float32).min)
        mask[..., :P] = 0
        mask[0, 0, :, P : P + tree.num_nodes] = tree_attention_bias(tree, torch.float32)
        body(
            input_ids=tokens[None],
            attention_mask=mask,
            position_ids=(tree.position_ids + P)[None],
            past_key_values=cache,
            use_cache=True,
        )
        compact_cache(cache, P, nodes, tree.num_nodes)
        assert int(cache.get_seq_length()) == P + n
        fresh = new_cache()
        body(input_ids=torch.cat([torch.tensor(PROMPT), tokens[nodes]])[None], past_key_values=fresh, use_cache=True)
    for a, b in zip(cache.layers, fresh.layers):
        assert torch.allclose(a.keys[:, :, : P + n], b.keys, atol=1e-5) and torch.allclose(
            a.values[:, :, : P + n], b.values, atol=1e-5
        )


def test_a_model_the_static_path_refuses_runs_dynamic_with_a_note(llama):
    model = make_model("qwen2")
    model.hf_device_map = {
        "model.layers.0": "cpu",
        "model.layers.1": 0,
    }  # as accelerate marks a model spread over two devices
    dec = make_decoder(
        model,
        method="medusa-greedy",
        heads=random_heads(4, shared=True),
        tree=TREE,
        config=DecodeConfig(max_new_tokens=16, stop_on_eos=False, cache="static"),
    )
    assert dec.note and dec.note.endswith("it runs with the dynamic cache.") and "several devices" in dec.note
    res = dec.run(PROMPT)
    assert res.engine == "dynamic"
    assert (
        res.tokens
        == run_method(model, PROMPT, method="plain", config=DecodeConfig(max_new_tokens=16, stop_on_eos=False)).tokens
    )


def test_bad_cache_and_capture_settings_get_one_sentence(llama):
    with pytest.raises(DecodeError, match=r"^cache must be one of dynamic, static \(got 'fast'\)\.$"):
        make_decoder(llama, method="plain", config=DecodeConfig(cache="fast"))
    with pytest.raises(ValueError, match="cuda-graph capture needs the model on a CUDA device"):
        StaticKV(llama, max_len=32, capture="cuda-graph")
    with pytest.raises(ValueError, match="capture must be one of none, compile, cuda-graph"):
        StaticKV(llama, max_len=32, capture="graphs")


@pytest.mark.slow
def test_a_compiled_capture_gives_the_eager_tokens_and_never_compiles_inside_a_run():
    """torch.compile of the whole-step programs (CPU here; on CUDA the same code with CUDA graphs):
    compiled once per program before the first run (static_run.ready), then every run calls it."""
    import torch._dynamo

    from medusa_lib.core.static_run import ready

    model = make_model("llama")
    ref = plain(model, 40)
    heads = random_heads(4, shared=True, path=True)
    kv = StaticKV(model, max_len=160, capture="compile")
    cfg = DecodeConfig(max_new_tokens=40, stop_on_eos=False, cache="static", lookup=3)
    medusa = make_decoder(model, method="medusa-greedy", heads=heads, tree=TREE, config=cfg, static_kv=kv)
    plain_dec = make_decoder(model, method="plain", config=cfg, static_kv=kv)
    with torch.inference_mode():
        for d in (medusa, plain_dec):
            ready(d, kv)
    assert (
        kv.capture_seconds > 0 and kv.programs_captured == 2
    )  # the tree step, and the root-only step both decoders share
    torch._dynamo.config.error_on_recompile = True
    try:
        for _ in range(2):
            res = medusa.run(PROMPT)
            assert res.tokens == ref and res.engine == "static, compile"
            assert plain_dec.run(PROMPT).tokens == ref
    finally:
        torch._dynamo.config.error_on_recompile = False


# ------------------------------------------------------------------ the playground's engine
def test_a_static_playground_shows_the_dynamic_playgrounds_tokens_and_names_its_engine():
    from conftest import PROMPT as TEXT
    from conftest import tiny_playground

    from medusa_lib.present import Settings

    dynamic, static = tiny_playground(), tiny_playground(static=True)
    a, b = dynamic.compare(TEXT, Settings(max_new_tokens=40)), static.compare(TEXT, Settings(max_new_tokens=40))
    for m in ("plain", "medusa-greedy"):  # exact methods: the same tokens whatever the cache
        assert a["methods"][m]["token_ids"] == b["methods"][m]["token_ids"], m
    assert b["greedy_match"]["equal"]
    # Typical acceptance is not exact: its text depends on the tree it verifies, and a static step
    # always carries the lookup branch (guessed where the context has no match). Without the
    # branch both engines verify the same trees and agree.
    no_branch = Settings(max_new_tokens=40, lookup=0)
    assert (
        dynamic.compare(TEXT, no_branch)["methods"]["medusa-typical"]["token_ids"]
        == static.compare(TEXT, no_branch)["methods"]["medusa-typical"]["token_ids"]
    )
    assert dynamic.engine == "dynamic KV cache (eager)" and static.engine == "static KV cache (eager)"
    assert static.static_kv.claim()  # every run gave it back
    static.static_kv.release()


def test_four_users_at_once_on_one_shared_static_cache_get_their_own_tokens():
    """Threads running the playground at the same moment (no queue in between): one run holds the
    shared static cache, the others get caches of their own; every answer equals its run alone."""
    import threading

    from conftest import tiny_playground

    from medusa_lib.present import Settings

    pg = tiny_playground(oracle=False, static=True)
    prompts = [f"w{10 + i} w{40 + i} w{70 + i}" for i in range(4)]
    alone = [pg.compare(p, Settings(max_new_tokens=32))["methods"] for p in prompts]
    got: dict[int, dict] = {}
    barrier = threading.Barrier(4)

    def user(i):
        barrier.wait()
        got[i] = pg.compare(prompts[i], Settings(max_new_tokens=32))["methods"]

    threads = [threading.Thread(target=user, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert {m: r["token_ids"] for m, r in got[i].items()} == {m: r["token_ids"] for m, r in alone[i].items()}, (
            prompts[i]
        )
    assert pg.static_kv.claim()
    pg.static_kv.release()


def test_the_engine_setting_is_checked_and_a_capture_needs_its_device(llama):
    from medusa_lib.core.engine import EngineError, prepare_engine

    said = []
    assert prepare_engine(llama, max_len=64, say=said.append).cache == "dynamic"  # auto on a CPU: today's dynamic cache
    eager = prepare_engine(llama, cache="static", max_len=64, say=said.append)
    assert (eager.cache, eager.static_kv, eager.description) == (
        "static",
        None,
        "static KV cache (eager)",
    )  # nothing to capture on a CPU by default
    with pytest.raises(EngineError, match="^CUDA-graph capture needs a GPU; use --capture none or compile on a CPU.$"):
        prepare_engine(llama, cache="static", capture="cuda-graph", max_len=64)
    with pytest.raises(EngineError, match="only the static cache has; use --cache static or --capture none.$"):
        prepare_engine(llama, cache="dynamic", capture="compile", max_len=64)
    with pytest.raises(
        EngineError, match="^The engine must be a cache of dynamic, static and a capture of none, compile, cuda-graph"
    ):
        prepare_engine(llama, cache="paged", capture="none", max_len=64)
    spread = make_model("qwen2")
    spread.hf_device_map = {"model.layers.0": "cpu", "model.layers.1": 0}
    out = prepare_engine(spread, cache="static", capture="compile", max_len=64, say=said.append)
    assert (
        out.cache == "dynamic"
        and out.static_kv is None
        and said[-1].endswith("it runs with the dynamic cache.")
        and out.description == said[-1]
    )


def test_compiling_pre_packed_cpu_weights_falls_back_to_eager_static_steps_with_a_sentence():
    from medusa_lib.core.engine import prepare_engine
    from medusa_lib.core.packing import prepack_linear_weights

    model = make_model("llama")
    if not prepack_linear_weights(model):
        pytest.skip("oneDNN pre-packing is not available on this platform")
    said = []
    engine = prepare_engine(model, cache="static", capture="compile", max_len=64, say=said.append)
    assert (engine.cache, engine.static_kv) == ("static", None) and engine.description == said[0]
    assert said == [
        "torch.compile cannot compile the pre-packed CPU weights (packing.py); runs use the static cache eagerly "
        "(load the model with prepack=False, bench --no-prepack, to compile)."
    ]


def test_only_the_context_match_counts_as_lookup_tokens_not_the_guesses_that_pad_it(llama):
    """A static step pads a short n-gram match with guesses; accepted guesses are the heads'
    (or the base model's) tokens, not the context's, so they do not count as lookup tokens."""
    from medusa_lib.core.decoding import Proposal, Verdict
    from medusa_lib.core.drafters.branch import chain_credit

    tree = build_tree(chain_choices(2))
    dec = make_decoder(
        llama,
        method="medusa-greedy",
        heads=random_heads(4, shared=True),
        tree=tree,
        config=DecodeConfig(cache="static", lookup=3),
    )
    # the drafter's tree with the chain of 3 beside it
    bufs = dec.drafter.buffers
    L = tree.num_nodes  # the branch's nodes are L, L + 1, L + 2
    tokens = torch.arange(5, 5 + bufs.num_nodes)
    for matched, expected in [(0, 0), (1, 1), (2, 2), (3, 3)]:
        verdict = Verdict(
            best=bufs.cpu.retrieve_indices.shape[0] - 1,
            accept_length=3,
            nodes=torch.tensor([0, L, L + 1, L + 2]),
            bonus=torch.tensor(9),
        )
        step = dec._decode_step(
            1,
            [6, 7, 8, 9],
            None,
            Proposal(bufs, tokens, chain_credit(L, matched)),
            verdict,
            times=(0.0, 1.0, 2.0, 3.0, 4.0),
        )
        assert step.lookup_accepted == expected and step.accept_length == 3


def test_with_a_capturing_engine_a_run_first_captures_its_programs(monkeypatch):
    """The page's other trees and rules: their whole-step programs are captured before the timed
    runs (never while another run holds the shared cache), so no column runs eagerly beside
    captured ones. Capturing needs a GPU; here the StaticKV says it captures and ``ready`` is watched."""
    from conftest import PROMPT as TEXT
    from conftest import tiny_playground

    from medusa_lib.present import Settings

    pg = tiny_playground(static=True)
    kv = pg.static_kv
    kv.capture = "cuda-graph"
    seen = []
    monkeypatch.setattr("medusa_lib.present.playground.ready", lambda d, k, say=None: seen.append((d.method, k is kv)))
    settings = Settings(max_new_tokens=8, tree="chain-2", lookup=3, temperature=0.0)
    ids, decoders = pg.prepare(TEXT, settings)
    assert kv.claim()  # another run holds the cache: nothing is captured now
    try:
        pg.warmup(ids, decoders.values())
    finally:
        kv.release()
    assert seen == []
    pg.warmup(ids, decoders.values())
    assert seen == [(d.method, True) for d in decoders.values()] and len(seen) == 3


def test_each_numerics_copy_runs_on_its_own_shared_static_cache():
    """A 16-bit server's float32 copy gets a captured cache of its own (Playground.load on a GPU), so
    both numerics time the same engine; here both caches are eager stand-ins."""
    import copy

    from conftest import PROMPT as TEXT
    from conftest import tiny_playground

    from medusa_lib.present import Playground, Settings

    base = tiny_playground(oracle=False)
    m16 = copy.deepcopy(base.model).to(torch.bfloat16)
    kv32, kv16 = StaticKV(base.model, max_len=256), StaticKV(m16, max_len=256)
    pg = Playground(
        m16,
        base.tokenizer,
        copy.deepcopy(base.heads).to(torch.bfloat16),
        heads_note="test heads",
        cache="static",
        static_kv=kv16,
        variants={"float32": (base.model, base.heads)},
        variant_kv={"float32": kv32},
    )
    for numerics, kv in (("float32", kv32), ("bfloat16", kv16)):
        _, decoders = pg.prepare(TEXT, Settings(max_new_tokens=8, numerics=numerics))
        assert {d.static_kv for d in decoders.values()} == {kv}
        ends = [
            ev.record.result.engine
            for ev in pg.stream(TEXT, Settings(max_new_tokens=8, numerics=numerics))
            if ev.kind == "end"
        ]
        assert ends == ["static"] * 3
