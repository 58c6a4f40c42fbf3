"""REST, retrieval-based speculative decoding (He et al. 2023, arXiv 2311.08252), as a drafter.

No weights: a datastore of token sequences (here the answers the repo ships for training its heads;
the held-out and bench answers are left out). Each step takes the longest suffix of the context,
2 to ``MAX_SUFFIX`` tokens, that occurs in the datastore, reads the ``depth`` tokens that followed
each occurrence (at most ``MAX_HITS``), merges them into a trie and keeps its ``nodes`` most frequent
prefixes as the step's token tree (a new tree every step, so the dynamic cache runs it). The
verifier accepts what the base model agrees with, so output stays exact.

The datastore ships beside the Medusa heads (``<heads>-rest``: ``datastore.safetensors``, the token
ids with -1 between sequences, and ``config.json``). Build it again from the shipped answers with
``build(Path("assets/heads/smollm2-135m-instruct"))`` (offline, seconds).
"""

from __future__ import annotations

import gzip
import heapq
import json
from functools import lru_cache
from pathlib import Path

import torch

from ..file_checks import folder_problem
from ..messages import cause
from ..tree.shape import build_tree
from .base import Draft, Drafter, DrafterError, DraftRun, Loaded, beside

# the datastore of heads folder X lives in X-rest
SUFFIX = "-rest"
FILE, CONFIG = "datastore.safetensors", "config.json"
SOURCES = ("train_answers", "train_answers_part2", "self_instruct_answers")
# longest context suffix looked up (longer first)
MAX_SUFFIX = 8
# occurrences read per step, the latest in the datastore first
MAX_HITS = 64
# the tree a step verifies: at most NODES tokens, DEPTH deep
NODES, DEPTH = 12, 4
DATA = Path(__file__).resolve().parents[3] / "assets" / "data" / "distill"


class Datastore:
    """Token sequences and a sorted index of their bigrams (``torch.searchsorted`` finds a suffix's
    occurrences; longer suffixes are then checked backwards)."""

    def __init__(self, tokens: torch.Tensor, *, vocab_size: int):
        tokens = tokens.long()
        # a separator last: a continuation never reads past the end
        if not tokens.numel() or int(tokens[-1]) != -1:
            tokens = torch.cat([tokens, torch.tensor([-1])])
        self.tokens, self.vocab = tokens, int(vocab_size)
        t = self.tokens
        ok = (t[:-1] >= 0) & (t[1:] >= 0)
        keys = t[:-1] * self.vocab + t[1:]
        pos = torch.nonzero(ok).flatten()
        order = torch.argsort(keys[pos], stable=True)
        self.keys, self.pos = keys[pos][order], pos[order]

    def continuations(self, context: list[int], *, depth: int) -> list[tuple[int, ...]]:
        """The ``depth`` tokens (fewer at a sequence's end) after each occurrence of the longest
        suffix of ``context`` (2 to MAX_SUFFIX tokens) in the datastore; [] when its last two tokens
        never occur."""
        if len(context) < 2 or min(context[-2:]) < 0 or max(context[-2:]) >= self.vocab:
            return []
        key = torch.tensor([context[-2] * self.vocab + context[-1]])
        lo, hi = int(torch.searchsorted(self.keys, key)), int(torch.searchsorted(self.keys, key, right=True))
        if lo == hi:
            return []
        # the first token of each bigram occurrence
        at = self.pos[lo:hi]
        t, length = self.tokens, torch.full_like(at, 2)
        alive = torch.ones_like(at, dtype=torch.bool)
        for k in range(3, min(MAX_SUFFIX, len(context)) + 1):
            back = at - (k - 2)
            alive &= (back >= 0) & (t[back.clamp(min=0)] == context[-k])
            if not alive.any():
                break
            length = torch.where(alive, k, length)
        best = at[length == length.max()]
        hits = best.flip(0)[:MAX_HITS]
        rows = t[(hits[:, None] + 2 + torch.arange(depth)).clamp(max=t.numel() - 1)]
        out = []
        for row in rows.tolist():
            cut = row.index(-1) if -1 in row else len(row)
            if cut:
                out.append(tuple(row[:cut]))
        return out


def token_tree(paths: list[tuple[int, ...]], *, nodes: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """The ``nodes`` most frequent prefixes of ``paths`` as a tree: (choices, each a path of sibling
    ranks, in ``build_tree``'s node order; the token of each node in that order). A prefix is taken
    only after its parent (a heap over the frontier); ties go to the shallower, then the first seen."""
    count: dict[tuple[int, ...], int] = {}
    for p in paths:
        for d in range(1, len(p) + 1):
            count[p[:d]] = count.get(p[:d], 0) + 1
    order = {p: i for i, p in enumerate(count)}
    children: dict[tuple[int, ...], list] = {}
    for p in count:
        children.setdefault(p[:-1], []).append(p)
    frontier = [(-count[c], len(c), order[c], c) for c in children.get((), [])]
    heapq.heapify(frontier)
    kept: list[tuple[int, ...]] = []
    while frontier and len(kept) < nodes:
        p = heapq.heappop(frontier)[-1]
        kept.append(p)
        for c in children.get(p, []):
            heapq.heappush(frontier, (-count[c], len(c), order[c], c))
    rank: dict[tuple[int, ...], tuple[int, ...]] = {(): ()}
    for p in sorted(kept, key=lambda p: (len(p), -count[p], order[p])):
        siblings = sum(1 for q in rank if len(q) == len(p) and q[:-1] == p[:-1])
        rank[p] = rank[p[:-1]] + (siblings,)
    choices = sorted((rank[p], p) for p in kept)
    choices.sort(key=lambda c: (len(c[0]), c[0]))
    return [c for c, _ in choices], [p[-1] for _, p in choices]


class _RestRun(DraftRun):
    def __init__(self, drafter: "RestDrafter"):
        self.d = drafter

    def propose(self, root, *, history, seq_len):
        d = self.d
        context = history[max(0, seq_len - MAX_SUFFIX) : seq_len].tolist()
        choices, tokens = token_tree(d.store.continuations(context, depth=d.depth), nodes=d.nodes)
        if not choices:
            # nothing retrieved: a plain step
            return None
        tree = build_tree(choices, topk=max(c[-1] for c in choices) + 1, name="rest")
        ids = torch.tensor([int(root)] + tokens, dtype=torch.long, device=d.device)
        return Draft(tree, ids)


class RestDrafter(Drafter):
    """REST: a token tree retrieved from a datastore by the context's longest suffix."""

    name = "rest"
    label = "REST (retrieval)"
    drafted_by = "REST's datastore"
    order = 3
    # what the page's "How to read this page" says about it
    teach = (
        "*REST* ([He et al., 2023](https://arxiv.org/abs/2311.08252)) needs no weights either: it looks the "
        "text's longest suffix up in a datastore (here the answers the heads were trained on) and merges what "
        "followed it there into one tree of the most frequent continuations, a new tree every step, so the "
        "tree controls do not apply."
    )
    static_note = (
        "The REST drafter runs with the dynamic cache only (its tree changes every step); "
        "this run uses the dynamic cache."
    )

    def __init__(self, store: Datastore, *, nodes: int | None = None, depth: int | None = None):
        nodes, depth = NODES if nodes is None else nodes, DEPTH if depth is None else depth
        whole = lambda n, high: isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= high  # noqa: E731
        if not (whole(nodes, 64) and whole(depth, 8)):
            raise DrafterError(f"REST drafts 1 to 64 nodes, 1 to 8 deep (got {nodes} nodes, depth {depth}).")
        self.store, self.nodes, self.depth = store, nodes, depth

    @classmethod
    def check_files(cls, option, *, folder=None, sizes=None) -> str | None:
        where = beside(folder, SUFFIX)
        if where is None or not (where / FILE).exists():
            return None
        problem = folder_problem(where, (FILE, CONFIG))
        if problem is not None:
            return f"The REST datastore beside the Medusa heads is left out ({problem}); build it again."
        built = (json.loads((where / CONFIG).read_text()) or {}).get("vocab_size")
        if sizes is not None and built != sizes[1]:
            return (
                "The REST datastore beside the Medusa heads is left out: it was built for a vocabulary of "
                f"{built} tokens, this model has {sizes[1]:,}."
            )
        return None

    @classmethod
    def load(cls, model, *, heads=None, folder=None, option=None) -> Loaded:
        """The datastore beside the Medusa heads' ``folder``, if it is there and fits the model's vocabulary."""
        where = beside(folder, SUFFIX)
        if where is None or not (where / FILE).is_file():
            return Loaded(None, "No REST datastore was found beside the Medusa heads, so REST is not offered.")
        vocab = int(model.get_output_embeddings().weight.shape[0])
        try:
            return Loaded(read_datastore(str(where), vocab))
        except DrafterError as e:
            return Loaded(None, f"The REST datastore beside the Medusa heads is left out: {e}.")
        except Exception as e:  # noqa: BLE001
            # a damaged file (safetensors' own errors derive from Exception): left out, said in one sentence
            return Loaded(None, f"The REST datastore beside the Medusa heads could not be read ({cause(e, 160)}).")

    @classmethod
    def for_run(cls, state, *, heads, tree, lookup):
        return cls(state)

    @classmethod
    def about(cls, states: dict) -> str:
        store = next(iter(states.values()), None)
        size = f"{int((store.tokens >= 0).sum()):,} tokens of " if store is not None else ""
        return (
            f"REST retrieves a tree of up to {NODES} tokens, {DEPTH} deep, from a datastore of "
            f"{size}the shipped training answers, looked up by the text's "
            "longest suffix (no weights, exact like every drafter): the tree preset and the custom tree apply "
            "to the Medusa heads only; the lookup branch still sits beside it."
        )

    def tree_label(self) -> str:
        return f"rest-retrieved (up to {self.nodes} nodes, depth {self.depth})"

    def _bind(self, dec) -> None:
        self.device = dec.device

    def open(self) -> DraftRun:
        return _RestRun(self)


@lru_cache(maxsize=4)
def read_datastore(folder: str, vocab_size: int) -> Datastore:
    """A shipped datastore, read once per folder and vocabulary (every copy of the model shares it)."""
    from safetensors.torch import load_file

    config = json.loads((Path(folder) / CONFIG).read_text(encoding="utf-8"))
    built = int(config["vocab_size"]) if isinstance(config, dict) and "vocab_size" in config else None
    if built != vocab_size:
        raise DrafterError(
            f"it was built for a vocabulary of {built:,} tokens, this model has {vocab_size:,}"
            if built is not None
            else f"its {CONFIG} names no vocab_size"
        )
    tokens = load_file(str(Path(folder) / FILE))["tokens"]
    # -1 between sequences, else token ids of this vocabulary: a damaged file never drafts an impossible id
    if tokens.dim() != 1 or (tokens.numel() and (int(tokens.min()) < -1 or int(tokens.max()) >= vocab_size)):
        raise DrafterError(f"its tokens are not ids of this vocabulary (0 to {vocab_size - 1}, -1 between answers)")
    return Datastore(tokens, vocab_size=vocab_size)


def write_datastore(folder: Path, seqs: list[list[int]], *, vocab_size: int, **about) -> Path:
    """A datastore of the token sequences ``seqs`` in ``folder`` (its tokens with -1 between them,
    and config.json with ``about``)."""
    from safetensors.torch import save_file

    flat = [t for s in seqs for t in (*s, -1)]
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"tokens": torch.tensor(flat, dtype=torch.int32)}, str(folder / FILE))
    config = {"drafter": "rest", "vocab_size": vocab_size, "sequences": len(seqs), "tokens": len(flat) - len(seqs)}
    (folder / CONFIG).write_text(json.dumps(config | about, indent=2) + "\n", encoding="utf-8")
    return folder


def build(heads: Path, *, vocab_size: int = 49152) -> Path:
    """Write the datastore of ``heads`` (``<heads>-rest``) from the shipped training answers."""
    seqs = []
    for name in SOURCES:
        with gzip.open(DATA / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
            seqs += [json.loads(line)["answer_ids"] for line in f if line.strip()]
    return write_datastore(
        heads.with_name(heads.name + SUFFIX),
        seqs,
        vocab_size=vocab_size,
        sources=[f"assets/data/distill/{n}.jsonl.gz" for n in SOURCES],
        left_out="the held-out answers (the bench's and the calibration's prompts)",
    )


__all__ = ["Datastore", "RestDrafter", "build", "read_datastore", "token_tree", "write_datastore"]
