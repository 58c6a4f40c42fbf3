"""The KV cache of a run: transformers' DynamicCache, or a StaticCache with fixed-shape steps.

``DynamicKV`` (transformers' ``DynamicCache``) gives the dynamic path of ``decoding.py`` three
operations: ``cache`` (what the prefill writes into), ``forward`` (one forward of L tree tokens
after ``prefix_len`` cached ones, with the tree mask: logits [L, V], hidden [L, d]) and ``keep``
(keep the accepted nodes' entries behind the prefix, crop the rest).

``StaticKV`` holds a ``StaticCache`` of ``max_len`` slots (rounded up to a multiple of 64) whose
layers' K and V are views of one store tensor and whose lengths are views of one tensor
(``bind``), plus what the static engine's whole-step programs (``fused.py``) need from it: masks
built on the device from a device scalar (``tree_mask``), the lengths set in one copy
(``set_lengths``), the accepted slots moved for all layers in one gather and one copy
(``compact``), and CUDA-graph recording under the model's own device (``record``). Its per-size
single-forward ``forward``/``warm_up`` remain for the Tree lab's measured costs (``lab.py``).

  capture none        eager calls of the stock model (exact and testable everywhere)
  capture compile     each program compiled by Inductor without its own CUDA graphs, then on CUDA
                      recorded as one ``torch.cuda.CUDAGraph`` (fused kernels, one launch a step:
                      SGLang's and vLLM's recipe); on a CPU the compiled program is called
  capture cuda-graph  one ``torch.cuda.CUDAGraph`` of the eager kernels per program (CUDA only)

Under ``compile`` every layer keeps its own whole K and V tensors: the one store that ``bind``
makes for the eager engines is written through per-layer views, and Inductor copies a whole
tensor whose view a graph mutates, every step.

transformers 5.x ``StaticLayer`` writes at its ``cumulative_length`` (a device tensor) with
``index_copy_`` and has no crop: a step sets the prefix length inside the (captured) call (recipe
verified on an H100: ../shared/reference/GPU.md; gpt-fast ``generate.py`` and Sequoia's
``Engine.py`` do the same). A captured ``StaticKV`` is built once, at model load, and used by one
run at a time (``claim``/``release``); a run that finds it busy gets one of its own
(``Decoder._open_kv``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .caches import ALIGN, compact_cache, moved_slots, new_cache, new_static_cache
from .config import CAPTURES
from .model import body_and_lm_head, input_device
from .tree.masks import TreeBuffers, prefix_mask

# Inductor without its own CUDA graphs (those skip steps that mutate their inputs, as every step does);
# the engine records the compiled program in its own graph instead.
COMPILE_MODE = "default"


class DynamicKV:
    """transformers' DynamicCache: every forward appends its tokens; ``keep`` crops the rejected ones."""

    kind = "dynamic"

    def __init__(self, model: nn.Module):
        self.body, self.lm_head = body_and_lm_head(model)
        self.dtype, self.device = next(model.parameters()).dtype, input_device(model)
        self.cache = new_cache()

    def forward(self, tokens: torch.Tensor, bufs: TreeBuffers, prefix_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Every node sees the whole prefix, then the root, its ancestors and itself.
        mask = prefix_mask(bufs.bias, prefix_len, torch.arange(prefix_len + bufs.num_nodes, device=self.device))
        # cache length + depth
        position_ids = (bufs.tree.position_ids + prefix_len)[None]
        h = self.body(
            input_ids=tokens[None],
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=self.cache,
            use_cache=True,
        ).last_hidden_state[0]
        # every node's logits in one GEMM: on a CPU, a tree's few rows cost about as much as one or two (measured)
        return self.lm_head(h), h  # [L, V]

    def keep(self, prefix_len: int, nodes: torch.Tensor, tree_len: int) -> None:
        compact_cache(self.cache, prefix_len, nodes, tree_len)

    def release(self) -> None:
        pass

    def engine(self, sizes) -> str:
        return "dynamic"


@dataclass
class _Slots:
    """The fixed inputs of one tree size, and its capture (a graph and the outputs it writes)."""

    # token ids
    ids: torch.Tensor  # [1, L]
    # position ids
    pos: torch.Tensor  # [1, L]
    # float additive mask
    mask: torch.Tensor  # [1, 1, L, max_len]
    # torch.cuda.CUDAGraph
    graph: object | None = None
    # the graph's (logits, hidden)
    out: tuple[torch.Tensor, torch.Tensor] | None = None


class StaticKV:
    """A StaticCache of ``max_len`` slots with fixed-shape steps (see the module docstring).

    Build one per run (eager), or once per model with ``capture`` and ``warm_up`` and share it
    through ``claim``/``release``: the buffers and graphs serve one run at a time."""

    kind = "static"

    def __init__(self, model: nn.Module, *, max_len: int, capture: str = "none"):
        if capture not in CAPTURES:
            raise ValueError(f"capture must be one of {', '.join(CAPTURES)} (got {capture!r}).")
        self.body, self.lm_head = body_and_lm_head(model)
        self.dtype, self.device = next(model.parameters()).dtype, input_device(model)
        if capture == "cuda-graph" and self.device.type != "cuda":
            raise ValueError("cuda-graph capture needs the model on a CUDA device.")
        # aligned: no padded mask copies in SDPA
        self.max_len, self.capture = -(-int(max_len) // ALIGN) * ALIGN, capture
        self.cache = new_static_cache(model, self.max_len)
        # copied into every layer's length inside the step
        self.prefix = torch.zeros((), dtype=torch.long, device=self.device)
        self.min = torch.finfo(self.dtype).min
        # key slots, for masks built on the device
        self.cols = torch.arange(self.max_len, device=self.device)
        self.slots: dict[int, _Slots] = {}
        # tree sizes compiled or captured by warm_up; others run eagerly (never compiled inside a run)
        self.captured: set[int] = set()
        # compile/capture time spent in warm_up and in whole-step captures (never counted in tokens/s)
        self.capture_seconds = 0.0
        # every layer's K and V (bind)
        self.store: torch.Tensor | None = None  # [layers, 2, 1, kv_heads, max_len, head_dim]
        # every layer's cumulative_length, one tensor
        self.lens: torch.Tensor | None = None  # [layers]
        # whole-step programs (fused.py), by what they compute, least recently used first; one run at a time
        # replays them
        self.programs: OrderedDict = OrderedDict()
        # the device buffers those programs read and write (fused.FusedState)
        self.state = None
        # the prompt's forward in recorded chunks (prefill.Prefill), once recorded
        self.prefill = None
        # why recording it failed (then prompts run eagerly; not tried again)
        self.prefill_note: str | None = None
        self._lock = threading.Lock()
        self._step = (
            torch.compile(self._eager_step, mode=COMPILE_MODE, dynamic=False)
            if capture == "compile"
            else self._eager_step
        )
        # CUDA graphs share one memory pool (they replay one at a time)
        self._pool = None
        # ... and are captured on one side stream
        self._stream = None

    # ------------------------------------------------------------------ one run at a time
    def claim(self, wait: float = 0.0) -> bool:
        """Take this cache for one run; False when another run still holds it after ``wait`` seconds
        (a stopped run lets go when its generator closes, soon after the stop)."""
        return self._lock.acquire(timeout=wait) if wait > 0 else self._lock.acquire(blocking=False)

    def release(self) -> None:
        if self._lock.locked():
            self._lock.release()

    def start(self) -> None:
        """Empty the cache for a new run (slots beyond the length are masked, never read)."""
        self.bind()
        self.lens.zero_()

    def bind(self) -> None:
        """Allocate the cache once: one eager 1-token forward makes transformers allocate every
        layer, then every layer's K and V become views of one store and every length a view of one
        [layers] tensor, so the compaction of a step is one gather and one copy for all layers, and
        setting the lengths one copy (not one launch per layer). Layers of different shapes, and
        every layer under ``compile`` (module docstring), keep their own tensors (``store`` stays None)."""
        if self.lens is not None:
            return
        layers = self.cache.layers
        if not all(getattr(layer, "is_initialized", False) for layer in layers):
            with torch.inference_mode():
                self.body(
                    input_ids=torch.zeros(1, 1, dtype=torch.long, device=self.device),
                    position_ids=torch.zeros(1, 1, dtype=torch.long, device=self.device),
                    past_key_values=self.cache,
                    use_cache=True,
                )
        shapes = {
            (tuple(layer.keys.shape), tuple(layer.values.shape), layer.keys.dtype, layer.keys.device)
            for layer in layers
        }
        self.lens = torch.zeros(len(layers), dtype=torch.long, device=self.device)
        if self.capture != "compile" and len(shapes) == 1 and layers[0].keys.shape == layers[0].values.shape:
            self.store = torch.zeros(
                (len(layers), 2, *layers[0].keys.shape), dtype=layers[0].keys.dtype, device=layers[0].keys.device
            )
        for i, layer in enumerate(layers):
            if self.store is not None:
                layer.keys, layer.values = self.store[i, 0], self.store[i, 1]
            # a 0-d view: the layer's own add_ writes into lens
            layer.cumulative_length = self.lens[i]
            for t in (layer.keys, layer.values, layer.cumulative_length):
                torch._dynamo.mark_static_address(t)

    def set_lengths(self, prefix: torch.Tensor) -> None:
        """Every layer's length = ``prefix`` (a device scalar), in one copy."""
        self.lens.copy_(prefix.expand_as(self.lens))

    def tree_mask(self, bias: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """[1, 1, L, max_len] float mask of a tree step after ``prefix`` cached tokens (a device
        scalar), over the whole fixed-size cache (``tree.prefix_mask``)."""
        return prefix_mask(bias, prefix, self.cols)

    def compact(self, prefix: torch.Tensor, nodes: torch.Tensor) -> None:
        """Move the K/V of tree slots ``prefix + nodes`` to ``prefix + 0 .. len(nodes) - 1``, every
        layer at once (one gather, one copy into the store); device tensors, fixed shape. The
        lengths are not touched: the next step sets them from its prefix."""
        src, dst = moved_slots(prefix, nodes)
        if self.store is not None:
            self.store.index_copy_(4, dst, self.store.index_select(4, src))
            return
        for layer in self.cache.layers:
            layer.keys.index_copy_(2, dst, layer.keys.index_select(2, src))
            layer.values.index_copy_(2, dst, layer.values.index_select(2, src))

    # ------------------------------------------------------------------ the step
    def _eager_step(
        self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # a device tensor, not a Python int: a capture must not bake it in
        self.set_lengths(self.prefix)
        h = self.body(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self.cache, use_cache=True
        ).last_hidden_state[0]
        return self.lm_head(h), h

    def _slots_for(self, n: int) -> _Slots:
        if n not in self.slots:
            dev = self.device
            self.slots[n] = _Slots(
                ids=torch.zeros(1, n, dtype=torch.long, device=dev),
                pos=torch.zeros(1, n, dtype=torch.long, device=dev),
                mask=torch.full((1, 1, n, self.max_len), self.min, dtype=self.dtype, device=dev),
            )
        return self.slots[n]

    def forward(self, tokens: torch.Tensor, bufs: TreeBuffers, prefix_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = bufs.num_nodes
        if prefix_len + n > self.max_len:
            raise RuntimeError(
                f"The static cache holds {self.max_len} tokens; a step of {n} after {prefix_len} does not fit."
            )
        s = self._slots_for(n)
        s.ids[0].copy_(tokens)
        # cache length + depth
        torch.add(bufs.tree.position_ids, prefix_len, out=s.pos[0])
        # every node sees the prefix, then the root, its ancestors and itself
        s.mask.copy_(prefix_mask(bufs.bias, prefix_len, self.cols))
        self.prefix.fill_(prefix_len)
        if s.graph is not None:
            s.graph.replay()
            return s.out
        if n not in self.captured:
            return self._eager_step(s.ids, s.pos, s.mask)
        return self._step(s.ids, s.pos, s.mask)

    # ------------------------------------------------------------------ warm-up and capture
    def warm_up(self, trees: list[TreeBuffers], *, runs: int = 3) -> float:
        """Compile or capture the one-forward step of every tree size in ``trees`` (the Tree lab's
        measured costs time these); returns the seconds it took. The cache is left empty. A size
        is recorded as captured only once its capture succeeded."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.start()
            for bufs in {b.num_nodes: b for b in trees}.values():
                tokens = torch.zeros(bufs.num_nodes, dtype=torch.long, device=self.device)
                # eager or compiled kernels, recorded in one graph
                if self.device.type == "cuda":
                    s = self._slots_for(bufs.num_nodes)
                    # fills the input buffers
                    self.forward(tokens, bufs, 1)
                    s.graph, s.out = self.record(lambda s=s: self._step(s.ids, s.pos, s.mask), runs=runs)
                    # only once recorded
                    self.captured.add(bufs.num_nodes)
                else:
                    # compile: the calls below compile it
                    self.captured.add(bufs.num_nodes)
                    for _ in range(runs):
                        self.forward(tokens, bufs, 1)
            self.start()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        self.capture_seconds += seconds
        return seconds

    def forget_pool(self) -> None:
        """Called when no captured graph is left (static_run.evict): the next capture makes a new pool."""
        self._pool = None

    @property
    def programs_captured(self) -> int:
        """Whole-step programs (fused.py) captured or compiled on this cache so far."""
        return sum(p.captured for p in self.programs.values())

    def describe(self) -> str:
        """The engine in words, with what its programs' captures gave so far (``describe_engine``)."""
        return describe_engine(
            "static",
            self.capture,
            device=self.device,
            shapes=self.programs_captured,
            seconds=self.capture_seconds,
            fell_back=sum(p.note is not None for p in self.programs.values()),
        )

    def engine(self, sizes) -> str:
        """What a run whose steps have these tree sizes uses: "static", or "static, <capture>" when all were
        captured."""
        return f"static, {self.capture}" if self.capture != "none" and set(sizes) <= self.captured else "static"

    def record(self, fn: Callable[[], object], *, runs: int = 3, reset: Callable[[], None] = lambda: None, graphs=None):
        """Warm ``fn`` up on a side stream and record it as one replayable CUDA graph (PyTorch's
        recipe), under the model's own device (``cuda:N``: the capture stream lives there) and with
        ``capture_error_mode="thread_local"`` (another thread's CUDA call cannot break it). Returns
        (graph, what fn returned during the capture); raises when the capture fails, and then
        nothing is kept. ``reset`` runs before every warm-up call and before the capture, outside
        it. ``graphs`` replaces ``torch.cuda`` (tests pass a fake)."""
        cuda = graphs or torch.cuda
        with cuda.device(self.device):
            # one side stream for every warm-up and capture: a pool reuses freed blocks on its own stream only
            if self._stream is None:
                self._stream = cuda.Stream(self.device)
            stream = self._stream
            stream.wait_stream(cuda.current_stream(self.device))
            with cuda.stream(stream):
                for _ in range(runs):
                    reset()
                    fn()
            cuda.current_stream(self.device).wait_stream(stream)
            reset()
            graph = cuda.CUDAGraph()
            with cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
                out = fn()
        self._pool = graph.pool()
        return graph, out


def describe_engine(
    cache: str,
    capture: str,
    *,
    device: torch.device | str = "cpu",
    shapes: int = 0,
    seconds: float = 0.0,
    fell_back: int = 0,
) -> str:
    """The engine in words, for the info line and the load log."""
    if cache == "dynamic":
        return "dynamic KV cache (eager)"
    if capture == "none":
        return "static KV cache (eager)"
    how = {
        "compile": "compiled by Inductor"
        + (" and replayed as one CUDA graph" if torch.device(device).type == "cuda" else ""),
        "cuda-graph": "replayed as one CUDA graph of eager kernels",
    }[capture]
    done = f"; {shapes} captured in {seconds:.1f} s" if shapes else ""
    worse = f" ({fell_back} fell back to eager kernels: see the run notes)" if fell_back else ""
    return f"static KV cache, each whole decode step {how}{done}{worse}"
