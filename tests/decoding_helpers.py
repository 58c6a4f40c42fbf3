"""What the decoding tests share: the prompt, the trees, the caches and the tiny model families they run on."""

from conftest import make_model

from medusa_lib import DecodeConfig, build_tree, cartesian_choices, chain_choices, get_tree
from medusa_lib.core.attention import use_packed_gqa
from medusa_lib.core.compose import run_method

PROMPT = [1, 17, 33, 250, 99, 4, 61]
N_NEW = 64
TREES = {
    "chain-4": build_tree(chain_choices(4)),
    "cartesian-3x2x2": build_tree(cartesian_choices([3, 2, 2])),
    "mc_sim_7b_63": get_tree("mc_sim_7b_63"),
}
# every exactness test runs with both kinds of KV cache (core/kv.py)
CACHES = ["dynamic", "static"]
# llama-packed: GQA through medusa_lib.core.attention (as load_model sets up on CPU)
ARCHS = ["llama", "qwen2", "gpt2", "llama-packed"]


def model_for(arch: str, attn: str = "sdpa"):
    if arch.endswith("-packed"):
        model = make_model(arch.removesuffix("-packed"), attn=attn)
        assert use_packed_gqa(model) == (attn == "sdpa")
        return model
    return make_model(arch, attn=attn)


def plain_tokens(model, n=N_NEW, prompt=PROMPT, *, cache="dynamic"):
    return run_method(
        model, prompt, method="plain", config=DecodeConfig(max_new_tokens=n, stop_on_eos=False, cache=cache)
    ).tokens
