"""The base model's features of every distilled answer, cached once for EAGLE training.

For each sequence (prompt + answer) the cache keeps, per position t:

- ``features[t]``: f_t, the final-norm hidden state (what lm_head reads; EAGLE-1's input and target);
- ``layers[t]``: the hidden states entering a low, a middle and a high decoder layer (EAGLE-3's
  fused input, arXiv 2503.01840; the reference takes layers 2, L/2 and L-3, as here);

in bfloat16. Built in padded batches of sequences of similar length (right padding under a causal
mask never reaches a real position, so no attention mask is needed and SDPA takes its causal path),
at the CPU's fast numerics (bfloat16 autocast where the CPU has bfloat16 instructions, else float32)
on all of torch's threads. The work is written in shards of about ``shard_tokens`` tokens under one
folder, so a stopped build resumes at its first missing shard.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.device import cpu_has_native_bf16
from ..core.model import body_and_lm_head, input_device


def fused_layers(num_layers: int) -> tuple[int, int, int]:
    """The low, middle and high layer whose input hidden states EAGLE-3 fuses (reference: 2, L // 2, L - 3)."""
    return (min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0))


class FeatureCache:
    """Base-model features of many sequences: ``features[offsets[i]:offsets[i+1]]`` [T_i, d] (bfloat16),
    ``layers`` [N, 3, d] beside them (or None), ``ids`` the tokens and ``prompt_len`` where each answer starts."""

    def __init__(
        self,
        features: torch.Tensor,
        ids: torch.Tensor,
        offsets: torch.Tensor,
        prompt_len: torch.Tensor,
        layers: torch.Tensor | None = None,
    ):
        self.features, self.ids, self.offsets, self.prompt_len, self.layers = features, ids, offsets, prompt_len, layers

    def __len__(self) -> int:
        return len(self.prompt_len)

    def seq(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.features[a:b], self.ids[a:b], int(self.prompt_len[i])

    def subset(self, indices) -> "FeatureCache":
        """A cache of the sequences ``indices`` (copied)."""
        indices = list(indices)
        spans = [range(int(self.offsets[i]), int(self.offsets[i + 1])) for i in indices]
        rows = torch.tensor([j for s in spans for j in s], dtype=torch.long)
        lengths = torch.tensor([len(s) for s in spans])
        return FeatureCache(
            self.features[rows],
            self.ids[rows],
            torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            self.prompt_len[indices],
            None if self.layers is None else self.layers[rows],
        )

    @classmethod
    def build(
        cls,
        model,
        records: list[dict],
        *,
        layers: tuple[int, ...] = (),
        batch_tokens: int = 2048,
        desc: str = "",
        dtype: torch.dtype = torch.bfloat16,
    ) -> "FeatureCache":
        """The cache of ``records`` in memory (``build_cache`` keeps a large one on disk, in shards)."""
        seqs = [list(r["prompt_ids"]) + list(r["answer_ids"]) for r in records]
        tops, mids = [None] * len(seqs), [None] * len(seqs)
        for b in tqdm(plan_batches([len(s) for s in seqs], batch_tokens), desc=desc, file=sys.stdout, disable=not desc):
            top, mid = _features_of(model, [seqs[i] for i in b], layers, dtype)
            for r, i in enumerate(b):
                tops[i] = top[r, : len(seqs[i])]
                mids[i] = mid[r, : len(seqs[i])] if mid is not None else None
        lengths = torch.tensor([len(s) for s in seqs])
        return cls(
            torch.cat(tops),
            torch.tensor([t for s in seqs for t in s]),
            torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            torch.tensor([len(r["prompt_ids"]) for r in records]),
            torch.cat(mids) if layers else None,
        )

    def seq_layers(self, i: int) -> torch.Tensor:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.layers[a:b]


def plan_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Sequence indices sorted by length, grouped into batches of at most ``batch_tokens`` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    out, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    return out + ([cur] if cur else [])


@torch.inference_mode()
def _features_of(
    model, seqs: list[list[int]], layers: tuple[int, ...], dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """f_t [B, W, d] and the chosen layers' inputs [B, W, 3, d] of a right-padded batch (``dtype``, CPU)."""
    body, _ = body_and_lm_head(model)
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
    native = input_device(model).type == "cpu" and cpu_has_native_bf16() and model.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native):
        out = body(input_ids=ids.to(input_device(model)), output_hidden_states=bool(layers), use_cache=False)
    top = out.last_hidden_state.to(dtype).cpu()
    mid = torch.stack([out.hidden_states[k] for k in layers], dim=2).to(dtype).cpu() if layers else None
    return top, mid


def build_cache(
    model,
    records: list[dict],
    folder: Path,
    *,
    batch_tokens: int = 2048,
    shard_tokens: int = 65536,
    with_layers: bool = True,
    desc: str = "features",
    log=print,
) -> FeatureCache:
    """The features of ``records`` under ``folder`` (built, resumed or read back); see the module doc."""
    seqs = [list(r["prompt_ids"]) + list(r["answer_ids"]) for r in records]
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    layers = fused_layers(n_layers) if with_layers else ()
    key = hashlib.sha256(json.dumps([seqs, layers, batch_tokens, shard_tokens]).encode()).hexdigest()[:16]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plan = plan_batches([len(s) for s in seqs], batch_tokens)
    shards, cur, size = [], [], 0
    for b in plan:
        cur.append(b)
        size += sum(len(seqs[i]) for i in b)
        if size >= shard_tokens:
            shards.append(cur)
            cur, size = [], 0
    shards += [cur] if cur else []
    meta = folder / "plan.json"
    if not meta.exists() or json.loads(meta.read_text()).get("key") != key:
        for old in folder.glob("shard_*.pt"):
            old.unlink()
        meta.write_text(json.dumps({"key": key, "layers": layers, "shards": len(shards)}) + "\n")
    path = lambda k: folder / f"shard_{k:04d}.pt"  # noqa: E731
    todo = [k for k in range(len(shards)) if not path(k).exists()]
    todo_tokens = sum(len(seqs[i]) for k in todo for b in shards[k] for i in b)
    if todo:
        log(f"{desc}: {len(shards) - len(todo)} of {len(shards)} shards cached; computing {todo_tokens} tokens")
    t0 = time.perf_counter()
    bar = tqdm(total=todo_tokens, desc=desc, unit="tok", file=sys.stdout, disable=not todo)
    for k in todo:
        tops, mids = [], []
        for b in shards[k]:
            top, mid = _features_of(model, [seqs[i] for i in b], layers)
            for r, i in enumerate(b):
                tops.append(top[r, : len(seqs[i])].clone())
                mids.append(mid[r, : len(seqs[i])].clone() if mid is not None else None)
            bar.update(sum(len(seqs[i]) for i in b))
        shard = {"index": [i for b in shards[k] for i in b], "features": torch.cat(tops)}
        if layers:
            shard["layers"] = torch.cat(mids)
        torch.save(shard, str(path(k)) + ".tmp")
        # never a half-written shard
        Path(str(path(k)) + ".tmp").replace(path(k))
    bar.close()
    if todo:
        seconds = time.perf_counter() - t0
        log(f"{desc}: {todo_tokens} tokens in {seconds:.0f} s ({todo_tokens / max(seconds, 1e-9):.0f} tokens/s)")
        (folder / "speed.json").write_text(
            json.dumps({"tokens": todo_tokens, "seconds": round(seconds, 1), "threads": torch.get_num_threads()}) + "\n"
        )
    return read_cache(folder, records)


def read_cache(folder: Path, records: list[dict]) -> FeatureCache:
    """The cache of ``records`` from its shards, in record order (each shard is copied into place, so
    the peak memory is the cache and one shard)."""
    paths = sorted(Path(folder).glob("shard_*.pt"))
    seqs = [list(r["prompt_ids"]) + list(r["answer_ids"]) for r in records]
    lengths = torch.tensor([len(s) for s in seqs])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    features = layers = None
    seen = []
    for path in paths:
        part = torch.load(path, weights_only=True)
        if any(i >= len(records) for i in part["index"]):
            raise SystemExit(f"The feature cache in {folder} does not hold these answers; delete it and run again.")
        seen += part["index"]
        rows = torch.cat([torch.arange(int(offsets[i]), int(offsets[i + 1])) for i in part["index"]])
        if features is None:
            features = torch.empty(int(offsets[-1]), *part["features"].shape[1:], dtype=part["features"].dtype)
            if "layers" in part:
                layers = torch.empty(int(offsets[-1]), *part["layers"].shape[1:], dtype=part["layers"].dtype)
        features[rows] = part["features"]
        if layers is not None:
            layers[rows] = part["layers"]
    if sorted(seen) != list(range(len(records))):
        raise SystemExit(f"The feature cache in {folder} does not hold these answers; delete it and run again.")
    return FeatureCache(
        features,
        torch.tensor([t for s in seqs for t in s]),
        offsets,
        torch.tensor([len(r["prompt_ids"]) for r in records]),
        layers,
    )
