"""Pre-packed oneDNN linear weights, for CPU decoding.

A stock CPU ``nn.Linear`` hands oneDNN (bfloat16) or MKL (float32) a row-major weight that is
re-packed inside every call; for the small matrices of a decoding step that packing is a large
share of the time, and more so for 2+ rows (a tree step) than for one. :class:`PackedLinear`
reorders the weight once, at load time, into oneDNN's blocked layout and calls the op that
torch.compile emits for frozen linears. The maths is that of ``nn.Linear``: y = x W^T + b
(bfloat16 results bit-identical; float32 ones differ in rounding only, oneDNN instead of MKL).

Few-row products are the exception: on an AVX2 CPU oneDNN's packed kernel costs well over its
one-row time from 2 rows on, while MKL's ``W @ x.T`` over the row-major weight streams a few rows at
nearly one row's cost (measured: docs/performance.md). :func:`choose_few_row_kernels` times both on
the model's own weights once, at load, and routes a row count to MKL only where it measured faster by
a margin; the choice is per machine (recorded by the bench) and never applies to one row, autograd or
other dtypes.

A drafter's own matrices (never the model's) can go further: :class:`Int8Linear` holds int8
weights and runs fbgemm's dynamic int8 GEMM, much faster than a float32 few-row product on an
AVX2 CPU. A draft only proposes tokens that the model then verifies, so decoding stays exact;
what int8 changes is how often the drafts are right (measured: docs/performance.md).
"""

from __future__ import annotations

import time
import warnings

import torch
from torch import nn

# dtype -> the packed op runs and agrees here (tried once)
_PACKING_WORKS: dict[torch.dtype, bool] = {}


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

    # row counts that run MKL's W @ x.T (choose_few_row_kernels)
    mkl_rows: frozenset[int] = frozenset()

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        # plain attribute: not in state_dict, never moved
        self.packed = pack_weight(linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (
            x.device.type != "cpu"
            or x.dtype != self.packed.dtype
            or w.device.type != "cpu"
            or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            # Inductor cannot lower a packed weight: a compiled step reads the original one
            or torch.compiler.is_compiling()
        ):
            return nn.functional.linear(x, w, self.bias)
        if self.mkl_rows and x.numel() // self.in_features in self.mkl_rows:
            return mkl_linear(x, w, self.bias)
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


# ---------------------------------------------------------------------- few-row products
# row counts of a small verify step, timed at load
FEW_ROWS = (2, 3, 4, 5, 6)


def mkl_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T + b as MKL's ``W @ x.T`` over the row-major weight (fast for 2-4 rows on some CPUs)."""
    rows = x.numel() // x.shape[-1]
    y = torch.mm(weight, x.reshape(rows, x.shape[-1]).t()).t()
    if bias is not None:
        y = y + bias
    return y.contiguous().view(*x.shape[:-1], weight.shape[0])


def choose_few_row_kernels(
    model: nn.Module, *, rows=FEW_ROWS, rounds: int = 5, margin: float = 1.15, sample_params: int = 24_000_000
) -> tuple[int, ...]:
    """Time oneDNN's packed product against :func:`mkl_linear` for each of ``rows``, over the model's
    own float32 pre-packed weights (the first ``sample_params`` in forward order, streamed from
    memory as in a step), the fastest of ``rounds`` interleaved passes each (the least disturbed by
    anything else running); the row counts where MKL was faster by ``margin`` run through it from
    now on, in every packed linear of the model. Returns them (empty: oneDNN everywhere)."""
    mods = [m for m in model.modules() if isinstance(m, PackedLinear) and m.packed.dtype == torch.float32]
    sample, size = [], 0
    for m in mods:
        if size < sample_params:
            sample.append(m)
            size += m.in_features * m.out_features
    if not sample:
        return ()
    best: dict[tuple[int, str], float] = {}
    with torch.no_grad():
        # the first pass warms up, untimed
        for n in range(rounds + 1):
            for r in rows:
                xs = {m.in_features: torch.randn(r, m.in_features) for m in sample}
                for kind, op in (
                    ("dnn", lambda m: packed_linear(xs[m.in_features], m.packed, m.bias)),
                    ("mkl", lambda m: mkl_linear(xs[m.in_features], m.weight, m.bias)),
                ):
                    t0 = time.perf_counter()
                    for m in sample:
                        op(m)
                    if n:
                        t = time.perf_counter() - t0
                        best[(r, kind)] = min(t, best.get((r, kind), t))
    chosen = tuple(r for r in rows if best[(r, "dnn")] > margin * best[(r, "mkl")])
    for m in mods:
        m.mkl_rows = frozenset(chosen)
    return chosen


def few_row_kernels(model: nn.Module) -> tuple[int, ...]:
    """The row counts that :func:`choose_few_row_kernels` routed to MKL in this model (sorted)."""
    return tuple(sorted(next((m.mkl_rows for m in model.modules() if isinstance(m, PackedLinear)), ())))


# ---------------------------------------------------------------------- int8 drafts
# [whether fbgemm's dynamic int8 linear runs and agrees here] (tried once)
_INT8_WORKS: list[bool] = []


def _int8_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """[out, in] float weight -> fbgemm's packed int8 weight, one symmetric scale per output row."""
    w = weight.detach().float()
    scale = (w.abs().amax(1).clamp(min=1e-12) / 127).double()
    # torch 2.13 flags quantized tensors for removal; can_int8 checks that they still work here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, message=".*quantiz.*deprecated")
        q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float())


def _int8_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    # reduce_range: no AVX2 overflow
    y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]), packed, True)
    return y.reshape(*shape[:-1], y.shape[-1])


def can_int8(weight: torch.Tensor) -> bool:
    """fbgemm's dynamic int8 linear serves float32 CPU weights here (tried once, against float32: a
    platform without the quantized engine, or a torch that dropped it, keeps float drafts)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return False
    if not _INT8_WORKS:
        try:
            g = torch.Generator().manual_seed(0)
            w, x = torch.randn(48, 64, generator=g), torch.randn(5, 64, generator=g)
            got = _int8_linear(x, _int8_pack(w, None))
            _INT8_WORKS.append(bool(torch.allclose(got, x @ w.T, atol=0.5, rtol=0.05)))
        except (RuntimeError, AttributeError, NotImplementedError):
            _INT8_WORKS.append(False)
    return _INT8_WORKS[0]


class Int8Linear(nn.Module):
    """A frozen linear map of a drafter with int8 weights (a scale per output row) and its input
    quantized per call (fbgemm dynamic int8). The float parameter stays in place (``state_dict``,
    training); a call the int8 copy cannot serve (autograd, another device or dtype) uses it."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._pack()

    def _versions(self) -> tuple:
        """Where and how often each parameter was written (an inference-mode tensor keeps no count)."""
        return tuple(
            None if p is None else (p.data_ptr(), -1 if p.is_inference() else p._version)
            for p in (self.weight, self.bias)
        )

    def _pack(self) -> None:
        # plain attribute: not in state_dict, never moved
        self.packed = _int8_pack(self.weight, self.bias)
        # a weight changed in place (a training step, a load) packs again
        self.packed_from = self._versions()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (
            x.device.type != "cpu"
            or x.dtype != torch.float32
            or w.device.type != "cpu"
            or w.dtype != torch.float32
            or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            or torch.compiler.is_compiling()
        ):
            return nn.functional.linear(x, w.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        if self.packed_from != self._versions():
            self._pack()
        return _int8_linear(x, self.packed)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def int8_fits(model: nn.Module) -> bool:
    """Whether a drafter on ``model`` drafts in int8 by default: a CPU model in float32 whose linears
    were pre-packed (never one compiled) where fbgemm works. bfloat16 CPUs keep their float drafts
    (int8 against AVX512-BF16 is not measured)."""
    w = model.get_output_embeddings().weight
    return is_prepacked(model) and can_int8(w)


def int8_linear_weights(module: nn.Module) -> int:
    """Swap every float32 CPU linear (stock or pre-packed) under ``module`` for an :class:`Int8Linear`."""
    n = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in (nn.Linear, PackedLinear) and can_int8(child.weight):
                setattr(parent, name, Int8Linear(child))
                n += 1
    return n


def frozen_projection(rows: torch.Tensor, *, packed: bool, int8: bool = False) -> nn.Module:
    """A frozen map onto ``rows`` [V', d] (a drafter's proposal rows of the lm_head): int8 where asked
    and possible, else pre-packed where asked and possible, else a plain linear."""
    proj = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")
    proj.weight = nn.Parameter(rows, requires_grad=False)
    if int8 and can_int8(rows):
        return Int8Linear(proj)
    return PackedLinear(proj) if packed and can_prepack(rows) else proj
