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
    greedy_tokens,
    sample_token,
)
from .config import METHODS, DecodeConfig, DecodeError
from .draft import Credit, Proposer
from .engine import static_refusal
from .kv import DynamicKV, StaticKV
from .messages import cause
from .model import ModelInfo, body_and_lm_head, input_device, model_info
from .plain import plain_steps
from .rules import REASONS, accept, cut, knobs_of, rule_of
from .static_run import fused_steps, ready
from .steps import RunResult, Step, sync, tree_step
from .tree.masks import TreeBuffers
from .tree.shape import MedusaTree, root_only_tree


class Proposal(NamedTuple):
    """What one Medusa step verifies."""

    # the tree (the drafter's, or the root alone)
    buffers: TreeBuffers
    # [L] token id of each tree node, on the input device
    tokens: torch.Tensor
    # what the draft adds to the step's record, carried through unread (``draft.Credit``; None: nothing)
    credit: Credit | None = None


class Verdict(NamedTuple):
    """What acceptance decided."""

    # row of retrieve_indices that was accepted
    best: int
    # candidates accepted on it
    accept_length: int
    # tree positions of the root and the accepted candidates (CPU)
    nodes: torch.Tensor  # [accept_length + 1]
    # the base model's token after the last accepted node (argmax, or a draw): the next root
    bonus: torch.Tensor


class Decoder:
    """Runs one method on one model. ``steps(prompt_ids)`` is a generator of Step records.

    Medusa methods draft with ``drafter``, which the decoder meets only through ``draft.py``'s contract
    (a ``drafters.Drafter``; ``compose.make_decoder`` makes one from Medusa heads, an EAGLE head and a
    lookup length). All run state (KV cache, drafter state) is created inside ``steps``: two runs never
    share it. With
    ``config.cache == "static"`` a run takes ``static_kv`` (shared by runs one at a time) when it is
    free and large enough, else one of its own.
    ``note`` says why a static run uses the dynamic cache instead.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        method: str = "plain",
        config: DecodeConfig = DecodeConfig(),
        static_kv: StaticKV | None = None,
        drafter: Proposer | None = None,
    ):
        if method not in METHODS:
            raise DecodeError(f"Unknown method {method!r}; choose one of {', '.join(METHODS)}.")
        config.check()
        self.model, self.method, self.config = model, method, config
        self.info: ModelInfo = model_info(model)
        self.body, self.lm_head = body_and_lm_head(model)
        # root- and path-conditioned heads read token embeddings
        self.embed = model.get_input_embeddings()
        self.device = input_device(model)
        self.out_device = self.lm_head.weight.device
        self.dtype = next(model.parameters()).dtype
        self.rule, self.knobs = rule_of(method, config), knobs_of(config)
        self.eos = torch.tensor(list(self.info.eos_token_ids or ())[:8] if config.stop_on_eos else [], dtype=torch.long)
        self.eos = torch.cat([self.eos, torch.full((8 - self.eos.numel(),), -1, dtype=torch.long)])
        # a plain step (and a Medusa step near the context limit)
        self.root_tree = self.build(root_only_tree())
        self.drafter: Proposer | None = None
        if method != "plain":
            if drafter is None:
                raise DecodeError(f"The {method} method drafts: give the decoder a drafter (compose.make_decoder).")
            self.drafter = drafter.bind(self)
        self.note: str | None = static_refusal(model) if config.cache == "static" else None
        # what the static engine's tree step holds of the drafter
        self.static_draft = None
        if config.cache == "static" and self.note is None and self.drafter is not None:
            self.static_draft = self.drafter.static(self)
            self.note = None if self.static_draft is not None else self.drafter.static_note
        # fixed-shape steps over a StaticCache
        self.static = config.cache == "static" and self.note is None
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
    def step_sizes(self) -> list[int]:
        """The tree tokens of every step shape a static step of this decoder may verify."""
        return [self.root_tree.num_nodes] + ([self.static_draft.num_nodes] if self.static_draft is not None else [])

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

    def finish(self, new: list[int], produced: int, seq_len: int) -> tuple[list[int], str | None]:
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
        need = min(prompt_len + self.config.max_new_tokens, self.info.context_limit) + max(self.step_sizes)
        shared = self.static_kv
        if (
            shared is not None
            and shared.max_len >= need
            and shared.claim(wait=0.2 if self.device.type == "cuda" else 0.0)
        ):
            shared.start()
            return shared
        # busy or too small: uncaptured static steps cost more than dynamic ones on a GPU
        if self.device.type == "cuda" and shared is not None:
            return DynamicKV(self.model)
        return StaticKV(self.model, max_len=need)

    def prefill_step(
        self, new: list[int], reason: str | None, t0: float, kv: DynamicKV | StaticKV, engine: str | None = None
    ) -> Step:
        """Step 0, timed from t0 to now: the prompt's forward and the first new token."""
        t1 = sync(self.device)
        return Step(
            0,
            tuple(new),
            t1 - t0,
            MappingProxyType({"prefill": t1 - t0}),
            finish_reason=reason,
            engine=engine or kv.engine(self.step_sizes),
        )

    # ------------------------------------------------------------------ entry
    @torch.inference_mode()
    def steps(self, prompt_ids: Sequence[int] | torch.Tensor) -> Iterator[Step]:
        ids = self._prompt_tensor(prompt_ids)
        kv = self._open_kv(ids.shape[1])
        if kv.kind == "static":
            # a capture made now (another preset, a custom tree): recorded only if it succeeds
            try:
                self.note = ready(self, kv) or self.note
            except Exception as e:  # noqa: BLE001
                # the run still runs, on the dynamic cache, and says so
                kv.release()
                self.note = f"Capturing this run's step failed ({cause(e, 120)}), so it runs with the dynamic cache."
                kv = DynamicKV(self.model)
        try:
            if kv.kind == "static":
                yield from fused_steps(self, ids, kv)
            elif self.method == "plain":
                yield from plain_steps(self, ids, kv)
            else:
                yield from self._medusa_steps(ids, kv)
        finally:
            # also when the consumer stops early: the shared static cache is free again
            kv.release()

    def run(self, prompt_ids: Sequence[int] | torch.Tensor) -> RunResult:
        return RunResult(self.method, tuple(self.steps(prompt_ids)))

    # ------------------------------------------------------------------ medusa
    @property
    def _samples_root(self) -> bool:
        return self.rule.name == "sample" or self.rule.sample_root

    def pick_root(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """The token at ``position``: a draw (seed and position key its noise), or the argmax."""
        cfg = self.config
        if self._samples_root:
            return sample_token(logits, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed, position=position)
        return greedy_tokens(logits)

    def prefill(self, ids: torch.Tensor, kv) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt ``ids`` [1, n] into ``kv``'s cache, in the recorded chunks where ``kv`` has them
        (``prefill.Prefill``), else in one forward: (the base model's features [m, d] whose last row is
        the prompt's last position (m = n), the first new token [1])."""
        if getattr(kv, "prefill", None) is not None:
            features, logits = kv.prefill.run(ids)
            return features, self.pick_root(logits, ids.shape[1])
        n = ids.shape[1]
        features = self.body(
            input_ids=ids,
            position_ids=torch.arange(n, device=self.device)[None],
            past_key_values=kv.cache,
            use_cache=True,
        ).last_hidden_state[0]
        return features, self.pick_root(self.lm_head(features[-1]), n)

    def propose(self, run, root: torch.Tensor, *, history: torch.Tensor, seq_len: int) -> Proposal:
        """The drafter's tree under ``root`` (``history[:seq_len]``: the committed tokens)."""
        dev, limit = self.device, self.info.context_limit
        # The deepest node lands at position seq_len - 1 + depth: near the context limit a
        # root-only (plain) step keeps the output exact.
        draft = (
            None if seq_len + self.drafter.depth + 1 > limit else run.propose(root, history=history, seq_len=seq_len)
        )
        if draft is None:
            return Proposal(self.root_tree, root.view(1).to(dev))
        buffers = draft.buffers if draft.buffers is not None else self.build(draft.tree)
        return Proposal(buffers, draft.tokens.to(dev), draft.credit)

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
        # only the walk reads the children
        children = bufs.children if self.rule.name == "sample" else None
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
        # cache = prefix + root + accepted
        kv.keep(seq_len - 1, nodes, proposal.buffers.num_nodes)
        # the base model's own next token after the last accepted node; the next root
        bonus = verdict.bonus
        accepted = proposal.tokens[nodes.to(self.device)][1:].tolist()
        new, reason = self.finish(accepted + [int(bonus)], produced, seq_len)
        history[seq_len : seq_len + len(new)] = torch.tensor(new, dtype=torch.long)
        # pairs (f_t, x_{t+1}) along the accepted path, the bonus last
        if reason is None and run is not None:
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
        return tree_step(
            index,
            new,
            t4 - t0,
            MappingProxyType({"propose": t1 - t0, "verify": t2 - t1, "accept": t3 - t2, "commit": t4 - t3}),
            tree=proposal.buffers.cpu,
            tree_tokens=proposal.tokens,
            nodes=verdict.nodes.tolist(),
            accepted=verdict.accept_length,
            best=verdict.best,
            credit=proposal.credit,
            drafter=self.drafter_name,
            reason=reason,
            detail=self.config.record_detail,
        )

    def _medusa_steps(self, ids: torch.Tensor, kv: DynamicKV | StaticKV) -> Iterator[Step]:
        seq_len = ids.shape[1]
        # prompt + committed tokens
        history = torch.empty(seq_len + self.config.max_new_tokens + 1, dtype=torch.long)
        history[:seq_len] = ids[0].cpu()
        run = self.drafter.open()
        # a drafter that hooked the model (EAGLE-3's layer inputs) lets go of it however the run ends
        try:
            yield from self._medusa_loop(ids, kv, run, history)
        finally:
            run.close()

    def _medusa_loop(self, ids, kv, run, history) -> Iterator[Step]:
        dev = self.device
        seq_len = ids.shape[1]

        # Prefill: the prompt's KV and the root (the first new token); the drafter reads the prompt's
        # features and the token after each.
        t0 = sync(dev)
        features, root = self.prefill(ids, kv)
        run.verified(features, torch.cat([ids[0, 1:], root.view(1).to(dev)]), 0, rows=None)
        new, reason = self.finish([int(root)], 0, seq_len)
        history[seq_len] = new[0]
        yield self.prefill_step(new, reason, t0, kv)
        produced, seq_len, index = len(new), seq_len + len(new), 1

        # the cache holds every committed token but the root: seq_len - 1 of them
        while reason is None:
            t0 = sync(dev)
            proposal = self.propose(run, root, history=history, seq_len=seq_len)
            t1 = sync(dev)
            logits, hidden = self.verify(proposal, kv=kv, prefix_len=seq_len - 1)
            t2 = sync(dev)
            verdict = self.accept(logits, proposal, seq_len)
            t3 = sync(dev)
            new, reason, root = self.commit(
                proposal, verdict, hidden=hidden, kv=kv, history=history, seq_len=seq_len, produced=produced, run=run
            )
            t4 = sync(dev)
            yield self._decode_step(index, new, reason, proposal, verdict, times=(t0, t1, t2, t3, t4))
            produced, seq_len, index = produced + len(new), seq_len + len(new), index + 1


__all__ = ["Decoder", "Proposal", "Verdict"]
