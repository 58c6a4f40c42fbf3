"""The acceptance and sampling rules of Medusa's verify step, as pure functions of logits.

* ``greedy_accept``: a candidate passes iff it is the base model's argmax after its parent
  (Medusa greedy == plain greedy).
* ``typical_accept``: the paper's typical acceptance (arXiv 2401.10774, Sec. 2.3.1),
  p(x) > min(epsilon, delta * exp(-H(p))), p = softmax(logits / T); longest path wins.
* ``sample_token`` / ``sample_walk``: one exact draw (exponential race argmax(p / E)), and exact
  speculative sampling over a tree of deterministic candidates (every emitted token is one draw
  from the model's conditional, so with the same seed it equals plain sampling).

The noise of a draw is keyed by (seed, position of the token drawn) (``race_noise``): a counter-based
hash, not a stateful generator. The token at position p of a run is drawn with the same E whoever
draws it, in whatever order and however many candidates a step drafts, so plain sampling and exact
Medusa sampling agree by construction, and a captured fixed-shape step can draw on the device
without a generator's state (the same idea as Philox's counter-based streams).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .tree.shape import children_tensor

# float32's smallest normal number: tempered_probs' least T
SMALLEST_T = torch.finfo(torch.float32).tiny


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim. Low-precision logits are widened first: exact (every bfloat16 is a
    float32, ties still go to the first index) and on CPU faster than a bfloat16 argmax (measured)."""
    return (logits if logits.dtype == torch.float32 else logits.float()).argmax(-1)


def tempered_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float32 for any finite T > 0, never NaN.

    The max is subtracted before dividing: every scaled logit is then <= 0, so a tiny T sends the
    others to -inf (probability 0) instead of overflowing to inf - inf = NaN, and the distribution
    tends to the argmax's one-hot (ties share it), the T -> 0 limit the rules are defined by. T is
    divided as a float32 tensor on the logits' device: CUDA divides by a Python number as a multiply
    by its reciprocal (one bit off), and the static engine's step divides by its device scalar. A T
    below float32's smallest normal number (1.2e-38; 1e-46 even rounds to 0, and 0 / 0 is NaN) is
    taken as that number: the same T -> 0 limit, for logits of any dtype (they are widened first)."""
    z = logits.float()
    t = (
        temperature
        if isinstance(temperature, torch.Tensor)
        else torch.full((), float(temperature), dtype=torch.float32, device=z.device)
    )
    return torch.softmax((z - z.max(dim=-1, keepdim=True).values) / t.clamp_min(SMALLEST_T), dim=-1)


def nucleus(probs: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """``probs`` [..., V] restricted to the top-p nucleus: the smallest prefix, by probability, with
    mass >= top_p, renormalised."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p
    probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
    return probs / probs.sum(-1, keepdim=True)


def sampling_probs(logits: torch.Tensor, *, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution a draw is made from: softmax(logits / T), restricted to the top-p nucleus."""
    probs = tempered_probs(logits, temperature)
    return nucleus(probs, top_p) if top_p < 1.0 else probs


_U32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (two multiply-xorshift rounds) on int64 tensors holding uint32
    values; every product stays below 2^59, so no overflow on any device."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & _U32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _U32
    return (x >> 16) ^ x


def race_noise(
    seed: int | torch.Tensor, positions: int | torch.Tensor, vocab: int, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """E ~ Exp(1) i.i.d. [..., vocab] for the draws of the tokens at ``positions`` [...] (absolute
    positions in the sequence), keyed by ``seed`` only: a pure function, so the same (seed,
    position) gives the same noise on every call, in eager code and inside a captured graph."""
    positions = torch.as_tensor(positions, dtype=torch.long, device=device)
    seed = torch.as_tensor(seed, dtype=torch.long, device=positions.device)
    key = _mix32((seed & _U32) ^ _mix32((positions & _U32) + 0x6A09E667))  # [...]
    v = torch.arange(vocab, dtype=torch.long, device=positions.device)
    h = _mix32(((key[..., None] ^ 0x3C6EF372) + v * 0x9E3779B1) & _U32)
    # uniform in (0, 1), 24 bits
    u = ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))
    return -torch.log(u)


def draw(probs: torch.Tensor, seed: int | torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
    """The exponential race argmax(p / E), E ~ Exp(1) i.i.d.: an exact draw from ``probs`` [..., V]
    with the noise of the token at ``position`` under ``seed`` (``race_noise``)."""
    return (probs / race_noise(seed, position, probs.shape[-1], device=probs.device)).argmax(-1)


def sample_token(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    seed: int | torch.Tensor = 0,
    position: int | torch.Tensor = 0,
) -> torch.Tensor:
    """argmax at T=0; else one ``draw`` from ``sampling_probs``: plain sampling and exact Medusa
    sampling draw the token at each position with the same noise, so with the same seed they agree."""
    if temperature <= 0:
        return greedy_tokens(logits)
    return draw(sampling_probs(logits, temperature=temperature, top_p=top_p), seed, position)


def walk(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    children: torch.Tensor,
    *,
    depth: int,
    temperature: float | torch.Tensor,
    top_p: float | torch.Tensor,
    use_nucleus: bool,
    seed: int | torch.Tensor,
    position: int | torch.Tensor,
    early: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact speculative sampling over a tree of deterministic candidates, as tensors.

    From the root (node 0): draw y at the node; if a child holds y, descend to it (the first such
    child) and draw again; otherwise y is the bonus token and the walk ends (a leaf always ends it).
    The draw at depth d is the token at ``position + d``, so every emitted token is the draw plain
    sampling makes there. ``children`` [L, W]: each node's children, -1 padded. Unrolled to
    ``depth``: draws after the walk ended change nothing (``early``: stop there, one host read a
    level). Only walked rows are tempered. Returns (accepted n [1], nodes [depth + 1] from the root,
    0 after the n-th, bonus [1])."""
    dev = logits.device
    node = torch.zeros(1, dtype=torch.long, device=dev)
    alive = torch.ones(1, dtype=torch.bool, device=dev)
    nodes, n, bonus = [node], torch.zeros(1, dtype=torch.long, device=dev), node
    for d in range(depth + 1):
        probs = tempered_probs(logits.index_select(0, node), temperature)
        y = draw(nucleus(probs, top_p) if use_nucleus else probs, seed, position + d)
        kids = children.index_select(0, node)[0]
        match = (tokens.gather(0, kids.clamp(min=0)) == y) & (kids >= 0)
        has = match.any().view(1)
        child = kids.gather(0, match.long().argmax().view(1))
        bonus = torch.where(alive & ~has, y, bonus)
        alive = alive & has
        node = torch.where(alive, child, node)
        n = n + alive.long()
        nodes.append(torch.where(alive, child, torch.zeros_like(child)))
        if early and not bool(alive):
            break
    nodes += [torch.zeros_like(node)] * (depth + 2 - len(nodes))
    return n, torch.cat(nodes[: depth + 1]), bonus


def sample_walk(
    logits: torch.Tensor,
    tokens: Sequence[int],
    children: Sequence[Sequence[int]],
    *,
    temperature: float,
    top_p: float,
    seed: int = 0,
    position: int = 0,
) -> tuple[list[int], int]:
    """``walk`` over lists: (the path of tree nodes from the root, the bonus token)."""
    depth, stack = 0, [(0, 0)]
    # the tree's depth
    while stack:
        node, d = stack.pop()
        depth = max(depth, d)
        stack += [(c, d + 1) for c in children[node]]
    toks = torch.as_tensor(list(tokens), dtype=torch.long, device=logits.device)
    n, nodes, bonus = walk(
        logits, toks, children_tensor(children, device=logits.device), depth=depth, temperature=temperature,
        top_p=top_p, use_nucleus=top_p < 1.0, seed=seed, position=position, early=True,
    )  # fmt: skip
    return nodes[: int(n) + 1].tolist(), int(bonus)


def greedy_accept(
    logits: torch.Tensor,
    path_tokens: torch.Tensor,
    ri: torch.Tensor,
    valid: torch.Tensor,
    *,
    argmax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per path: candidate at depth k passes iff it equals the argmax at depth k-1 of the same path.

    logits [L, V] (or their ``argmax`` [L], when the caller has it); path_tokens/ri/valid [P, D+1].
    Returns (accept_length [P], score [P]).
    """
    # base model's choice after each path prefix
    pred = (greedy_tokens(logits) if argmax is None else argmax)[ri[:, :-1]]  # [P, D]
    # padded slots never pass
    passed = (pred == path_tokens[:, 1:]) & valid[:, 1:]
    accept_length = passed.long().cumprod(dim=1).sum(dim=1)
    return accept_length, accept_length.float()


def typical_accept(
    logits: torch.Tensor,
    path_tokens: torch.Tensor,
    ri: torch.Tensor,
    valid: torch.Tensor,
    *,
    temperature: float,
    epsilon: float,
    delta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Typical acceptance: p(x) > min(epsilon, delta * exp(-H(p))), p = softmax(logits / T) at the parent.

    Longest path wins; ties go to the highest summed log-probability of the accepted tokens.
    """
    # T -> 0: greedy matching
    if not isinstance(temperature, torch.Tensor) and temperature <= 0:
        return greedy_accept(logits, path_tokens, ri, valid)
    probs = tempered_probs(logits, temperature)  # [L, V]
    threshold = typical_threshold(probs, epsilon=epsilon, delta=delta)
    parent = ri[:, :-1]
    p_cand = probs[parent, path_tokens[:, 1:]]  # [P, D]
    passed = (p_cand > threshold[parent]) & valid[:, 1:]
    prefix = passed.long().cumprod(dim=1)
    accept_length = prefix.sum(dim=1)
    logp = (torch.log(p_cand.clamp_min(1e-30)) * prefix).sum(dim=1)
    # Lexicographic (length, log-prob): log-probs are > -1e4 for any accepted path here.
    score = accept_length.float() * 1e6 + logp
    return accept_length, score


def typical_threshold_of_entropy(entropy: torch.Tensor, *, epsilon: float, delta: float) -> torch.Tensor:
    """Typical acceptance's threshold min(epsilon, delta * exp(-H)) at entropies H (the page's curve uses it too)."""
    return torch.clamp(delta * torch.exp(-entropy), max=epsilon)


def typical_threshold(probs: torch.Tensor, *, epsilon: float, delta: float) -> torch.Tensor:
    """min(epsilon, delta * exp(-H(p))) for distributions probs [..., V]."""
    # H = -sum p log p
    entropy = torch.special.entr(probs).sum(-1)
    return typical_threshold_of_entropy(entropy, epsilon=epsilon, delta=delta)


__all__ = [
    "greedy_accept",
    "greedy_tokens",
    "race_noise",
    "sample_token",
    "sample_walk",
    "walk",
    "draw",
    "nucleus",
    "children_tensor",
    "sampling_probs",
    "tempered_probs",
    "typical_accept",
    "typical_threshold",
    "typical_threshold_of_entropy",
]
