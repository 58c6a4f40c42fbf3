"""Decoders as generators of immutable step records: plain decoding and Medusa's tree decoding.

One Medusa step (reference FasterDecoding/Medusa ``medusa_generate``): ``propose`` (a drafter's
tree under the root, plus a lookup branch), ``verify`` (one forward of the tree with a float 4D
tree mask), ``accept`` (greedy, typical or exact sampling: ``rules.accept``) and ``commit`` (keep
the accepted nodes' K/V, cut at the limits: ``rules.cut``, tell the drafter what was verified).
docs/engine.md tells the whole story; the static engine runs the same rules as one program
(``fused.py``).
"""

from __future__ import annotations

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
from .config import METHODS, DecodeConfig, DecodeError
from .drafters import Drafter, DrafterError, make_drafter
from .dynamic_tree import DynamicTreeConfig
from .eagle import EagleHead
from .fused import fused_steps, ready
from .heads import MedusaHeads
from .kv import DynamicKV, StaticKV, compact_cache, new_cache, static_refusal
from .lookup import ngram_proposal
from .messages import cause
from .model import ModelError, ModelInfo, body_and_lm_head, input_device, model_info
from .rules import REASONS, accept, cut, knobs_of, rule_of
from .steps import RunResult, Step, _sync, first_difference
from .tree import MedusaTree, TreeBuffers, root_only_tree, with_lookup


class Proposal(NamedTuple):
    """What one Medusa step verifies."""

    buffers: TreeBuffers  # the tree (the drafter's, one with a lookup branch, or the root alone)
    tokens: torch.Tensor  # [L] token id of each tree node, on the input device
    lookup: int  # trailing nodes that came from the lookup branch (0: none)
    matched: int = 0  # of those, the first ``matched`` hold the context's match (the rest: static steps' guesses)


class Verdict(NamedTuple):
    """What acceptance decided."""

    best: int  # row of retrieve_indices that was accepted
    accept_length: int  # candidates accepted on it
    nodes: torch.Tensor  # [accept_length + 1] tree positions of the root and the accepted candidates (CPU)
    bonus: torch.Tensor  # the base model's token after the last accepted node (argmax, or a draw): the next root


class Decoder:
    """Runs one method on one model. ``steps(prompt_ids)`` is a generator of Step records.

    Medusa methods draft with ``drafter`` (drafters.py), or with the EAGLE head ``eagle``, or with
    the Medusa ``heads`` on ``tree``. All run state (KV cache, drafter state) is created inside
    ``steps``: two runs never share it. With ``config.cache == "static"`` a run takes ``static_kv``
    (shared by runs one at a time) when it is free and large enough, else one of its own.
    ``note`` says why a static run uses the dynamic cache instead.
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
        drafter: Drafter | None = None,
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
        self.rule, self.knobs = rule_of(method, config), knobs_of(config)
        self.eos = torch.tensor(list(self.info.eos_token_ids or ())[:8] if config.stop_on_eos else [], dtype=torch.long)
        self.eos = torch.cat([self.eos, torch.full((8 - self.eos.numel(),), -1, dtype=torch.long)])
        self.root_tree = self.build(root_only_tree())  # a plain step (and a Medusa step near the context limit)
        self.heads = heads  # the Medusa heads this decoder was given, if any (the drafter may be another)
        self.drafter: Drafter | None = None
        self.lookup_trees: dict[int, TreeBuffers] = {}  # the drafter's fixed tree plus a lookup branch of each length
        if method != "plain":
            try:
                self.drafter = make_drafter(heads=heads, tree=tree, eagle=eagle, drafter=drafter).bind(self)
            except DrafterError as e:
                raise DecodeError(str(e)) from None
        self.lookup = config.lookup if self.drafter is not None and self.drafter.branch else 0
        fixed = self.drafter.buffers if self.drafter is not None else None
        if fixed is not None:  # every length: a match may be shorter than config.lookup (static steps use the full one)
            self.lookup_trees = {c: self.build(with_lookup(fixed.cpu, c)) for c in range(1, self.lookup + 1)}
        self.note: str | None = static_refusal(model) if config.cache == "static" else None
        self.static_draft = None  # what the static engine's tree step holds of the drafter
        if config.cache == "static" and self.note is None and self.drafter is not None:
            self.static_draft = self.drafter.static(self, self.lookup)
            self.note = None if self.static_draft is not None else self.drafter.static_note
        self.static = config.cache == "static" and self.note is None  # fixed-shape steps over a StaticCache
        self.static_kv = static_kv

    def build(self, tree: MedusaTree) -> TreeBuffers:
        """A tree's buffers on this decoder's devices."""
        return TreeBuffers.build(tree, device=self.device, out_device=self.out_device, dtype=self.dtype)

    @property
    def tree(self) -> TreeBuffers | None:
        """The drafter's fixed tree (None: plain decoding, or a drafter with a new tree every step)."""
        return self.drafter.buffers if self.drafter is not None else None

    @property
    def drafter_name(self) -> str | None:
        """Who drafts this decoder's trees, as the step records name it (None: plain decoding)."""
        return self.drafter.name if self.drafter is not None else None

    @property
    def top1_nodes(self) -> tuple[int, ...]:
        """The drafted nodes that fill a static step's lookup branch past its match."""
        return self.static_draft.top1 if self.static_draft is not None else ()

    @property
    def step_trees(self) -> list[TreeBuffers]:
        """Every tree a static step of this decoder may verify (the fixed shapes of the static path)."""
        return [self.root_tree] + ([self.static_draft.buffers] if self.static_draft is not None else [])

    # ------------------------------------------------------------------ helpers
    def _prompt_tensor(self, prompt_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).flatten()
        if ids.numel() == 0:
            raise DecodeError("The prompt is empty; type some text first.")
        if ids.numel() >= self.info.context_limit:
            why = (
                f" (its sliding-window attention of {self.info.sliding_window:,} tokens limits tree attention)"
                if self.info.sliding_window
                else ""
            )
            raise DecodeError(
                f"The prompt has {ids.numel():,} tokens but the model's context holds "
                f"{self.info.context_limit:,}{why}; shorten the prompt."
            )
        return ids.to(self.device).unsqueeze(0)

    def _finish(self, new: list[int], produced: int, seq_len: int) -> tuple[list[int], str | None]:
        """Cut a step's new tokens where plain decoding would have stopped (``rules.cut``)."""
        emitted = torch.tensor(new, dtype=torch.long)
        left = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
        count, reason = cut(
            emitted,
            left([len(new) - 1]),
            budget=left(self.config.max_new_tokens - produced),
            context=left(self.info.context_limit - seq_len),
            eos=self.eos,
        )
        return new[: int(count)], REASONS[int(reason)]

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
                self.note = ready(self, kv) or self.note
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
        return self.rule.name == "sample" or self.rule.sample_root

    def _pick_root(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """The token at ``position``: a draw (seed and position key its noise), or the argmax."""
        cfg = self.config
        if self._samples_root:
            return sample_token(logits, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed, position=position)
        return greedy_tokens(logits)

    def propose(self, run, root: torch.Tensor, *, history: torch.Tensor, seq_len: int) -> Proposal:
        """The drafter's tree under ``root`` [+ a lookup chain from ``history[:seq_len]``]."""
        dev, limit = self.device, self.info.context_limit
        # The deepest node lands at position seq_len - 1 + depth: near the context limit a
        # root-only (plain) step keeps the output exact.
        draft = (
            None if seq_len + self.drafter.depth + 1 > limit else run.propose(root, history=history, seq_len=seq_len)
        )
        if draft is None:
            return Proposal(self.root_tree, root.view(1).to(dev), 0)
        chain = history[:0]
        if self.lookup:  # the chain's last node must fit in the context too
            chain = ngram_proposal(history[:seq_len], length=self.lookup)[: max(0, limit - seq_len - 1)]
        c = chain.numel()
        if not c:
            buffers = draft.buffers if draft.buffers is not None else self.build(draft.tree)
            return Proposal(buffers, draft.tokens.to(dev), draft.lookup, draft.lookup)
        buffers = self.lookup_trees[c] if draft.buffers is not None else self.build(with_lookup(draft.tree, c))
        return Proposal(buffers, torch.cat([draft.tokens.to(dev), chain.to(dev)]), c, c)

    def verify(
        self, proposal: Proposal, *, kv: DynamicKV | StaticKV, prefix_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of all tree tokens after the ``prefix_len`` cached ones, every node seeing the
        prefix, the root, its ancestors and itself: (logits [L, V], hidden states [L, d])."""
        return kv.forward(proposal.tokens, proposal.buffers, prefix_len)

    def accept(self, logits: torch.Tensor, proposal: Proposal, seq_len: int) -> Verdict:
        """The step's rule over the verified tree (``rules.accept``), read back to the host."""
        bufs = proposal.buffers
        tokens = proposal.tokens.to(logits.device)
        children = bufs.children if self.rule.name == "sample" else None  # only the walk reads the children
        n, nodes, best, bonus = accept(
            self.rule, logits, tokens, bufs.paths, bufs.valid, children, knobs=self.knobs, seq_len=seq_len, early=True
        )
        n = int(n)
        return Verdict(int(best), n, nodes[: n + 1].cpu(), bonus[0])

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
        run=None,
    ) -> tuple[list[int], str | None, torch.Tensor]:
        """Keep the accepted nodes' KV, commit accepted + bonus tokens (cut at the limits) and tell
        the drafter the verified features of the accepted path. Returns (new tokens, finish reason,
        the next root)."""
        nodes = verdict.nodes
        kv.keep(seq_len - 1, nodes, proposal.buffers.num_nodes)  # cache = prefix + root + accepted
        bonus = verdict.bonus  # the base model's own next token after the last accepted node; the next root
        accepted = proposal.tokens[nodes.to(self.device)][1:].tolist()
        new, reason = self._finish(accepted + [int(bonus)], produced, seq_len)
        history[seq_len : seq_len + len(new)] = torch.tensor(new, dtype=torch.long)
        if reason is None and run is not None:  # pairs (f_t, x_{t+1}) along the accepted path, the bonus last
            tokens = torch.tensor(accepted + [int(bonus)], device=self.device)
            run.verified(hidden[nodes.to(hidden.device)], tokens, seq_len - 1, rows=nodes)
        return new, reason, bonus

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
        start = proposal.buffers.num_nodes - proposal.lookup  # first lookup node
        # only nodes that hold the context's match count as lookup tokens (a static step's guesses do not)
        from_context = ((verdict.nodes[1:] >= start) & (verdict.nodes[1:] < start + proposal.matched)).sum()
        return Step(
            index,
            tuple(new),
            t4 - t0,
            MappingProxyType({"propose": t1 - t0, "verify": t2 - t1, "accept": t3 - t2, "commit": t4 - t3}),
            accept_length=min(verdict.accept_length, len(new) - 1) if new else 0,  # the cut may drop candidates
            lookup_accepted=min(int(from_context), len(new) - 1) if proposal.matched and new else 0,
            tree=proposal.buffers.cpu if detail else None,
            tree_tokens=proposal.tokens if detail else None,
            best_path=verdict.best if detail else None,
            finish_reason=reason,
            drafter=self.drafter_name,
            draft_depth=proposal.buffers.depth,  # 0 for a root-only step (no draft, or near the context limit)
            draft_tokens=proposal.buffers.num_nodes - 1,
        )

    def _medusa_steps(self, ids: torch.Tensor, kv: DynamicKV | StaticKV) -> Iterator[Step]:
        seq_len = ids.shape[1]
        history = torch.empty(seq_len + self.config.max_new_tokens + 1, dtype=torch.long)  # prompt + committed tokens
        history[:seq_len] = ids[0].cpu()
        run = self.drafter.open()
        try:  # a drafter that hooked the model (EAGLE-3's layer inputs) lets go of it however the run ends
            yield from self._medusa_loop(ids, kv, run, history)
        finally:
            run.close()

    def _medusa_loop(self, ids, kv, run, history) -> Iterator[Step]:
        dev = self.device
        seq_len = ids.shape[1]

        # Prefill: the prompt's KV and the root (the first new token); the drafter reads the prompt's
        # features and the token after each.
        t0 = _sync(dev)
        features = self.body(
            input_ids=ids,
            position_ids=torch.arange(seq_len, device=dev)[None],
            past_key_values=kv.cache,
            use_cache=True,
        ).last_hidden_state[0]
        root = self._pick_root(self.lm_head(features[-1]), seq_len)
        run.verified(features, torch.cat([ids[0, 1:], root.view(1).to(dev)]), 0, rows=None)
        new, reason = self._finish([int(root)], 0, seq_len)
        history[seq_len] = new[0]
        yield self._prefill_step(new, reason, t0, kv)
        produced, seq_len, index = len(new), seq_len + len(new), 1

        while reason is None:  # the cache holds every committed token but the root: seq_len - 1 of them
            t0 = _sync(dev)
            proposal = self.propose(run, root, history=history, seq_len=seq_len)
            t1 = _sync(dev)
            logits, hidden = self.verify(proposal, kv=kv, prefix_len=seq_len - 1)
            t2 = _sync(dev)
            verdict = self.accept(logits, proposal, seq_len)
            t3 = _sync(dev)
            new, reason, root = self.commit(
                proposal, verdict, hidden=hidden, kv=kv, history=history, seq_len=seq_len, produced=produced, run=run
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
    drafter: Drafter | None = None,
) -> RunResult:
    """Convenience: build a Decoder and collect its whole run."""
    kw = dict(heads=heads, tree=tree, config=config, static_kv=static_kv, eagle=eagle, drafter=drafter)
    return Decoder(model, method=method, **kw).run(prompt_ids)


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
