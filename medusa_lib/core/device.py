"""The device and the numerics a model runs in: which device ``auto`` means, the dtype that is fastest there, and
the device's name in messages and figures.

A CPU with bfloat16 matrix instructions (AVX512-BF16 or AMX) runs bfloat16 fastest; one with only AVX2
emulates it, and float32 is the fast path there (docs/performance.md names the machine of every figure).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .messages import ModelError


def device_name(device: torch.device) -> str:
    """The device as a message names it: 'CPU', or the GPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type.upper()


def device_label(device: torch.device) -> str:
    """The device as a figure's label names it: the GPU's model name, or 'CPU, N threads'."""
    return device_name(device) if device.type != "cpu" else f"CPU, {torch.get_num_threads()} threads"


def resolve_device(device: str | None = None) -> torch.device:
    """'auto' (or None) picks CUDA when present, else CPU."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ModelError(f"Unknown device {device!r}; use cpu, cuda, cuda:0 or auto.") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError("CUDA was asked for but no GPU is visible; use --device cpu.")
    return dev


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def native_bf16_in(flags: str) -> bool:
    """Whether CPU flags (/proc/cpuinfo, or a recorded machine line naming them) hold bfloat16 matrix
    instructions (AVX512-BF16 or AMX)."""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_has_native_bf16() -> bool:
    """True on CPUs with bfloat16 matrix instructions (AVX512-BF16 or AMX), where bf16 is the fastest dtype."""
    try:
        return native_bf16_in(Path("/proc/cpuinfo").read_text())
    except OSError:
        return False


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """'auto' (or None): the fastest dtype that works: bfloat16 on a GPU that supports it (else
    float16), bfloat16 on a CPU with native bf16 instructions, else float32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "", "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ModelError(f"Unknown dtype {dtype!r}; use one of float32, bfloat16, float16 or auto.")
    if DTYPES[dtype] == torch.float16 and device.type == "cpu":
        raise ModelError("float16 is not supported on CPU here; use float32 or bfloat16.")
    return DTYPES[dtype]
