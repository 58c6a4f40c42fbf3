"""Memory given back after a long run: what its caches and attention buffers held goes back to the system
(``release_memory``, which ``Playground.run`` calls when a run ends or is stopped)."""

from __future__ import annotations

import ctypes
import gc

import torch

from ..core.model import input_device

# after a run whose prompt + budget reach this, freed memory goes back to the system
LONG_RUN_TOKENS = 1024


def release_memory(model, *, tokens: int, keep_device_cache: bool = False) -> None:
    """After a long run, give the memory its caches and attention buffers held back to the system.

    CUDA's caching allocator keeps freed blocks and glibc keeps freed heap pages, so without this a
    server stays at the peak of its longest prompt (docs/serving.md has the figures). Short runs skip
    it: they barely grow memory, and reallocating is not free. ``keep_device_cache`` (a captured
    static engine is loaded): CUDA's cached blocks stay, so its next run pays no cudaMalloc."""
    if tokens < LONG_RUN_TOKENS:
        return
    gc.collect()
    # with a captured engine, an emptied allocator would make the next run pay cudaMalloc
    if input_device(model).type == "cuda" and not keep_device_cache:
        torch.cuda.empty_cache()
    elif _malloc_trim is not None:
        _malloc_trim(0)


def _libc_malloc_trim():
    try:
        # glibc only (Linux); elsewhere freed memory stays with the process
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None


_malloc_trim = _libc_malloc_trim()


__all__ = ["LONG_RUN_TOKENS", "release_memory"]
