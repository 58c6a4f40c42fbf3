"""The page's Numerics choice: which loaded copy of the model a run uses, and what each one buys.

A 16-bit model (bfloat16, the fast CPU default where it is native) gets a float32 copy when memory
allows (``Playground.load``). Only float32 keeps both identities on every prompt: Medusa greedy ==
plain greedy and Medusa exact sampling == plain sampling with the same seed. In 16 bits a tree
forward over L tokens and a one-token forward sum their products in different orders, so at a
near-tie of the two best tokens the rounding can pick the other one (the badge then says so). The
comparison therefore starts in float32 where a copy is loaded (``default_numerics``), and the line
under the choice says how much faster the 16-bit copy decodes on this device, measured at start-up
(``decode_speeds``), never quoted from another machine.
"""

from __future__ import annotations

import os
import statistics
from typing import Mapping

import torch

from ..core.compose import make_decoder
from ..core.config import DecodeConfig

EXACT = "float32"


def dtype_name(model) -> str:
    return str(next(model.parameters()).dtype).replace("torch.", "")


def free_memory(device: torch.device) -> int:
    """Bytes free on the device (CUDA) or in RAM (elsewhere); 0 when unknown, so no copy is loaded."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError, RuntimeError):
        return 0


def default_numerics(names) -> str:
    """What a run uses when it names no numerics: the exact float32 copy when it is loaded, else the loaded
    dtype (the first)."""
    names = list(names)
    return EXACT if EXACT in names else names[0]


def decode_speeds(variants: Mapping[str, tuple], *, tokens: int = 12, repeats: int = 3) -> dict[str, float]:
    """Plain greedy decode tokens/s of each loaded copy, on one fixed 32-token prompt: a 2-token
    warm-up each, then ``repeats`` runs of ``tokens`` new tokens, the copies taking turns (so a
    change of load hits both); the median per copy. Short enough for every start-up with SmolLM2-135M."""
    runs: dict[str, list[float]] = {name: [] for name in variants}
    decoders = {}
    for name, (model, _) in variants.items():
        vocab = int(model.get_input_embeddings().weight.shape[0])
        # fixed ids, no special tokens
        ids = [(97 * i + 13) % (vocab - 3) + 3 for i in range(32)]
        decoders[name] = (
            make_decoder(model, config=DecodeConfig(max_new_tokens=tokens, stop_on_eos=False, record_detail=False)),
            ids,
        )
        make_decoder(model, config=DecodeConfig(max_new_tokens=2, stop_on_eos=False)).run(ids)
    for _ in range(repeats):
        for name, (decoder, ids) in decoders.items():
            runs[name].append(decoder.run(ids).tokens_per_second)
    return {name: statistics.median(r) for name, r in runs.items()}


def numerics_label(name: str, speeds: Mapping[str, float]) -> str:
    """How the page's choice names a copy: float32 is exact; a 16-bit copy is "fast" only where it
    measured faster than float32 here (a CPU without native bfloat16 emulates it, slower)."""
    if name == EXACT:
        return f"{name} (exact)"
    faster = name not in speeds or EXACT not in speeds or speeds[name] > speeds[EXACT]
    return f"{name} ({'fast' if faster else '16-bit'})"


def numerics_note(speeds: Mapping[str, float], *, device: str) -> str:
    """The line under the Numerics choice: what float32 guarantees, and how fast each 16-bit copy
    decoded against it here at start-up ('' with one copy)."""
    if len(speeds) < 2 or EXACT not in speeds or speeds[EXACT] <= 0:
        return ""
    fast = [(n, v / speeds[EXACT]) for n, v in speeds.items() if n != EXACT]
    faster = "; ".join(
        f"{n} decodes {r:.1f}x as fast as float32 on this {device}"
        if r >= 1
        else (
            f"{n} decodes at {r:.1f}x float32's speed on this {device} "
            f"(no native {n} here: float32 is the fast choice too)"
        )
        for n, r in fast
    )
    names = " and ".join(n for n, _ in fast)
    return (
        "float32 is exact: Medusa greedy writes plain greedy's tokens, and exact sampling plain sampling's, "
        f"on every prompt. {faster} "
        f"(plain decoding, measured at start-up). In {names} a tree step and a one-token step round differently, "
        "so where the model's "
        f"two best tokens nearly tie its Medusa output may differ from plain's (the badge shows where)."
    )


__all__ = ["EXACT", "decode_speeds", "default_numerics", "dtype_name", "free_memory", "numerics_label", "numerics_note"]
