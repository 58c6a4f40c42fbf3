"""Four decoders as generators of immutable step records.

* ``plain``: one token per forward (greedy, or sampling with temperature / top-p / seed).
* ``medusa-greedy``: Medusa-1 tree decoding, accept a candidate iff it is the base model's
  argmax; the output equals plain greedy decoding (up to floating-point ties).
* ``medusa-sample``: exact (lossless) speculative sampling over the tree: at the root draw y from
  the model's p = softmax(logits / T) (top-p), descend to the child whose token is y and draw
  again there, until y is no child's token (or a leaf is reached): y is the bonus token. Every
  emitted token is one draw from the model's conditional given the tokens before it, made with
  the same function (``sample_token``) and the same noise (keyed by seed and position) as plain
  sampling, so with the same seed the output equals plain sampling's token for token (up to
  floating-point ties). The tree's
  candidates are deterministic (top-k), so no draft probabilities are needed (q = 1; EAGLE's
  ``evaluate_posterior``, the Medusa maintainers' recommendation for exact sampling).
* ``medusa-typical``: the paper's typical acceptance (arXiv 2401.10774, Sec. 2.3.1):
  accept iff p(x) > min(epsilon, delta * exp(-H(p))), p = softmax(logits / T). Faster than
  exact sampling but not lossless: its text is not a sample from the model's distribution.

One Medusa step (reference FasterDecoding/Medusa ``medusa_generate``), with a single forward; each
phase is a method of ``Decoder`` over the ``TreeBuffers`` of the tree it verifies:
  propose  tree tokens = [root, head-1 top-k, head-2 top-k, ...][tree_indices] (path-conditioned
           heads fill the tree level by level instead: ``MedusaHeads.draft``); with
           ``DecodeConfig.lookup`` > 0, plus a lookup branch under the root: the tokens that
           followed an earlier occurrence of the context's last few tokens (``lookup.py``,
           ``tree.with_lookup``), verified and accepted like any other path (reference
           ``generate_candidates``)
  verify   body(tree tokens, float 4D tree mask, position_ids = cache length + depth, the run's cache:
           DynamicCache, or StaticCache with fixed-shape, capturable steps; kv.py)
           (reference ``tree_decoding``)
  accept   per root-to-leaf path, count leading candidates that pass; keep the longest path
           (reference ``evaluate_posterior``); exact sampling walks the tree draw by draw instead.
           The bonus token is chosen here too (argmax, or a draw)
  commit   gather the accepted tree slots of every cache layer to the front of the tree
           region, crop the rest; the bonus token (the base model's token after the last accepted
           node) is the next root and the heads read that node's hidden state to seed the next
           tree (reference ``update_inference_inputs``).
Tokens per step = accept_length + 1.

Drafters: the Medusa heads (above), or an EAGLE head (``eagle.py``; ``Decoder(..., eagle=head)``):
then ``propose`` first feeds the drafter the verified features of the last step's accepted path,
then drafts a new dynamic tree (EAGLE-2, ``dynamic_tree.py``) of a fixed size; verify, accept and
commit are the same, and so are every exactness guarantee and the budget and context cuts.

Engines: on the dynamic cache (``kv.DynamicKV``) the phases above run as separate calls; on the
static cache a whole step is one fixed-shape device program (``fused.py``: captured as one CUDA
graph on a GPU, eager on a CPU) with the same outputs. The records a run yields live in
``steps.py``; the acceptance and sampling rules (pure functions of logits) in ``acceptance.py``;
the caches and captured steps in ``kv.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterator, NamedTuple, Sequence

import torch
from torch import nn

from .acceptance import (
    greedy_accept,
    greedy_tokens,
    race_noise,
    sample_token,
    sample_walk,
    sampling_probs,
    tempered_probs,
    typical_accept,
    typical_threshold,
    typical_threshold_of_entropy,
)
from .dynamic_tree import DynamicTreeConfig, as_medusa_tree
from .eagle import EagleHead, EagleRun
from .fused import fused_steps, ready
from .heads import MedusaHeads
from .kv import CACHES, DynamicKV, StaticKV, compact_cache, new_cache, static_refusal
from .lookup import MAX_LOOKUP, ngram_proposal
from .lookup import is_length as is_lookup_length
from .messages import InputError, cause
from .model import ModelError, ModelInfo, body_and_lm_head, input_device, model_info
from .steps import RunResult, Step, _sync, first_difference
from .tree import MedusaTree, TreeBuffers, root_only_tree, with_lookup

METHODS = ("plain", "medusa-greedy", "medusa-typical", "medusa-sample")


class DecodeError(InputError):
    """Settings a decoder cannot run with. One sentence that says what to change."""


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 128  # stop after this many new tokens
    temperature: float = 0.0  # 0 = greedy; plain sampling and typical acceptance use softmax(logits / T)
    top_p: float = 1.0  # nucleus sampling for plain sampling and the sampled root
    seed: int = 0  # sampling seed (a run is reproducible)
    posterior_threshold: float = 0.09  # epsilon of typical acceptance (hard threshold)
    posterior_alpha: float = 0.3  # delta of typical acceptance (entropy-dependent threshold)
    sample_root: bool = False  # typical: sample the root/bonus token instead of argmax (medusa-sample always samples)
    stop_on_eos: bool = True
    record_detail: bool = True  # keep tree tokens/paths in the step records (for the inspector)
    lookup: int = 0  # Medusa: length of the lookup branch (n-gram proposals from the context, lookup.py); 0 = off
    cache: str = "dynamic"  # "dynamic": DynamicCache; "static": StaticCache and fixed-shape steps (kv.py)

    def check(self) -> None:
        if not (1 <= self.max_new_tokens <= 32768):
            raise DecodeError(f"max_new_tokens must be between 1 and 32768 (got {self.max_new_tokens}).")
        if not (0 <= self.temperature < math.inf):
            raise DecodeError(f"temperature must be 0 (greedy) or a finite positive number (got {self.temperature}).")
        if not (0 < self.top_p <= 1):
            raise DecodeError(f"top_p must be in (0, 1] (got {self.top_p}).")
        if not (0 <= self.posterior_threshold <= 1):
            raise DecodeError(
                f"epsilon (posterior_threshold) must be between 0 and 1 (got {self.posterior_threshold})."
            )
        if not (0 <= self.posterior_alpha <= 1):
            raise DecodeError(f"delta (posterior_alpha) must be between 0 and 1 (got {self.posterior_alpha}).")
        if not is_lookup_length(self.lookup):
            raise DecodeError(
                f"lookup (the lookup branch's length) must be a whole number from 0 (off) to {MAX_LOOKUP} (got {self.lookup})."
            )
        if self.cache not in CACHES:
            raise DecodeError(f"cache must be one of {', '.join(CACHES)} (got {self.cache!r}).")


class Proposal(NamedTuple):
    """What one Medusa step verifies."""

    buffers: TreeBuffers  # the tree (the full one, one with a lookup branch, or the root alone)
    tokens: torch.Tensor  # [L] token id of each tree node, on the input device
    lookup: int  # trailing nodes that came from the lookup branch (0: none)
    matched: int = (
        0  # of those, the first ``matched`` hold the context's n-gram match (the rest: guesses, static steps only)
    )


class EagleInput(NamedTuple):
    """What the EAGLE drafter reads before its next draft: verified pairs (f_t, x_{t+1})."""

    run: EagleRun  # this run's drafter state
    features: torch.Tensor  # [n, d] the base model's features f_start .. f_{start+n-1}
    tokens: torch.Tensor  # [n] the tokens after them x_{start+1} .. x_{start+n} (the last one: the root)
    start: int  # position of the first feature


class Verdict(NamedTuple):
    """What acceptance decided."""

    best: int  # row of retrieve_indices that was accepted
    accept_length: int  # candidates accepted on it
    nodes: torch.Tensor  # [accept_length + 1] tree positions of the root and the accepted candidates (CPU)
    bonus: torch.Tensor  # the base model's token after the last accepted node (argmax, or a draw): the next root


class Decoder:
    """Runs one method on one model. ``steps(prompt_ids)`` is a generator of Step records.

    All run state (KV cache, sampler) is created inside ``steps``: two runs never share a cache.
    With ``config.cache == "static"`` a run takes ``static_kv`` (a StaticKV built and captured at
    load, shared by runs one at a time) when it is free and large enough, else one of its own (_open_kv).
    ``note`` says why a static run uses the dynamic cache instead (a model the static path refuses).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        method: str = "plain",
        heads: MedusaHeads | None = None,
        tree: MedusaTree | DynamicTreeConfig | None = None,
        config: DecodeConfig = DecodeConfig(),
        static_kv: StaticKV | None = None,
        eagle: EagleHead | None = None,
    ):
        if method not in METHODS:
            raise DecodeError(f"Unknown method {method!r}; choose one of {', '.join(METHODS)}.")
        config.check()
        self.model, self.method, self.config = model, method, config
        self.info: ModelInfo = model_info(model)
        self.body, self.lm_head = body_and_lm_head(model)
        self.embed = model.get_input_embeddings()  # root- and path-conditioned heads read token embeddings
        self.device = input_device(model)
        self.out_device = self.lm_head.weight.device
        self.dtype = next(model.parameters()).dtype
        self.heads = heads
        self.eagle = eagle if method != "plain" else None  # the drafter: an EAGLE head instead of the Medusa heads
        self.drafter = None if method == "plain" else ("eagle" if self.eagle is not None else "medusa")
        self.note: str | None = static_refusal(model) if config.cache == "static" else None
        if config.cache == "static" and self.eagle is not None and self.note is None:
            self.note = "The EAGLE drafter runs with the dynamic cache only (its tree changes every step); this run uses the dynamic cache."
        self.static = config.cache == "static" and self.note is None  # fixed-shape steps over a StaticCache
        self.static_kv = static_kv
        where = {"device": self.device, "out_device": self.out_device, "dtype": self.dtype}
        self.tree: TreeBuffers | None = None  # the tree every Medusa step verifies
        self.root_tree = TreeBuffers.build(
            root_only_tree(), **where
        )  # the root alone: a plain step (and Medusa's near the context limit)
        self.lookup_trees: dict[int, TreeBuffers] = {}  # the tree plus a lookup branch of each length
        self.top1_nodes: list[int] = []  # tree positions of the heads' top-1 chain [0], [0, 0], ...
        self.dynamic: DynamicTreeConfig | None = None  # the EAGLE drafter's tree settings
        if self.eagle is not None:
            self.eagle.check_fits(model)
            self.dynamic = tree if isinstance(tree, DynamicTreeConfig) else self.eagle.config.tree
            self.dynamic.check()
        elif method != "plain":  # every Medusa method
            if heads is None or not isinstance(tree, MedusaTree):
                raise DecodeError(f"{method} needs Medusa heads and a tree.")
            heads.check_fits(model)
            if tree.depth > heads.num_heads:
                raise DecodeError(
                    f"The tree is {tree.depth} levels deep but the heads only predict {heads.num_heads} tokens ahead; use a tree of depth <= {heads.num_heads}."
                )
            self.tree = TreeBuffers.build(tree, **where)
            # Every possible length: the proposal may be shorter than config.lookup (static steps always use the full one).
            self.lookup_trees = {
                c: TreeBuffers.build(with_lookup(tree, c), **where) for c in range(1, config.lookup + 1)
            }
            position = {c: j + 1 for j, c in enumerate(tree.choices)}
            self.top1_nodes = [position[(0,) * d] for d in range(1, tree.depth + 1) if (0,) * d in position]

    @property
    def step_trees(self) -> list[TreeBuffers]:
        """Every tree a step of this decoder may verify (the fixed shapes of the static path)."""
        if self.method == "plain" or self.eagle is not None:
            return [self.root_tree]
        return [
            self.root_tree,
            self.lookup_trees[self.config.lookup] if self.static and self.config.lookup else self.tree,
        ]

    # ------------------------------------------------------------------ helpers
    def _prompt_tensor(self, prompt_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).flatten()
        if ids.numel() == 0:
            raise DecodeError("The prompt is empty; type some text first.")
        if ids.numel() >= self.info.context_limit:
            why = (
                f" (its sliding-window attention of {self.info.sliding_window} tokens limits tree attention)"
                if self.info.sliding_window
                else ""
            )
            raise DecodeError(
                f"The prompt has {ids.numel()} tokens but the model's context holds {self.info.context_limit}{why}; shorten the prompt."
            )
        return ids.to(self.device).unsqueeze(0)

    def _finish(self, new: list[int], produced: int, seq_len: int) -> tuple[list[int], str | None]:
        """Cut a step's new tokens where plain decoding would have stopped.

        First to the room left (new-token budget, then context), then at the first EOS inside
        that cut: a multi-token step must never write past either limit, whatever follows."""
        cfg, eos = self.config, self.info.eos_token_ids
        budget, context = cfg.max_new_tokens - produced, self.info.context_limit - seq_len
        room = min(budget, context)
        cut = new[:room]
        if cfg.stop_on_eos and eos:
            for i, t in enumerate(cut):
                if t in eos:
                    return cut[: i + 1], "eos"
        if len(new) >= room:
            return cut, "length" if budget <= context else "context"
        return cut, None

    def _open_kv(self, prompt_len: int) -> DynamicKV | StaticKV:
        """This run's cache: the shared captured StaticKV when it is free and holds the run, else one
        of the run's own: a static one sized for prompt + new tokens + the largest step (on a GPU a
        dynamic one: eager static steps cost more there than dynamic ones)."""
        if not self.static:
            return DynamicKV(self.model)
        need = min(prompt_len + self.config.max_new_tokens, self.info.context_limit) + max(
            b.num_nodes for b in self.step_trees
        )
        shared = self.static_kv
        if (
            shared is not None
            and shared.max_len >= need
            and shared.claim(wait=0.2 if self.device.type == "cuda" else 0.0)
        ):
            shared.start()
            return shared
        if (
            self.device.type == "cuda" and shared is not None
        ):  # busy or too small: uncaptured static steps cost more than dynamic ones on a GPU
            return DynamicKV(self.model)
        return StaticKV(self.model, max_len=need)

    def _prefill_step(
        self, new: list[int], reason: str | None, t0: float, kv: DynamicKV | StaticKV, engine: str | None = None
    ) -> Step:
        """Step 0, timed from t0 to now: the prompt's forward and the first new token."""
        t1 = _sync(self.device)
        return Step(
            0,
            tuple(new),
            t1 - t0,
            MappingProxyType({"prefill": t1 - t0}),
            finish_reason=reason,
            engine=engine or kv.engine(b.num_nodes for b in self.step_trees),
        )

    # ------------------------------------------------------------------ entry
    @torch.inference_mode()
    def steps(self, prompt_ids: Sequence[int] | torch.Tensor) -> Iterator[Step]:
        ids = self._prompt_tensor(prompt_ids)
        kv = self._open_kv(ids.shape[1])
        if kv.kind == "static":
            try:  # a capture made now (another preset, a custom tree): recorded only if it succeeds
                ready(self, kv)
            except Exception as e:  # noqa: BLE001  the run still runs, on the dynamic cache, and says so
                kv.release()
                self.note = f"Capturing this run's step failed ({cause(e, 120)}), so it runs with the dynamic cache."
                kv = DynamicKV(self.model)
        try:
            if kv.kind == "static":
                yield from fused_steps(self, ids, kv)
            elif self.method == "plain":
                yield from self._plain_steps(ids, kv)
            else:
                yield from self._medusa_steps(ids, kv)
        finally:  # also when the consumer stops early: the shared static cache is free again
            kv.release()

    def run(self, prompt_ids: Sequence[int] | torch.Tensor) -> RunResult:
        return RunResult(self.method, tuple(self.steps(prompt_ids)))

    # ------------------------------------------------------------------ plain
    def _plain_steps(self, ids: torch.Tensor, kv: DynamicKV) -> Iterator[Step]:
        cfg, dev = self.config, self.device
        draw = dict(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)
        seq_len = ids.shape[1]
        t0 = _sync(dev)
        logits = self.model(
            input_ids=ids,
            position_ids=torch.arange(seq_len, device=dev)[None],
            past_key_values=kv.cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[0, -1]
        token = sample_token(logits, position=seq_len, **draw)
        new, reason = self._finish([int(token)], 0, seq_len)
        yield self._prefill_step(new, reason, t0, kv)
        produced, seq_len, index = len(new), seq_len + len(new), 1
        while reason is None:
            t0 = _sync(dev)
            pos = torch.tensor([[seq_len - 1]], device=dev)  # the stock call, as model.generate makes it
            logits = self.model(
                input_ids=token.view(1, 1).to(dev), position_ids=pos, past_key_values=kv.cache, use_cache=True
            ).logits[0, -1]
            t1 = _sync(dev)
            token = sample_token(logits, position=seq_len, **draw)
            new, reason = self._finish([int(token)], produced, seq_len)
            t2 = _sync(dev)
            yield Step(
                index,
                tuple(new),
                t2 - t0,
                MappingProxyType({"verify": t1 - t0, "accept": t2 - t1}),
                accept_length=0,
                finish_reason=reason,
            )
            produced, seq_len, index = produced + len(new), seq_len + len(new), index + 1

    # ------------------------------------------------------------------ medusa
    @property
    def _samples_root(self) -> bool:
        cfg = self.config
        return cfg.temperature > 0 and (
            self.method == "medusa-sample" or (self.method == "medusa-typical" and cfg.sample_root)
        )

    def _pick_root(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """The token at ``position``: a draw (seed and position key its noise), or the argmax."""
        cfg = self.config
        if self._samples_root:
            return sample_token(logits, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed, position=position)
        return greedy_tokens(logits)

    def _draft(self, hidden: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        """[L] the heads' tokens for every node of the full tree, read from one hidden state [d] under ``root``."""
        return self.heads.draft(hidden, self.lm_head, self.tree.out, root, self.embed)

    def propose(self, drafted: torch.Tensor, root: torch.Tensor, *, history: torch.Tensor, seq_len: int) -> Proposal:
        """Tree tokens = the heads' draft [+ a lookup chain from ``history[:seq_len]``], and the tree they fill."""
        if isinstance(drafted, EagleInput):
            return self._propose_eagle(drafted, root, history=history, seq_len=seq_len)
        cfg, dev, limit = self.config, self.device, self.info.context_limit
        # The deepest node lands at position seq_len - 1 + depth: near the context limit a
        # root-only (plain) step keeps the output exact.
        if seq_len + self.tree.depth + 1 > limit:
            return Proposal(self.root_tree, root.view(1).to(dev), 0)
        if cfg.lookup:
            chain = ngram_proposal(history[:seq_len], length=cfg.lookup)[
                : max(0, limit - seq_len - 1)
            ]  # the chain's last node must fit in the context too
            if chain.numel():
                return Proposal(
                    self.lookup_trees[chain.numel()],
                    torch.cat([drafted.to(dev), chain.to(dev)]),
                    chain.numel(),
                    chain.numel(),
                )
        return Proposal(self.tree, drafted.to(dev), 0)

    def _propose_eagle(
        self, drafted: EagleInput, root: torch.Tensor, *, history: torch.Tensor, seq_len: int
    ) -> Proposal:
        """The EAGLE drafter reads the verified features of the last accepted path (its cache then
        holds every committed position), then drafts this step's dynamic tree [+ a lookup branch]."""
        cfg, dev, limit = self.config, self.device, self.info.context_limit
        run = drafted.run
        run.extend(drafted.features, drafted.tokens, drafted.start)
        if seq_len + self.dynamic.depth + 1 > limit:  # the deepest node must fit in the context: a plain step
            return Proposal(self.root_tree, root.view(1).to(dev), 0)
        tree = run.draft(root)
        shape, tokens, lookup = as_medusa_tree(tree, top_k=self.dynamic.top_k), tree.tokens.to(dev), 0
        if cfg.lookup:
            chain = ngram_proposal(history[:seq_len], length=cfg.lookup)[: max(0, limit - seq_len - 1)]
            if chain.numel():
                shape, tokens, lookup = (
                    with_lookup(shape, chain.numel()),
                    torch.cat([tokens, chain.to(dev)]),
                    chain.numel(),
                )
        return Proposal(
            TreeBuffers.build(shape, device=dev, out_device=self.out_device, dtype=self.dtype), tokens, lookup, lookup
        )

    def verify(
        self, proposal: Proposal, *, kv: DynamicKV | StaticKV, prefix_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of all tree tokens after the ``prefix_len`` cached ones, every node seeing the
        prefix, the root, its ancestors and itself: (logits [L, V], hidden states [L, d])."""
        return kv.forward(proposal.tokens, proposal.buffers, prefix_len)

    def accept(self, logits: torch.Tensor, proposal: Proposal, seq_len: int) -> Verdict:
        """Per root-to-leaf path, the leading candidates that pass (greedy or typical); the best path
        wins; then the bonus token after it. Exact sampling walks the tree draw by draw instead."""
        cfg = self.config
        if self.method == "medusa-sample" and cfg.temperature > 0:
            return self._accept_by_sampling(logits, proposal, seq_len)
        argmax = greedy_tokens(logits)  # [L]: the base model's greedy choice after every node
        ri = proposal.buffers.out.retrieve_indices
        valid = ri >= 0  # padded slots never pass
        ri = ri.clamp(min=0)
        path_tokens = proposal.tokens.to(logits.device)[ri]  # [P, D+1] token ids along every path
        if self.method == "medusa-typical" and cfg.temperature > 0:
            accept_length, score = typical_accept(
                logits,
                path_tokens,
                ri,
                valid,
                temperature=cfg.temperature,
                epsilon=cfg.posterior_threshold,
                delta=cfg.posterior_alpha,
            )
        else:
            accept_length, score = greedy_accept(logits, path_tokens, ri, valid, argmax=argmax)
        best = int(score.argmax())  # first best path on ties
        n = int(accept_length[best])
        nodes = proposal.buffers.cpu.retrieve_indices[best, : n + 1]
        last = int(nodes[-1])
        bonus = self._pick_root(logits[last], seq_len + n) if self._samples_root else argmax[last]
        return Verdict(best, n, nodes, bonus)

    def _accept_by_sampling(self, logits: torch.Tensor, proposal: Proposal, seq_len: int) -> Verdict:
        """``sample_walk`` over the proposal's tree (its first draw is the token at ``seq_len``); the
        accepted path is reported as the first root-to-leaf row of the tree that starts with it."""
        cfg, tree = self.config, proposal.buffers.cpu
        path, bonus = sample_walk(
            logits,
            proposal.tokens.tolist(),
            tree.children,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            seed=cfg.seed,
            position=seq_len,
        )
        nodes = torch.tensor(path, dtype=torch.long)
        rows = tree.retrieve_indices[:, : len(path)]
        best = int((rows == nodes).all(dim=1).long().argmax())  # every node lies on some root-to-leaf row
        return Verdict(best, len(path) - 1, nodes, torch.tensor(bonus, device=logits.device))

    def commit(
        self,
        proposal: Proposal,
        verdict: Verdict,
        *,
        hidden: torch.Tensor,
        kv: DynamicKV | StaticKV,
        history: torch.Tensor,
        seq_len: int,
        produced: int,
        eagle_run: EagleRun | None = None,
    ) -> tuple[list[int], str | None, torch.Tensor, torch.Tensor | EagleInput | None]:
        """Keep the accepted nodes' KV, commit accepted + bonus tokens (cut at the limits), draft the next tree
        (the Medusa heads), or hand the accepted path's verified features to the EAGLE drafter.

        Returns (new tokens, finish reason, next root, next draft; None once the run has finished)."""
        nodes = verdict.nodes
        kv.keep(seq_len - 1, nodes, proposal.buffers.num_nodes)  # cache = prefix + root + accepted
        last = int(nodes[-1])
        bonus = verdict.bonus  # the base model's own next token after the last accepted node; the next root
        accepted = proposal.tokens[nodes.to(self.device)][1:].tolist()
        new, reason = self._finish(accepted + [int(bonus)], produced, seq_len)
        history[seq_len : seq_len + len(new)] = torch.tensor(new, dtype=torch.long)
        if reason is None and eagle_run is not None:  # pairs (f_t, x_{t+1}) along the accepted path, the bonus last
            return (
                new,
                reason,
                bonus,
                EagleInput(
                    eagle_run,
                    hidden[nodes.to(hidden.device)],
                    torch.tensor(accepted + [int(bonus)], device=self.device),
                    seq_len - 1,
                ),
            )
        drafted = (
            self._draft(hidden[last], bonus) if reason is None else None
        )  # seeded by the last accepted node's hidden state
        return new, reason, bonus, drafted

    def _decode_step(
        self,
        index: int,
        new: list[int],
        reason: str | None,
        proposal: Proposal,
        verdict: Verdict,
        *,
        times: tuple[float, ...],
    ) -> Step:
        """The record of one Medusa step; ``times`` are the synced timestamps around its four phases."""
        t0, t1, t2, t3, t4 = times
        detail = self.config.record_detail
        lookup_start = proposal.buffers.num_nodes - proposal.lookup  # first lookup-branch node
        return Step(
            index,
            tuple(new),
            t4 - t0,
            MappingProxyType({"propose": t1 - t0, "verify": t2 - t1, "accept": t3 - t2, "commit": t4 - t3}),
            accept_length=min(verdict.accept_length, len(new) - 1)
            if new
            else 0,  # the cut may drop accepted candidates
            # only nodes that hold the context's match count as lookup tokens (a static step's guesses do not)
            lookup_accepted=min(
                int(
                    ((verdict.nodes[1:] >= lookup_start) & (verdict.nodes[1:] < lookup_start + proposal.matched)).sum()
                ),
                len(new) - 1,
            )
            if proposal.matched and new
            else 0,
            tree=proposal.buffers.cpu if detail else None,
            tree_tokens=proposal.tokens if detail else None,
            best_path=verdict.best if detail else None,
            finish_reason=reason,
            drafter=self.drafter,
        )

    def _medusa_steps(self, ids: torch.Tensor, kv: DynamicKV | StaticKV) -> Iterator[Step]:
        cfg, dev = self.config, self.device
        seq_len = ids.shape[1]
        history = torch.empty(
            seq_len + cfg.max_new_tokens + 1, dtype=torch.long
        )  # prompt + committed tokens, for the lookup branch
        history[:seq_len] = ids[0].cpu()

        # Prefill: the prompt's KV, the root (first new token) and the heads' first draft of the tree
        # (EAGLE: the prompt's features and next tokens, which the drafter reads in the first propose).
        t0 = _sync(dev)
        features = self.body(
            input_ids=ids,
            position_ids=torch.arange(seq_len, device=dev)[None],
            past_key_values=kv.cache,
            use_cache=True,
        ).last_hidden_state[0]
        hidden = features[-1]
        root = self._pick_root(self.lm_head(hidden), seq_len)
        eagle_run = EagleRun(self.eagle, self.dynamic) if self.eagle is not None else None
        drafted = (
            EagleInput(eagle_run, features, torch.cat([ids[0, 1:], root.view(1).to(dev)]), 0)
            if eagle_run
            else self._draft(hidden, root)
        )
        new, reason = self._finish([int(root)], 0, seq_len)
        history[seq_len] = new[0]
        yield self._prefill_step(new, reason, t0, kv)
        produced, seq_len, index = len(new), seq_len + len(new), 1

        while reason is None:  # the cache holds every committed token but the root: seq_len - 1 of them
            t0 = _sync(dev)
            proposal = self.propose(drafted, root, history=history, seq_len=seq_len)
            t1 = _sync(dev)
            logits, hidden = self.verify(proposal, kv=kv, prefix_len=seq_len - 1)
            t2 = _sync(dev)
            verdict = self.accept(logits, proposal, seq_len)
            t3 = _sync(dev)
            new, reason, root, drafted = self.commit(
                proposal,
                verdict,
                hidden=hidden,
                kv=kv,
                history=history,
                seq_len=seq_len,
                produced=produced,
                eagle_run=eagle_run,
            )
            t4 = _sync(dev)
            yield self._decode_step(index, new, reason, proposal, verdict, times=(t0, t1, t2, t3, t4))
            produced, seq_len, index = produced + len(new), seq_len + len(new), index + 1


def run_method(
    model,
    prompt_ids,
    *,
    method: str,
    heads=None,
    tree=None,
    config: DecodeConfig = DecodeConfig(),
    static_kv: StaticKV | None = None,
    eagle: EagleHead | None = None,
) -> RunResult:
    """Convenience: build a Decoder and collect its whole run."""
    return Decoder(model, method=method, heads=heads, tree=tree, config=config, static_kv=static_kv, eagle=eagle).run(
        prompt_ids
    )


# Step records (steps.py) and the acceptance/sampling rules (acceptance.py) are re-exported: callers
# that build or read a run import them from here, beside the Decoder that uses them.
__all__ = [
    "Decoder",
    "DecodeConfig",
    "DecodeError",
    "METHODS",
    "ModelError",
    "RunResult",
    "Step",
    "StaticKV",
    "compact_cache",
    "first_difference",
    "greedy_accept",
    "greedy_tokens",
    "model_info",
    "new_cache",
    "race_noise",
    "run_method",
    "sample_token",
    "sample_walk",
    "sampling_probs",
    "tempered_probs",
    "typical_accept",
    "typical_threshold",
    "typical_threshold_of_entropy",
]
