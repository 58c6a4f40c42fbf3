"""The hidden-state cache head training reads: the base model's final hidden states of prompt + answer,
flattened, with each position's next tokens (the heads' targets) beside them (``train.py`` builds it,
``medusa_trainer.py`` trains on it)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import torch

from ..core.model import body_and_lm_head, input_device


class HiddenCache:
    """Final hidden states of many sequences, flattened, with the token ids beside them.

    For flat position i (token x_t of some sequence), ``hidden[i]`` = h_t and ``next_ids[i, k-1]``
    = x_{t+k+1} (head k's target) or -1 past the end of that sequence.
    """

    def __init__(self, hidden: torch.Tensor, next_ids: torch.Tensor, seq_end: torch.Tensor):
        self.hidden, self.next_ids, self.seq_end = hidden, next_ids, seq_end
        # root_ids(), computed on first use
        self._roots: torch.Tensor | None = None

    @classmethod
    @torch.inference_mode()
    def build(cls, model, records: list[dict], *, num_heads: int, batch_tokens: int = 8192, log=print) -> "HiddenCache":
        body, _ = body_and_lm_head(model)
        device = input_device(model)
        hiddens, nexts, ends = [], [], []
        offset = 0
        order = sorted(range(len(records)), key=lambda i: len(records[i]["prompt_ids"]) + len(records[i]["answer_ids"]))
        # (prompt + answer, index of the last prompt token)
        batch: list[tuple[list[int], int]] = []
        t0 = time.perf_counter()

        def flush():
            nonlocal offset
            width = max(len(s) for s, _ in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            att = torch.zeros(len(batch), width, dtype=torch.long)
            for i, (s, _) in enumerate(batch):
                ids[i, : len(s)] = torch.tensor(s)
                att[i, : len(s)] = 1
            h = body(input_ids=ids.to(device), attention_mask=att.to(device)).last_hidden_state.float().cpu()
            for i, (s, start) in enumerate(batch):
                # positions from the last prompt token (it predicts the first answer token) on
                pos = torch.arange(start, len(s))
                hiddens.append(h[i, pos].to(torch.bfloat16))
                # -1: past the end of the sequence
                seq = torch.tensor(s + [-1] * (num_heads + 1))
                nexts.append(torch.stack([seq[pos + k + 1] for k in range(1, num_heads + 1)], dim=1))
                ends.append(torch.full((len(pos),), offset + len(pos), dtype=torch.long))
                offset += len(pos)
            batch.clear()

        for i in order:
            r = records[i]
            seq = list(r["prompt_ids"]) + list(r["answer_ids"])
            batch.append((seq, len(r["prompt_ids"]) - 1))
            if len(batch) * len(seq) >= batch_tokens:
                flush()
        if batch:
            flush()
        log(f"cached {offset} positions from {len(records)} answers in {time.perf_counter() - t0:.0f} s")
        return cls(torch.cat(hiddens), torch.cat(nexts), torch.cat(ends))

    def __len__(self) -> int:
        return self.hidden.shape[0]

    @torch.inference_mode()
    def root_ids(self, lm_head: torch.nn.Module) -> torch.Tensor:
        """x_{t+1} of every position: the root a root-conditioned head sees after h_t at decode time.

        Inside a sequence it is the previous position's first target; at a sequence's first
        position (the last prompt token) it is the base model's greedy pick from h_t, which is
        what a greedy distilled answer starts with (the cache does not keep that first token; answers
        sampled at a temperature may start otherwise). Past the end of a sequence: 0 (no head has a
        target there). Computed once and kept on the cache.
        """
        if self._roots is not None:
            return self._roots
        n = len(self)
        roots = torch.zeros(n, dtype=torch.long)
        roots[1:] = self.next_ids[:-1, 0]
        first = torch.ones(n, dtype=torch.bool)
        # the previous position ended its sequence
        first[1:] = self.seq_end[:-1] == torch.arange(1, n)
        idx = first.nonzero().squeeze(1)
        w = lm_head.weight
        for i in range(0, len(idx), 4096):
            chunk = idx[i : i + 4096]
            roots[chunk] = lm_head(self.hidden[chunk].to(device=w.device, dtype=w.dtype)).argmax(-1).cpu()
        self._roots = roots.clamp(min=0)
        return self._roots

    @classmethod
    def concat(cls, caches: list["HiddenCache"]) -> "HiddenCache":
        """One cache holding the positions of several, in order (seq_end shifted to the new offsets)."""
        offsets = [0]
        for c in caches[:-1]:
            offsets.append(offsets[-1] + len(c))
        return cls(
            torch.cat([c.hidden for c in caches]),
            torch.cat([c.next_ids for c in caches]),
            torch.cat([c.seq_end + o for c, o in zip(caches, offsets)]),
        )

    def save(self, path: Path) -> None:
        torch.save({"hidden": self.hidden, "next_ids": self.next_ids, "seq_end": self.seq_end}, path)

    @classmethod
    def load(cls, path: Path) -> "HiddenCache":
        d = torch.load(path, weights_only=True)
        return cls(d["hidden"], d["next_ids"], d["seq_end"])


def frequent_tokens(records: list[dict], n: int, vocab_size: int, always: list[int] = ()) -> torch.Tensor:
    """The n most frequent answer tokens (plus ``always``), as sorted ids."""
    counts = Counter(t for r in records for t in r["answer_ids"])
    ids = [t for t, _ in counts.most_common(n)]
    for t in always:
        if t not in ids:
            ids.append(t)
    ids = ids[:n] if len(ids) > n else ids
    # Pad with the lowest unused ids so the shape is fixed even for small data sets.
    used = set(ids)
    pad = (t for t in range(vocab_size) if t not in used)
    while len(ids) < n:
        ids.append(next(pad))
    return torch.tensor(sorted(ids), dtype=torch.long)


def cached_hidden(model, records: list[dict], bounds: list[int], work: Path, split: str, num_heads: int) -> HiddenCache:
    """The hidden-state cache of ``records``, from ``work/{split}_hidden_{N}x{K}.pt`` (N records).

    When only the records of the first files are cached (an answers file was added after them),
    only the new files' records are run through the model and appended.
    """
    # rebuilt when the data or K change
    path = lambda n: work / f"{split}_hidden_{n}x{num_heads}.pt"  # noqa: E731
    # last prompt token .. end
    positions = lambda n: sum(len(r["answer_ids"]) + 1 for r in records[:n])  # noqa: E731

    def load(n: int) -> HiddenCache | None:
        """The cache of the first n records, if there is one and it has their number of positions."""
        if not path(n).exists():
            return None
        cache = HiddenCache.load(path(n))
        if len(cache) != positions(n):
            print(f"{path(n)} does not match these answers ({len(cache)} positions, not {positions(n)}): rebuilding")
            return None
        return cache

    whole = load(len(records))
    if whole is not None:
        return whole
    done, parts = 0, []
    for n in reversed(bounds[:-1]):
        cached = load(n)
        if cached is not None:
            done, parts = n, [cached]
            break
    if done:
        print(f"{split}: reusing the cache of the first {done} answers; running the other {len(records) - done}")
    cache = HiddenCache.concat(parts + [HiddenCache.build(model, records[done:], num_heads=num_heads)])
    cache.save(path(len(records)))
    return cache
