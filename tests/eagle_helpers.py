"""What the EAGLE tests share (test_eagle.py, test_eagle_static.py): a prompt, a small dynamic tree, and
per family a tiny model with a head over-fitted to its own continuations (long paths accepted) and an
untrained one."""

import torch
from conftest import make_model

from medusa_lib import DecodeConfig
from medusa_lib.core.compose import run_method
from medusa_lib.core.dynamic_tree import DynamicTreeConfig
from medusa_lib.core.eagle import new_eagle_head
from medusa_lib.pipeline.eagle_loss import eagle_loss
from medusa_lib.pipeline.feature_cache import FeatureCache

PROMPT = [1, 17, 33, 250, 99, 4, 61]
N_NEW = 32
TREE = DynamicTreeConfig(top_k=2, depth=4, num_nodes=8)
ARCHS = ["llama", "qwen2"]


# ------------------------------------------------------------------ a drafter that knows the model
def trained_head(model, sequences: list[list[int]], steps: int = 120):
    """A tiny EAGLE head over-fitted to the model's own continuations, so long paths get accepted."""
    with torch.no_grad():
        records = [{"prompt_ids": s[: len(PROMPT)], "answer_ids": s[len(PROMPT) :]} for s in sequences]
        cache = FeatureCache.build(model, records, desc="test features")
    head = new_eagle_head(model, tree=TREE)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    proj = head.projection_weight().detach().float()
    for _ in range(steps):
        loss, _ = eagle_loss(head, proj, cache, list(range(len(records))), noise=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval().requires_grad_(False)


def eagle_setups() -> dict:
    """{family: (model, trained head, untrained head)}."""
    out = {}
    for arch in ARCHS:
        model = make_model(arch)
        greedy = plain(model, N_NEW + 16)
        sampled = [run_method(model, PROMPT, method="plain", config=sampling(s, N_NEW + 16)).tokens for s in (0, 5)]
        out[arch] = (
            model,
            trained_head(model, [PROMPT + greedy, *(PROMPT + s for s in sampled)]),
            new_eagle_head(model, tree=TREE).eval(),
        )
    return out


def plain(model, n, *, prompt=PROMPT):
    return run_method(model, prompt, method="plain", config=DecodeConfig(max_new_tokens=n, stop_on_eos=False)).tokens


def sampling(seed, n, temperature=0.9, top_p=1.0, lookup=0):
    return DecodeConfig(
        max_new_tokens=n, stop_on_eos=False, temperature=temperature, seed=seed, top_p=top_p, lookup=lookup
    )
