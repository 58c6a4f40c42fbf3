"""The prompt's forward on a captured static engine: chunks of a ladder of fixed lengths, each one graph.

An eager prefill launches every kernel of every layer from the host (on a GPU tens of milliseconds for a
short prompt, most of it launches). Here the prompt goes through the cache in chunks whose lengths come
from ``LADDER``: whole chunks of the longest size, then the shortest size that holds the rest, padded.
Each size is one fixed-shape program recorded as one CUDA graph of the eager kernels (milliseconds to
record, nothing compiled), so a prompt costs a few replays. A chunk after ``start`` cached tokens sees the
cache and itself causally (mask built on the device from a device scalar); its padding rows write K/V slots
past the prompt, which the decode steps after it overwrite or mask. Every prompt row's hidden state and the
last one's logits land in fixed buffers. A size that would write past the cache runs eagerly at its exact length.
"""

from __future__ import annotations

import time

import torch

from .tree.masks import additive_mask

# chunk lengths: few graphs, at most 15 padded rows under 64 tokens
LADDER = (16, 64, 256)


class Prefill:
    """The chunked prefill of one ``StaticKV`` (built and recorded by ``record``; one run at a time)."""

    def __init__(self, kv):
        dev, weight = kv.device, kv.lm_head.weight
        self.kv = kv
        # tokens cached before the chunk
        self.start = torch.zeros((), dtype=torch.long, device=dev)
        # the chunk's last prompt row
        self.last = torch.zeros(1, dtype=torch.long, device=dev)
        # every prompt row's hidden state (a drafter with a state of its own reads them all)
        self.features = torch.zeros(kv.max_len, weight.shape[1], dtype=kv.dtype, device=dev)
        self.logits = torch.zeros(weight.shape[0], dtype=kv.dtype, device=dev)
        self.ids = {c: torch.zeros(1, c, dtype=torch.long, device=dev) for c in LADDER if c <= kv.max_len}
        self.rows = {c: torch.arange(c, device=dev) for c in self.ids}
        # each row sees the rows before it and itself
        self.causal = {c: self._causal(c) for c in self.ids}
        self.graphs: dict[int, object] = {}
        # what replays them (tests: a stand-in)
        self.cuda = torch.cuda
        # the size being recorded (a test's stand-in replays it)
        self.recording: int | None = None

    def _causal(self, c: int) -> torch.Tensor:
        """[c, c] additive causal bias: a chunk is a chain tree, so ``StaticKV.tree_mask`` places it."""
        kv = self.kv
        seen = torch.ones(c, c, dtype=torch.bool, device=kv.device).tril()
        return additive_mask(seen, kv.dtype)

    def chunk(self, ids: torch.Tensor) -> None:
        """One chunk [1, C] after ``start`` cached tokens: its K/V into the cache, its rows' hidden states and
        its ``last`` row's logits into the buffers."""
        kv, c = self.kv, ids.shape[1]
        # a ladder size; else the exact-length chunk, built now
        known = c in self.rows
        pos = self.start + (self.rows[c] if known else torch.arange(c, device=kv.device))
        kv.set_lengths(self.start)
        h = kv.body(
            input_ids=ids,
            attention_mask=kv.tree_mask(self.causal[c] if known else self._causal(c), self.start),
            position_ids=pos[None],
            past_key_values=kv.cache,
            use_cache=True,
        ).last_hidden_state[0]
        last = h.index_select(0, self.last.clamp(max=c - 1))[0]
        # padding rows too: still inside the cache, past the prompt, overwritten by a longer prompt
        self.features.index_copy_(0, pos, h)
        self.logits.copy_(kv.lm_head(last))

    def run(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt ``ids`` [1, n] into the (empty) cache; returns (every prompt row's hidden state [n, d],
        the last one's logits [V])."""
        n, done, longest = ids.shape[1], 0, max(self.ids)
        while done < n:
            left = n - done
            size = next((c for c in sorted(self.ids) if c >= min(left, longest) and done + c <= self.kv.max_len), None)
            take = min(left, size or left)
            self.start.fill_(done)
            self.last.fill_(take - 1)
            # no padded size fits the cache: this chunk runs at its own length
            if size is None:
                self.chunk(ids[:, done:])
            else:
                buf = self.ids[size]
                buf.zero_()
                buf[:, :take].copy_(ids[:, done : done + take])
                graph = self.graphs.get(size)
                if graph is None:
                    self.chunk(buf)
                else:
                    # on cuda:N's current stream, as the steps replay
                    with self.cuda.device(self.kv.device):
                        graph.replay()
            done += take
        return self.features[:n], self.logits

    def record(self, *, graphs=None) -> float:
        """Record every size as one CUDA graph (``StaticKV.record``) over a stand-in chunk at the cache's
        start, each replayed once and checked against the eager chunk. Returns the seconds it took; raises
        when a capture fails (then none is kept). Like the steps' captures, it runs before a run's prefill."""
        t0, kv = time.perf_counter(), self.kv
        made = {}

        # and no result left from the call before: a replay must write its own
        def stand_in():
            self.start.zero_()
            self.last.zero_()
            self.features.zero_()
            self.logits.zero_()

        for size, buf in self.ids.items():
            self.recording = size
            # not a padding id, whose zero embedding could hide a replay that wrote nothing
            buf.fill_(1)
            graph, _ = kv.record(lambda buf=buf: self.chunk(buf), runs=2, reset=stand_in, graphs=graphs)
            self.cuda = graphs or torch.cuda
            stand_in()
            with self.cuda.device(kv.device):
                graph.replay()
            replayed = (self.features.clone(), self.logits.clone())
            stand_in()
            self.chunk(buf)
            if not (torch.equal(replayed[0], self.features) and torch.equal(replayed[1], self.logits)):
                raise RuntimeError(f"the replayed {size}-token prefill differs from the eager one")
            made[size] = graph
        self.recording, self.graphs = None, made
        kv.lens.zero_()
        return time.perf_counter() - t0
