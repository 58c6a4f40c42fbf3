"""Pre-packed oneDNN linear weights, for CPU decoding.

A stock CPU ``nn.Linear`` hands oneDNN (bfloat16) or MKL (float32) a row-major weight that is
re-packed inside every call; for the small matrices of a decoding step that packing is a large
share of the time, and more so for 2+ rows (a tree step) than for one. :class:`PackedLinear`
reorders the weight once, at load time, into oneDNN's blocked layout and calls the op that
torch.compile emits for frozen linears. The maths is that of ``nn.Linear``: y = x W^T + b
(bfloat16 results bit-identical; float32 ones differ in rounding only, oneDNN instead of MKL).
"""

from __future__ import annotations

import torch
from torch import nn

_PACKING_WORKS: dict[torch.dtype, bool] = {}  # dtype -> the packed op runs and agrees here (tried once)


def _packing_works(dtype: torch.dtype) -> bool:
    """Try the packed op once per dtype on a small matrix: a platform where it fails or differs
    (another oneDNN build, an old CPU) keeps stock weights instead of failing to load."""
    if dtype not in _PACKING_WORKS:
        try:
            g = torch.Generator().manual_seed(0)
            w, x = torch.randn(24, 40, generator=g).to(dtype), torch.randn(3, 40, generator=g).to(dtype)
            got = packed_linear(x, pack_weight(w))
            _PACKING_WORKS[dtype] = bool(
                torch.allclose(got.float(), nn.functional.linear(x, w).float(), atol=1e-2, rtol=1e-2)
            )
        except (RuntimeError, AttributeError, NotImplementedError):
            _PACKING_WORKS[dtype] = False
    return _PACKING_WORKS[dtype]


def can_prepack(weight: torch.Tensor) -> bool:
    """oneDNN can pre-pack float32 and bfloat16 weights that live on the CPU (checked once per dtype)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and _packing_works(weight.dtype)
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] weight reordered once into oneDNN's blocked layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T + b with a weight from :func:`pack_weight` (the op torch.compile emits for frozen linears)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """A frozen ``nn.Linear`` whose weight oneDNN reordered once, at load time.

    The original parameter stays in place (``state_dict``, tied embeddings and the Medusa heads
    read it); any call the packed copy cannot serve (autograd, another device or dtype) falls
    back to it.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = pack_weight(linear.weight)  # plain attribute: not in state_dict, never moved

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (
            x.device.type != "cpu"
            or x.dtype != self.packed.dtype
            or w.device.type != "cpu"
            or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
        ):
            return nn.functional.linear(x, w, self.bias)
        return packed_linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            "packed=oneDNN"
        )


def is_prepacked(model: nn.Module) -> bool:
    """True when :func:`prepack_linear_weights` swapped some of the model's linears."""
    return any(isinstance(m, PackedLinear) for m in model.modules())


def prepack_linear_weights(model: nn.Module) -> int:
    """Swap every CPU ``nn.Linear`` of a frozen model for a :class:`PackedLinear`; returns how many.

    The model's maths is unchanged; every caller of the model, ``model.generate`` included, gets
    the same speed-up, so comparisons between methods stay fair.
    """
    n = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and can_prepack(child.weight):
                setattr(module, name, PackedLinear(child))
                n += 1
    return n
