"""Where a run stops (EOS, the context limit, max_new_tokens, a sliding window), what the model's config says
of those limits, and the models and settings a decoder refuses."""

import pytest
from conftest import OracleHeads, make_model, random_heads
from decoding_helpers import CACHES, PROMPT, TREES, plain_tokens

from medusa_lib import DecodeConfig, DecodeError, ModelError
from medusa_lib.core.compose import make_decoder, run_method
from medusa_lib.core.model import model_info


# ------------------------------------------------------------------ stopping and limits
@pytest.mark.parametrize("cache", CACHES)
def test_stops_on_eos_and_reports_it(cache, models):
    model = models["llama"]
    ref = plain_tokens(model, 30, cache=cache)
    eos = ref[12]
    first = ref.index(eos)
    # decoders read the EOS ids from the config each time
    model.generation_config.eos_token_id = eos
    try:
        for method, heads in [("plain", None), ("medusa-greedy", OracleHeads(model, PROMPT + ref + [0] * 8))]:
            res = run_method(
                model,
                PROMPT,
                method=method,
                heads=heads,
                tree=TREES["mc_sim_7b_63"],
                config=DecodeConfig(cache=cache, max_new_tokens=30),
            )
            assert res.tokens == ref[: first + 1] and res.finish_reason == "eos"
    finally:
        model.generation_config.eos_token_id = None


@pytest.mark.parametrize("cache", CACHES)
def test_stops_at_the_context_limit_with_the_same_tokens(cache):
    model = make_model("llama", max_position_embeddings=48)
    res_plain = run_method(
        model, PROMPT, method="plain", config=DecodeConfig(cache=cache, max_new_tokens=200, stop_on_eos=False)
    )
    assert len(PROMPT) + len(res_plain.tokens) == 48 and res_plain.finish_reason == "context"
    ref = res_plain.tokens
    heads = OracleHeads(model, PROMPT + ref + [0] * 8)
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=heads,
        tree=TREES["mc_sim_7b_63"],
        config=DecodeConfig(cache=cache, max_new_tokens=200, stop_on_eos=False),
    )
    assert res.tokens == ref and res.finish_reason == "context"


@pytest.mark.parametrize("cache", CACHES)
def test_max_new_tokens_is_exact_even_when_a_step_accepts_more(cache):
    model = make_model("llama")
    ref = plain_tokens(model, 40, cache=cache)
    heads = OracleHeads(model, PROMPT + ref + [0] * 8)
    for n in (1, 2, 5, 13):
        res = run_method(
            model,
            PROMPT,
            method="medusa-greedy",
            heads=heads,
            tree=TREES["mc_sim_7b_63"],
            config=DecodeConfig(cache=cache, max_new_tokens=n, stop_on_eos=False),
        )
        assert res.tokens == ref[:n] and res.finish_reason == "length"


@pytest.mark.parametrize("cache", CACHES)
def test_sliding_window_caps_the_context_with_a_clear_message(cache):
    model = make_model("mistral", sliding_window=32)
    long_prompt = list(range(3, 40))
    with pytest.raises(DecodeError, match="sliding-window attention of 32 tokens"):
        run_method(model, long_prompt, method="plain")
    res = run_method(
        model,
        PROMPT,
        method="medusa-greedy",
        heads=random_heads(4),
        tree=TREES["chain-4"],
        config=DecodeConfig(cache=cache, max_new_tokens=100, stop_on_eos=False),
    )
    assert len(PROMPT) + len(res.tokens) == 32 and res.finish_reason == "context"
    assert (
        res.tokens
        == run_method(
            model, PROMPT, method="plain", config=DecodeConfig(cache=cache, max_new_tokens=100, stop_on_eos=False)
        ).tokens
    )


def test_unsupported_attention_is_refused():
    model = make_model("llama")
    model.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ModelError, match="'linear_attention' layers"):
        make_decoder(model)
    model2 = make_model("llama")
    model2.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ModelError, match="cannot take a tree mask"):
        make_decoder(model2)


def test_model_info_follows_the_config_without_writing_on_the_model(monkeypatch):
    import gc
    import weakref

    import medusa_lib.core.model as M

    forwards = []
    real = M._check_lm_head_is_the_output
    monkeypatch.setattr(M, "_check_lm_head_is_the_output", lambda m: forwards.append(1) or real(m))
    model = make_model("llama")
    assert model_info(model).eos_token_ids == (2,) and model_info(model).context_limit == 512
    model.generation_config.eos_token_id = [5, 6]
    model.config.max_position_embeddings = 64
    assert (
        make_decoder(model).info
        == model_info(model)
        == M.ModelInfo(context_limit=64, sliding_window=None, eos_token_ids=(5, 6))
    )
    # the tiny forward of the check runs once per model
    assert len(forwards) == 1
    assert "_medusa_model_info" not in vars(model)  # nothing is cached on the model object
    assert model_info(model).context_limit == 64 and len(forwards) == 1
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None  # the cache does not keep a model alive


def test_bad_settings_are_refused(models):
    model = models["llama"]
    with pytest.raises(DecodeError, match="Unknown method"):
        make_decoder(model, method="beam")
    with pytest.raises(DecodeError, match="needs Medusa heads and a tree"):
        make_decoder(model, method="medusa-greedy")
    with pytest.raises(DecodeError, match="tree is 4 levels deep but the heads only predict 2"):
        make_decoder(model, method="medusa-greedy", heads=random_heads(2), tree=TREES["chain-4"])
    with pytest.raises(DecodeError, match="max_new_tokens must be between"):
        make_decoder(model, config=DecodeConfig(max_new_tokens=0))
    with pytest.raises(DecodeError, match="temperature must be 0"):
        make_decoder(model, config=DecodeConfig(temperature=-1))
    with pytest.raises(DecodeError, match="epsilon"):
        make_decoder(model, config=DecodeConfig(posterior_threshold=1.5))
    with pytest.raises(DecodeError, match="prompt is empty"):
        run_method(model, [], method="plain")
