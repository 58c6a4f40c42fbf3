"""The whole decode step as one fixed-shape device program: the static engine's step.

A run on a ``StaticKV`` (kv.py) decodes with ``Program``s, one per tree shape, rule and drafter
(the plain step is the root-only tree). ``Program.step`` runs the phases of the dynamic decoder
(verify, accept, cut, commit, draft) with the same rules (``rules.py``) from and into device
buffers of fixed shape and address (``FusedState``), so it reads nothing back inside and is
captured whole: one CUDA graph per program on a GPU, eager on a CPU. The host loop
(``static_run.fused_steps``) runs it and makes one small device-to-host read per step. docs/engine.md.
"""

from __future__ import annotations

import time

import torch

from .kv import COMPILE_MODE
from .messages import cause
from .rules import Knobs, Rule, accept, cut
from .tree.masks import TreeBuffers, additive_mask
from .tree.parents import ancestry, children_of

# longest accepted path + bonus a step may report (depth + 1, lookup branch included)
WIDTH = 16
# tree tokens one step may verify
MAX_NODES = 512
# result row: count, accept length, finish reason, the draft's mark, best path row; then the emitted tokens
# [WIDTH], the accepted nodes [WIDTH], the tree's tokens [L] and, for a new tree every step, its parents [L]
META = 5


class FusedState:
    """The device buffers every program of one StaticKV reads and writes (one run at a time)."""

    def __init__(self, kv, *, vocab: int):
        dev, self.vocab = kv.device, vocab
        # the next step's tree tokens (root first)
        self.tokens = torch.zeros(MAX_NODES, dtype=torch.long, device=dev)
        # prompt + committed tokens
        self.history = torch.zeros(kv.max_len + WIDTH, dtype=torch.long, device=dev)
        z = lambda dtype=torch.long: torch.zeros((), dtype=dtype, device=dev)  # noqa: E731
        self.seq_len, self.produced, self.budget, self.context, self.mark, self.seed = z(), z(), z(), z(), z(), z()
        self.temperature, self.top_p, self.epsilon, self.delta = (
            z(torch.float32),
            z(torch.float32),
            z(torch.float32),
            z(torch.float32),
        )
        self.eos = torch.full((8,), -1, dtype=torch.long, device=dev)
        # the nodes of the next tree that may be accepted (a draft may leave some dead: StaticDraft.dead)
        self.live = torch.ones(MAX_NODES, dtype=torch.bool, device=dev)
        self.result = torch.zeros(META + 2 * WIDTH + 2 * MAX_NODES, dtype=torch.long, device=dev)
        # the one read per step lands here
        self.host = torch.zeros_like(self.result, device="cpu", pin_memory=dev.type == "cuda")

    def start(self, ids: torch.Tensor, *, root: torch.Tensor, config, eos: tuple[int, ...], context: int) -> None:
        """A new run: prompt ``ids`` [n] and its first token ``root`` committed; the settings as device scalars."""
        n = ids.numel()
        self.history[:n] = ids
        self.history[n : n + 1] = root.view(1)
        self.tokens[:1] = root.view(1)
        self.seq_len.fill_(n + 1)
        self.produced.fill_(1)
        self.budget.fill_(config.max_new_tokens)
        self.context.fill_(context)
        self.mark.zero_()
        self.seed.fill_(config.seed)
        self.temperature.fill_(max(config.temperature, 1e-6))
        self.top_p.fill_(config.top_p)
        self.epsilon.fill_(config.posterior_threshold)
        self.delta.fill_(config.posterior_alpha)
        self.eos.fill_(-1)
        if config.stop_on_eos and eos:
            self.eos[: min(len(eos), 8)] = torch.tensor(eos[:8], dtype=torch.long)

    def read(self, length: int) -> list[int]:
        """The step's result row (its first ``length`` entries): the one device-to-host copy of a step."""
        if self.result.device.type == "cuda":
            self.host[:length].copy_(self.result[:length], non_blocking=True)
            torch.cuda.current_stream(self.result.device).synchronize()
            return self.host[:length].tolist()
        return self.result[:length].tolist()


class Program:
    """One step of one tree shape under one ``Rule``, as a function of ``FusedState`` only.
    ``drafter`` (a ``draft.StaticDraft``; None: a root-only step, nothing drafted) fills the next
    tree from the last accepted node's hidden state, the root and the history, and leaves a mark that
    the step carries back to the host for the record (``StaticDraft.credit``). The tree is ``bufs``,
    the same every step, or one the draft writes every step as parents (a ``draft.NewTree``, bufs
    None: an EAGLE head's dynamic tree), of a fixed size and depth."""

    def __init__(self, kv, state: FusedState, bufs: TreeBuffers | None, *, rule: Rule, drafter=None):
        self.kv, self.s, self.bufs, self.rule = kv, state, bufs, rule
        # a draft with a state of its own gets one for this program (never shared with another)
        if drafter is not None and drafter.state is not None:
            drafter = drafter.state.fresh(kv.max_len)
        self.draft = drafter.draft if drafter is not None else None
        # what the step's record adds, from the mark
        self.credit = drafter.credit if drafter is not None else None
        self.dead = drafter is not None and drafter.dead
        # a draft with a state of its own, told the accepted path and the prompt
        state = drafter.state if drafter is not None else None
        self.verified = state.verified if state is not None else None
        self.opening = state.start if state is not None else None
        # a new tree every step: its parents, and how the records read them
        self.new_tree = drafter.tree if drafter is not None and drafter.buffers is None else None
        self.parents = self.new_tree.parents if self.new_tree is not None else None
        dev = kv.device
        if self.parents is not None:
            self.depth, self.num_nodes = self.new_tree.depth, self.parents.numel()
        else:
            # cached properties (a lock inside) read now, never inside a captured or compiled step
            self.depth, self.num_nodes, self.paths, self.valid = bufs.depth, bufs.num_nodes, bufs.paths, bufs.valid
            self.children = bufs.children if rule.name == "sample" else None
        if self.num_nodes > MAX_NODES or self.depth + 1 > WIDTH:
            raise ValueError(
                f"A fused step holds at most {MAX_NODES} nodes and depth {WIDTH - 1} "
                f"(got {self.num_nodes}, {self.depth})."
            )
        self.j = torch.arange(self.depth + 1, device=dev)
        # a CUDA graph of ``step`` (``capture``)
        self.graph = None
        # what replays it (tests: a stand-in)
        self.cuda = torch.cuda
        # or ``step`` compiled (capture "compile" on a CPU)
        self.compiled = None
        # why a compile failed: not tried again (it can take minutes)
        self.failed: Exception | None = None
        # on CUDA, the sentence saying a failed compile fell back to eager kernels
        self.note: str | None = None

    # ------------------------------------------------------------------ the step
    def step(self) -> None:
        """One whole decode step on the device; writes ``state.result`` and the next tree's tokens."""
        s, kv, L = self.s, self.kv, self.num_nodes
        seq_len = s.seq_len.view(1)
        prefix = seq_len - 1
        toks = s.tokens[:L]
        bias, position_ids, paths, valid, children = self.tree()
        # verify: the stock forward of the tree after the prefix, mask and positions built on the device
        kv.set_lengths(s.seq_len - 1)
        h = kv.body(
            input_ids=toks[None],
            attention_mask=kv.tree_mask(bias, prefix),
            position_ids=(position_ids + prefix)[None],
            past_key_values=kv.cache,
            use_cache=True,
        ).last_hidden_state[0]
        logits = kv.lm_head(h)  # [L, V]
        # accept: the rule, and the bonus token; nodes the draft left dead are never accepted
        if self.dead:
            live = s.live[:L]
            valid = valid & live[paths]
            if children is not None:
                children = torch.where(live[children.clamp(min=0)], children, -1)
        knobs = Knobs(s.temperature, s.top_p, s.seed, s.epsilon, s.delta)
        n, nodes, best, bonus = accept(self.rule, logits, toks, paths, valid, children, knobs=knobs, seq_len=seq_len)
        last = nodes.gather(0, n)
        # cut at the budget, the context and EOS
        accepted = toks.gather(0, torch.cat([nodes[1:], nodes[:1]]))
        emitted = torch.where(self.j < n, accepted, torch.where(self.j == n, bonus, -1))
        count, reason = cut(emitted, n, budget=s.budget - s.produced, context=s.context - s.seq_len, eos=s.eos)
        # report, before the next draft overwrites the tree tokens
        r, D = s.result, self.depth
        r[:META].copy_(torch.cat([count, n, reason, s.mark.view(1), best]))
        r[META : META + D + 1].copy_(emitted)
        r[META + WIDTH : META + WIDTH + D + 1].copy_(nodes)
        r[META + 2 * WIDTH : META + 2 * WIDTH + L].copy_(toks)
        if self.parents is not None:
            r[META + 2 * WIDTH + L : META + 2 * WIDTH + 2 * L].copy_(self.parents)
        # commit: K/V of root + accepted behind the prefix, tokens into the history, the counters
        kv.compact(prefix, nodes)
        kept = torch.where(self.j < count, emitted, s.history.gather(0, seq_len + self.j))
        s.history.index_copy_(0, seq_len + self.j, kept)
        s.seq_len.add_(count[0])
        s.produced.add_(count[0])
        # a draft with a state of its own reads the accepted path first: (f, the token after it) per node
        if self.verified is not None:
            self.verified(h.index_select(0, nodes), emitted, prefix, n)
        # draft: the next tree from the last accepted node's hidden state
        self.write_draft(h.index_select(0, last)[0], bonus)

    def tree(self) -> tuple:
        """The tree this step verifies: (bias [L, L], position ids [L], paths [P, D+1] with padding
        clamped to 0, valid [P, D+1], children [L, W] or None when the rule does not walk). A new tree
        every step is built here from its parents (``tree.parents.ancestry``: one path per node)."""
        if self.parents is None:
            return self.bufs.bias, self.bufs.tree.position_ids, self.paths, self.valid, self.children
        kv = self.kv
        seen, position_ids, retrieve = ancestry(self.parents, self.depth)
        bias = additive_mask(seen, kv.dtype, kv.device)
        children = children_of(self.parents) if self.rule.name == "sample" else None
        return bias, position_ids.to(kv.device), retrieve.clamp(min=0), retrieve >= 0, children

    def open(self, features: torch.Tensor, ids: torch.Tensor, root: torch.Tensor) -> None:
        """A run's first draft after its prefill: a draft with a state of its own reads the prompt
        (``features`` [n, d] of the prompt ``ids`` [n], each beside the token after it), then the tree
        under ``root`` [1] is drafted."""
        if self.opening is not None:
            self.opening(features, torch.cat([ids[1:], root.view(1).to(ids.device)]))
        self.write_draft(features[-1], root.view(1))

    def record_tree(self, row: list[int]):
        """The tree a step verified, on the CPU (for the records), from its result ``row``."""
        if self.parents is None:
            return self.bufs.cpu
        at, L = META + 2 * WIDTH + self.num_nodes, self.num_nodes
        return self.new_tree.describe(tuple(row[at : at + L]))

    def write_draft(self, hidden: torch.Tensor, root: torch.Tensor) -> None:
        """The next step's tree tokens, in place: the drafter's tree from ``hidden`` [d] under
        ``root`` [1] (the root alone without a draft)."""
        s, L = self.s, self.num_nodes
        if self.draft is None:
            s.tokens[:1].copy_(root)
            return
        tokens, mark, live = self.draft(hidden, root, s.history, s.seq_len.view(1))
        s.tokens[:L].copy_(tokens)
        s.mark.copy_(mark[0])
        if live is not None:
            s.live[:L].copy_(live)

    # ------------------------------------------------------------------ capture
    def capture(self, *, graphs=None) -> float:
        """Make the program fast: under capture "compile" compile ``step`` with Inductor (without its
        own CUDA graphs, ``kv.COMPILE_MODE``) and warm it up, then on CUDA record it, compiled or
        eager ("cuda-graph"), as one CUDA graph (kv.StaticKV.record). All of it runs over a valid
        stand-in state; the state's buffers and lengths are saved first and restored after (the
        stand-in also writes K/V slots past the prefix, which is harmless only because a capture
        happens before a run's prefill, ``Decoder.steps``). A recorded graph is replayed once and
        must leave the state exactly as the function it recorded does when called. On CUDA a compile,
        or a recording of the compiled step, that fails leaves ``note`` (one sentence) and records the
        eager step instead. Returns the seconds it took; raises when anything else fails, and then the
        program stays eager."""
        if self.failed is not None and self.note is None:
            raise self.failed
        t0 = time.perf_counter()
        s, kv = self.s, self.kv
        saved = self._snapshot()
        to_graph = graphs is not None or kv.device.type == "cuda"

        # two committed tokens, room for a whole step
        def stand_in():
            self._restore(saved)
            s.seq_len.fill_(2)
            s.produced.fill_(1)
            s.budget.fill_(kv.max_len)
            s.context.fill_(kv.max_len)
            s.tokens.zero_()

        try:
            fn, eager = self.step, True
            if kv.capture == "compile" and self.failed is None:
                try:
                    fn, eager = self._compile(stand_in), False
                except Exception as e:
                    # compiling again would fail again, after as long
                    self.failed = e
                    if not to_graph:
                        raise
                    self.note = (
                        f"torch.compile failed on a {self.num_nodes}-token step ({cause(e, 120)}), "
                        "so that step replays its eager kernels in one CUDA graph."
                    )
                    fn, eager = self.step, True
            if not to_graph:
                self.compiled = fn
                return time.perf_counter() - t0
            try:
                self.graph = self._record(fn, stand_in, graphs)
            except Exception as e:
                if eager:
                    # nothing replays: no fallback to count
                    self.note = None
                    raise
                self.failed = e
                self.note = (
                    f"Recording the compiled {self.num_nodes}-token step failed ({cause(e, 120)}), "
                    "so that step replays its eager kernels in one CUDA graph."
                )
                self.graph = self._record(self.step, stand_in, graphs)
        finally:
            self._restore(saved)
        return time.perf_counter() - t0

    def _record(self, fn, stand_in, graphs) -> object:
        """``fn`` recorded as one CUDA graph over the stand-in state, replayed once and checked against a
        call of ``fn``; raises when the capture fails or the replay leaves another state."""
        stand_in()
        graph, _ = self.kv.record(fn, runs=2, reset=stand_in, graphs=graphs)
        self.cuda = graphs or torch.cuda
        stand_in()
        graph.replay()
        replayed = self._snapshot()
        stand_in()
        fn()
        called = self._snapshot()
        differ = [k for k in called if not torch.equal(replayed[k], called[k])]
        if differ:
            raise RuntimeError(f"the replayed graph's {differ[0]} differs from the step's")
        return graph

    def _compile(self, stand_in) -> object:
        """``step`` compiled by Inductor, one graph with no break and no dynamic shape, called twice
        (the compile and any tuning happen here, never inside a CUDA-graph capture)."""
        # one per program
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        fn = torch.compile(self.step, mode=COMPILE_MODE, fullgraph=True, dynamic=False)
        for _ in range(2):
            stand_in()
            fn()
        return fn

    def _snapshot(self) -> dict:
        """What a step leaves: the state's buffers (result, next tokens, history, counters) and the lengths."""
        saved = {k: v.clone() for k, v in vars(self.s).items() if isinstance(v, torch.Tensor) and k != "host"}
        saved["lengths"] = self.kv.lens.clone()
        if self.parents is not None:
            saved["parents"] = self.parents.clone()
        return saved

    def _restore(self, saved: dict) -> None:
        """Put a ``_snapshot`` back."""
        own = {"lengths": self.kv.lens, "parents": self.parents}
        for k, v in saved.items():
            (own[k] if k in own else getattr(self.s, k)).copy_(v)

    @property
    def captured(self) -> bool:
        return self.graph is not None or self.compiled is not None

    def run(self) -> None:
        if self.graph is not None:
            # on cuda:N's current stream, which the read then waits for
            with self.cuda.device(self.kv.device):
                self.graph.replay()
        elif self.compiled is not None:
            self.compiled()
        else:
            self.step()
