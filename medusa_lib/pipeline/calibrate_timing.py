"""Decoders timed against plain greedy, paired by prompt, and the default picked from their speed-ups.

Every decoder runs one after another on each prompt, on the one device; a decoder's speed-up is the
median over runs of its tokens/s over plain's on the same prompt in the same round, which keeps out
what differs between prompts and a shared machine's slow drifts. ``calibrate.py`` times its trees
with it, ``eagle_tune.py`` its node budgets; the default is the smallest tree within a tie of the
fastest (``pick_default``).
"""

from __future__ import annotations

import statistics
import sys

from tqdm import tqdm

from ..core.compose import make_decoder
from ..core.config import DecodeConfig
from ..core.engine import Engine


def measure(
    model,
    heads,
    trees: dict,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    repeats: int = 1,
    lookup: int = 0,
    engine: Engine | None = None,
) -> dict:
    """Per decoder (plain and each tree): median tokens/s, mean tokens/step, and ``speedup``, the
    median over runs of its tokens/s over plain's on the same prompt in the same round. The pairing
    keeps out what differs between prompts (answer length, how predictable) and slow drifts of a
    shared machine, which a ratio of medians over different prompts keeps in. ``engine``: the
    cache and captured steps the playground runs on this device (``prepare_engine``), so the
    trees are timed as they will run."""
    cfg = DecodeConfig(
        max_new_tokens=max_new_tokens, record_detail=False, lookup=lookup, cache=engine.cache if engine else "dynamic"
    )
    shared = engine.static_kv if engine else None
    decoders = {"plain": make_decoder(model, method="plain", config=cfg, static_kv=shared)}
    decoders.update(
        {
            name: make_decoder(model, method="medusa-greedy", heads=heads, tree=t, config=cfg, static_kv=shared)
            for name, t in trees.items()
        }
    )
    return time_decoders(decoders, prompt_ids, repeats=repeats)


def time_decoders(decoders: dict, prompt_ids: list[list[int]], *, repeats: int = 1) -> dict:
    """``decoders`` (their first ``plain``) timed one after another on every prompt, ``repeats`` rounds:
    per decoder the median tokens/s, mean tokens/step and ``speedup``, the median over runs of its
    tokens/s over plain's on the same prompt in the same round (``measure``)."""
    # warm-up: a first run builds packed weights and caches
    for dec in decoders.values():
        dec.run(prompt_ids[0][:16])
    rates: dict[str, list[float]] = {n: [] for n in decoders}
    tps: dict[str, list[float]] = {n: [] for n in decoders}
    rounds = [ids for ids in prompt_ids for _ in range(repeats)]
    for ids in tqdm(rounds, desc=f"timing plain + {len(decoders) - 1}", unit="prompt", file=sys.stdout):
        # one after another on the one device
        for name, dec in decoders.items():
            res = dec.run(ids)
            rates[name].append(res.tokens_per_second)
            tps[name].append(res.tokens_per_step)
    return {
        n: {
            "tok_s": statistics.median(rates[n]),
            "tokens_per_step": statistics.fmean(tps[n]),
            "speedup": statistics.median(r / p for r, p in zip(rates[n], rates["plain"])),
        }
        for n in decoders
    }


def pick_default(speeds: dict[str, float], nodes: dict[str, int], tolerance: float = 0.02) -> str:
    """The smallest tree whose measured speed (tokens/s, or speed-up over plain) is within ``tolerance`` of
    the fastest one.

    Trees a few percent apart are a tie on a shared CPU (one run of ~10 prompts moves by about
    that much), and the smaller tree step is cheaper at longer contexts and under contention.
    """
    fastest = max(speeds.values())
    return min((n for n in speeds if speeds[n] >= (1 - tolerance) * fastest), key=lambda n: (nodes[n], -speeds[n]))
