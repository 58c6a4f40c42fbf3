"""The whole decode step as one fixed-shape device program: the static engine's step.

A run on a ``StaticKV`` (kv.py) decodes with ``Program``s: one per tree shape and acceptance rule
(the plain step is the root-only tree). ``Program.step`` does everything a step does, on the
device, from and into buffers of fixed shape and address (``FusedState``):

  verify    the stock forward of the L tree tokens after ``seq_len - 1`` cached ones; the mask and
            position ids are built on the device from the length (no host value)
  accept    greedy (argmax along every path, cumulative product, longest path), typical, or exact
            sampling (the tree walk, unrolled to the tree's depth, with noise keyed by seed and
            position: ``acceptance.race_noise``); the bonus token
  cut       budget, context and EOS, exactly as ``Decoder._finish``
  commit    the accepted nodes' K/V moved behind the prefix (always depth + 1 slots: one gather and
            one copy for every layer, ``StaticKV.compact``), the history, lengths and counters
  draft     the heads' draft of the next tree from the last accepted node's hidden state, plus the
            lookup branch matched on the device in the history (fixed length, guesses past the
            match), written in place into the next step's token buffer
  report    one small result row: counts, finish reason, emitted tokens, accepted nodes, the
            verified tree tokens

So a step reads nothing back inside it and is capturable whole: on CUDA a ``Program`` is one CUDA
graph (``StaticKV.record``), and the host loop (``fused_steps``) replays it and makes one small
device-to-host copy per step. On a CPU it runs eagerly (the same code; the tests hold its tokens
equal to ``model.generate`` and to plain sampling, and count its host reads).
"""

from __future__ import annotations

import time
from types import MappingProxyType
from typing import Callable, Iterator

import torch

from .acceptance import (
    greedy_accept,
    greedy_tokens,
    race_noise,
    sample_token,
    tempered_probs,
    typical_threshold_of_entropy,
)
from .lookup import MAX_NGRAM, MIN_NGRAM
from .steps import Step, _sync
from .tree import TreeBuffers

WIDTH = 16  # longest accepted path + bonus a step may report (depth + 1, lookup branch included)
MAX_NODES = 512  # tree tokens one step may verify
META = 5  # result row: count, accept length, finish reason, lookup match, best path row
REASONS = (None, "eos", "length", "context")


class FusedState:
    """The device buffers every program of one StaticKV reads and writes (one run at a time)."""

    def __init__(self, kv, *, vocab: int):
        dev, self.vocab = kv.device, vocab
        self.tokens = torch.zeros(MAX_NODES, dtype=torch.long, device=dev)  # the next step's tree tokens (root first)
        self.history = torch.zeros(kv.max_len + WIDTH, dtype=torch.long, device=dev)  # prompt + committed tokens
        z = lambda dtype=torch.long: torch.zeros((), dtype=dtype, device=dev)  # noqa: E731
        self.seq_len, self.produced, self.budget, self.context, self.matched, self.seed = z(), z(), z(), z(), z(), z()
        self.temperature, self.top_p, self.epsilon, self.delta = (
            z(torch.float32),
            z(torch.float32),
            z(torch.float32),
            z(torch.float32),
        )
        self.eos = torch.full((8,), -1, dtype=torch.long, device=dev)
        self.result = torch.zeros(META + 2 * WIDTH + MAX_NODES, dtype=torch.long, device=dev)
        self.host = torch.zeros_like(
            self.result, device="cpu", pin_memory=dev.type == "cuda"
        )  # the one read per step lands here

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
        self.matched.zero_()
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
    """One step of one tree shape under one rule ("greedy", "typical" or "sample"), as a function
    of ``FusedState`` only. ``draft(hidden [d], root [1]) -> [L]`` fills the next tree (None: a
    root-only step, nothing drafted); ``lookup`` trailing nodes are the lookup branch, with
    ``top1`` the heads' top-1 chain nodes that fill it past the match."""

    def __init__(
        self,
        kv,
        state: FusedState,
        bufs: TreeBuffers,
        *,
        rule: str,
        nucleus: bool = False,
        sample_root: bool = False,
        draft: Callable | None = None,
        lookup: int = 0,
        top1: tuple[int, ...] = (),
    ):
        if bufs.num_nodes > MAX_NODES or bufs.depth + 1 > WIDTH:
            raise ValueError(
                f"A fused step holds at most {MAX_NODES} nodes and depth {WIDTH - 1} (got {bufs.num_nodes}, {bufs.depth})."
            )
        self.kv, self.s, self.bufs, self.rule, self.nucleus, self.sample_root = (
            kv,
            state,
            bufs,
            rule,
            nucleus,
            sample_root,
        )
        self.draft, self.lookup, self.top1 = draft, lookup, top1
        dev, L = kv.device, bufs.num_nodes
        ri = bufs.out.retrieve_indices
        self.valid, self.ri = ri >= 0, ri.clamp(min=0)
        self.depth = ri.shape[1] - 1
        kids = bufs.cpu.children
        width = max(1, max(map(len, kids)))
        self.children = torch.tensor([list(k) + [-1] * (width - len(k)) for k in kids], dtype=torch.long, device=dev)
        self.j = torch.arange(self.depth + 1, device=dev)
        self.cols = torch.arange(L, device=dev)
        if lookup:
            t = len(top1)
            self.guess = torch.tensor([top1[i] if i < t else 0 for i in range(lookup)], dtype=torch.long, device=dev)
            self.lj = torch.arange(lookup, device=dev)
        self.graph = None  # a CUDA graph of ``step`` (``capture``)
        self.cuda = torch.cuda  # what replays it (tests: a stand-in)
        self.compiled = None  # or ``step`` compiled (capture "compile")
        self.failed: Exception | None = (
            None  # why a compile failed: not tried again (it can take minutes; a graph capture is retried)
        )

    # ------------------------------------------------------------------ pieces
    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax(logits / T) [.., V], restricted to the top-p nucleus when the program has one."""
        probs = tempered_probs(logits, self.s.temperature)
        if self.nucleus:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < self.s.top_p
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def _draw(self, probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """[1] the exponential race's winner at ``position`` [1] (sample_token's rule)."""
        return (probs / race_noise(self.s.seed, position, probs.shape[-1])).argmax(-1)

    def _walk(self, logits: torch.Tensor, toks: torch.Tensor, pos0: torch.Tensor):
        """Exact sampling's tree walk (acceptance.sample_walk), unrolled to the tree's depth: the draw
        at depth d is the token at ``pos0 + d``; draws after the walk ended change nothing. Only the
        walked rows are tempered (and sorted, with top-p): depth + 1 of the L."""
        node = torch.zeros(1, dtype=torch.long, device=logits.device)
        alive = torch.ones(1, dtype=torch.bool, device=logits.device)
        nodes, n, bonus = [node], torch.zeros(1, dtype=torch.long, device=logits.device), node
        for d in range(self.depth + 1):
            y = self._draw(self._probs(logits.index_select(0, node)), pos0 + d)
            kids = self.children.index_select(0, node)[0]
            match = (toks.gather(0, kids.clamp(min=0)) == y) & (kids >= 0)
            has = match.any().view(1)
            child = kids.gather(0, match.long().argmax().view(1))
            bonus = torch.where(alive & ~has, y, bonus)
            alive = alive & has
            node = torch.where(alive, child, node)
            n = n + alive.long()
            nodes.append(torch.where(alive, child, torch.zeros_like(child)))
        return n, torch.cat(nodes[: self.depth + 1]), bonus

    def _chain(
        self, drafted: torch.Tensor, root: torch.Tensor, seq_len: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The lookup branch [lookup] from the history on the device (lookup.ngram_proposal's match:
        the latest earlier occurrence of the longest suffix n-gram, MIN_NGRAM <= n <= MAX_NGRAM),
        padded as Decoder's static steps pad it: the heads' top-1 guess per depth past the match,
        then the last token again. Returns (branch, matched)."""
        hist, c = self.s.history, self.lookup
        start = torch.full((1,), -1, dtype=torch.long, device=hist.device)
        for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            suffix = hist.gather(0, (seq_len - n + torch.arange(n, device=hist.device)).clamp(min=0))
            windows = hist.unfold(0, n, 1)  # [H - n + 1, n]
            s = torch.arange(windows.shape[0], device=hist.device)
            hit = (windows == suffix).all(-1) & (s <= seq_len - 1 - n)
            last = torch.where(hit, s, -1).max().view(1)
            start = torch.where((start < 0) & (last >= 0), last + n, start)
        found = start >= 0
        matched = torch.where(found, (seq_len - start).clamp(0, c), 0)
        chain = hist.gather(0, (start.clamp(min=0) + self.lj).clamp(max=hist.numel() - 1))
        t = len(self.top1)
        guess = drafted.gather(0, self.guess)
        before = torch.where(self.lj < matched, chain, guess)  # the match, then the top-1 guesses
        length = torch.clamp(torch.maximum(matched, torch.full_like(matched, t)), max=c)
        pad = torch.where(length > 0, before.gather(0, (length - 1).clamp(min=0)), root.view(1))
        return torch.where(self.lj < length, before, pad), matched

    # ------------------------------------------------------------------ the step
    def step(self) -> None:
        """One whole decode step on the device (see the module docstring); writes ``state.result``."""
        s, kv, L, D = self.s, self.kv, self.bufs.num_nodes, self.depth
        seq_len = s.seq_len.view(1)
        prefix = seq_len - 1
        toks = s.tokens[:L]
        kv.set_lengths(s.seq_len - 1)
        h = kv.body(
            input_ids=toks[None],
            attention_mask=kv.tree_mask(self.bufs.bias, prefix),
            position_ids=(self.bufs.tree.position_ids + prefix)[None],
            past_key_values=kv.cache,
            use_cache=True,
        ).last_hidden_state[0]
        logits = kv.lm_head(h)  # [L, V]
        if self.rule == "sample":
            n, nodes, bonus = self._walk(logits, toks, seq_len)
            best = (
                ((self.ri == nodes[None]) | (self.j[None] > n)).all(dim=1).long().argmax().view(1)
            )  # the first row that starts with the path
            last = nodes.gather(0, n)
        else:
            path_tokens = toks[self.ri]
            argmax = None  # the greedy rule's argmax after every node, reused for the bonus
            if self.rule == "typical":
                probs = tempered_probs(logits, s.temperature)
                threshold = typical_threshold_of_entropy(
                    torch.special.entr(probs).sum(-1), epsilon=s.epsilon, delta=s.delta
                )
                parent = self.ri[:, :-1]
                p_cand = probs[parent, path_tokens[:, 1:]]
                prefix_ok = ((p_cand > threshold[parent]) & self.valid[:, 1:]).long().cumprod(dim=1)
                accept = prefix_ok.sum(dim=1)
                score = accept.float() * 1e6 + (torch.log(p_cand.clamp_min(1e-30)) * prefix_ok).sum(dim=1)
            else:
                argmax = greedy_tokens(logits)
                accept, score = greedy_accept(logits, path_tokens, self.ri, self.valid, argmax=argmax)
            best = score.argmax().view(1)  # first best path on ties
            n = accept.gather(0, best)
            nodes = self.ri.index_select(0, best)[0]  # [D + 1], padding clamped to 0
            last = nodes.gather(0, n)
            if self.sample_root:
                bonus = self._draw(self._probs(logits.index_select(0, last)), seq_len + n)
            else:
                bonus = argmax.gather(0, last) if argmax is not None else greedy_tokens(logits.index_select(0, last))
        # cut at the budget, the context and EOS (Decoder._finish)
        emitted = torch.where(
            self.j < n, toks.gather(0, torch.cat([nodes[1:], nodes[:1]])), torch.where(self.j == n, bonus, -1)
        )
        budget, context = s.budget - s.produced, s.context - s.seq_len
        room = torch.minimum(budget, context)
        count = torch.minimum(n + 1, room.view(1))
        is_eos = (emitted[:, None] == s.eos[None]).any(-1) & (self.j < count)
        has_eos = is_eos.any().view(1)
        first = torch.where(is_eos, self.j, D + 1).min().view(1)
        reason = torch.where(has_eos, 1, torch.where(n + 1 >= room, torch.where(budget <= context, 2, 3), 0))
        count = torch.where(has_eos, first + 1, count)
        # report, before the next draft overwrites the tree tokens
        r = s.result
        r[:META].copy_(torch.cat([count, n, reason, s.matched.view(1), best]))
        r[META : META + D + 1].copy_(emitted)
        r[META + WIDTH : META + WIDTH + D + 1].copy_(nodes)
        r[META + 2 * WIDTH : META + 2 * WIDTH + L].copy_(toks)
        # commit: K/V of root + accepted behind the prefix, tokens into the history, the counters
        kv.compact(prefix, nodes)
        s.history.index_copy_(
            0, seq_len + self.j, torch.where(self.j < count, emitted, s.history.gather(0, seq_len + self.j))
        )
        s.seq_len.add_(count[0])
        s.produced.add_(count[0])
        self.write_draft(h.index_select(0, last)[0], bonus)

    def write_draft(self, hidden: torch.Tensor, root: torch.Tensor) -> None:
        """The next step's tree tokens, in place: the heads' draft from ``hidden`` [d] under
        ``root`` [1], then the lookup branch matched in the history (root alone without a draft)."""
        s, L = self.s, self.bufs.num_nodes
        if self.draft is None:
            s.tokens[:1].copy_(root)
            return
        drafted = self.draft(hidden, root)
        if self.lookup:
            chain, matched = self._chain(drafted, root, s.seq_len.view(1))
            s.tokens[: L - self.lookup].copy_(drafted)
            s.tokens[L - self.lookup : L].copy_(chain)
            s.matched.copy_(matched[0])
        else:
            s.tokens[:L].copy_(drafted)

    # ------------------------------------------------------------------ capture
    def capture(self, *, graphs=None) -> float:
        """Record ``step`` as one CUDA graph (kv.StaticKV.record) or compile it (capture "compile"),
        over a valid stand-in state; the state's buffers and lengths are saved first and restored
        after (the stand-in also writes K/V slots past the prefix, which is harmless only because a
        capture happens before a run's prefill, ``Decoder.steps``). A recorded graph is replayed once
        and must leave the state exactly as the eager step does. Returns the seconds it took; raises when anything fails, and then the
        program stays eager (``graph`` None)."""
        if self.failed is not None:
            raise self.failed
        t0 = time.perf_counter()
        s, kv = self.s, self.kv
        saved = self._snapshot()

        def stand_in():  # two committed tokens, room for a whole step
            self._restore(saved)
            s.seq_len.fill_(2)
            s.produced.fill_(1)
            s.budget.fill_(kv.max_len)
            s.context.fill_(kv.max_len)
            s.tokens.zero_()

        try:
            if kv.capture == "compile":
                for t in [
                    *(v for v in (*vars(s).values(), *vars(self).values()) if isinstance(v, torch.Tensor)),
                    kv.lens,
                    kv.store,
                ]:
                    if (
                        t is not None
                    ):  # fixed addresses: CUDA graphs under reduce-overhead mutate them in place, with no copies
                        torch._dynamo.mark_static_address(t)
                torch._dynamo.config.recompile_limit = max(
                    torch._dynamo.config.recompile_limit, 64
                )  # one compiled step per program
                fn = torch.compile(
                    self.step,
                    mode="reduce-overhead" if kv.device.type == "cuda" else "default",
                    fullgraph=True,
                    dynamic=False,
                )
                for _ in range(2):
                    stand_in()
                    fn()
                self.compiled = fn
            else:
                stand_in()
                graph, _ = kv.record(self.step, runs=2, reset=stand_in, graphs=graphs)
                self.cuda = graphs or torch.cuda
                stand_in()
                graph.replay()
                replayed = self._snapshot()
                stand_in()
                self.step()
                eager = self._snapshot()
                differ = [k for k in eager if not torch.equal(replayed[k], eager[k])]
                if differ:
                    raise RuntimeError(f"the replayed graph's {differ[0]} differs from the eager step's")
                self.graph = graph
        except Exception as e:
            if kv.capture == "compile":
                self.failed = e
            raise
        finally:
            self._restore(saved)
        return time.perf_counter() - t0

    def _snapshot(self) -> dict:
        """What a step leaves: the state's buffers (result, next tokens, history, counters) and the lengths."""
        return {k: v.clone() for k, v in vars(self.s).items() if isinstance(v, torch.Tensor) and k != "host"} | {
            "lengths": self.kv.lens.clone()
        }

    def _restore(self, saved: dict) -> None:
        """Put a ``_snapshot`` back."""
        for k, v in saved.items():
            (self.kv.lens if k == "lengths" else getattr(self.s, k)).copy_(v)

    @property
    def captured(self) -> bool:
        return self.graph is not None or self.compiled is not None

    def run(self) -> None:
        if self.graph is not None:
            with self.cuda.device(self.kv.device):  # on cuda:N's current stream, which the read then waits for
                self.graph.replay()
        elif self.compiled is not None:
            self.compiled()
        else:
            self.step()


def rule_of(decoder) -> tuple[str, bool, bool]:
    """(rule, nucleus, sample_root) of a decoder's steps."""
    cfg, method = decoder.config, decoder.method
    sampled = cfg.temperature > 0
    if sampled and method in ("plain", "medusa-sample"):
        return "sample", cfg.top_p < 1, False
    if sampled and method == "medusa-typical":
        return "typical", cfg.sample_root and cfg.top_p < 1, cfg.sample_root
    return "greedy", False, False


def programs(decoder, kv) -> tuple[Program | None, Program]:
    """(the tree step, the root-only step) of ``decoder`` on ``kv``, built once per StaticKV and
    reused by every run that computes the same thing (same rule, tree, lookup length and heads)."""
    kv.bind()  # the one K/V store and length tensor the programs use
    if kv.state is None:
        kv.state = FusedState(kv, vocab=decoder.lm_head.weight.shape[0])
    rule, nucleus, sample_root = rule_of(decoder)

    def get(bufs: TreeBuffers, draft, lookup: int, heads: tuple) -> tuple[tuple, Program]:
        key = (rule, nucleus, sample_root, bufs.cpu.choices, lookup, heads)
        if key not in kv.programs:
            kv.programs[key] = Program(
                kv,
                kv.state,
                bufs,
                rule=rule,
                nucleus=nucleus,
                sample_root=sample_root,
                draft=draft,
                lookup=lookup,
                top1=tuple(decoder.top1_nodes),
            )
        kv.programs.move_to_end(key)  # most recently used last
        return key, kv.programs[key]

    root_key, root = get(decoder.root_tree, None, 0, ())
    tree_key, tree = None, None
    if decoder.method != "plain":
        d, c = decoder, decoder.config.lookup
        d.tree.out.levels  # a cached_property (a lock inside): computed now, never inside a captured or compiled step
        shared = d.heads.proposal_ids is not None and d.heads.config.shared_lm_head
        proj = (
            d.heads.proposal_projection(d.lm_head) if shared else None
        )  # built now; a graph reads its weight, so the key keeps it alive
        draft = lambda hidden, r: d.heads.draft(hidden, d.lm_head, d.tree.out, r, d.embed)  # noqa: E731
        tree_key, tree = get(d.lookup_trees[c] if c else d.tree, draft, c, (d.heads, proj))
    evict(kv, keep=(root_key, tree_key))
    return tree, root


MAX_PROGRAMS = (
    48  # whole-step programs one StaticKV keeps (the page's presets, modes and rules fit; each custom tree adds one)
)


def evict(kv, *, keep: tuple) -> None:
    """Forget the least recently used programs beyond MAX_PROGRAMS, never those of the run at hand:
    a program holds its decoder's heads, tree and buffers (and a graph executable; the graphs'
    scratch memory is one pool they share, kept while any of them lives), so a server whose users
    try many custom trees (or load new heads) does not grow without bound. An evicted program is
    built and captured again if a later run needs it."""
    for key in [k for k in kv.programs if k not in keep][: max(0, len(kv.programs) - MAX_PROGRAMS)]:
        del kv.programs[key]
    if not any(p.graph is not None for p in kv.programs.values()):
        kv.forget_pool()  # no graph left to share it with: the next capture starts a new pool


@torch.inference_mode()  # as the runs replay it: a capture outside inference mode would record other tensors
def ready(decoder, kv, *, graphs=None) -> None:
    """Capture (or compile) the decoder's programs on a capturing ``kv`` before its run starts;
    raises when a capture fails (the run then takes the dynamic cache, ``Decoder.steps``)."""
    if kv.capture == "none":
        return
    for prog in programs(decoder, kv):
        if prog is not None and not prog.captured:
            kv.capture_seconds += prog.capture(graphs=graphs)


def fused_steps(decoder, ids: torch.Tensor, kv) -> Iterator[Step]:
    """A run on the static engine: an eager prefill, then per step one program run (one graph
    replay on CUDA) and one read of its result row. Yields the same Step records as the dynamic
    path (the phases of a step are not separated: {"step": seconds})."""
    d, cfg, dev = decoder, decoder.config, decoder.device
    tree, root_prog = programs(d, kv)
    state, limit, detail = kv.state, d.info.context_limit, cfg.record_detail
    n = ids.shape[1]
    t0 = _sync(dev)
    kv.start()
    hidden = d.body(
        input_ids=ids, position_ids=torch.arange(n, device=dev)[None], past_key_values=kv.cache, use_cache=True
    ).last_hidden_state[0, -1]
    logits = d.lm_head(hidden)
    rule, nucleus, sample_root = rule_of(d)
    drawn = rule == "sample" or sample_root
    root = (
        sample_token(logits, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed, position=n)
        if drawn
        else greedy_tokens(logits)
    )
    new, reason = d._finish([int(root)], 0, n)
    state.start(ids[0], root=root, config=cfg, eos=tuple(d.info.eos_token_ids or ()), context=limit)
    if tree is not None and reason is None:
        tree.write_draft(hidden, root.view(1))
    captured = kv.capture != "none" and all(p.captured for p in (tree, root_prog) if p is not None)
    yield d._prefill_step(new, reason, t0, kv, engine=f"static, {kv.capture}" if captured else "static")
    seq_len, index = n + len(new), 1
    reach = max(d.tree.depth, cfg.lookup) if tree is not None else 0
    while reason is None:
        prog = (
            tree if tree is not None and seq_len + reach + 1 <= limit else root_prog
        )  # near the context limit: root-only steps
        L = prog.bufs.num_nodes
        t0 = time.perf_counter()
        prog.run()
        row = state.read(META + 2 * WIDTH + (L if detail else 0))
        seconds = time.perf_counter() - t0
        count, accepted, code, matched, best = row[:META]
        new, reason = tuple(row[META : META + count]), REASONS[code]
        nodes = row[META + WIDTH : META + WIDTH + accepted + 1]
        start = L - prog.lookup
        yield Step(
            index,
            new,
            seconds,
            MappingProxyType({"step": seconds}),
            accept_length=min(accepted, len(new) - 1),
            lookup_accepted=min(sum(start <= x < start + matched for x in nodes[1:]), len(new) - 1)
            if prog.lookup
            else 0,
            tree=prog.bufs.cpu if detail and prog is tree else None,
            tree_tokens=torch.tensor(row[META + 2 * WIDTH : META + 2 * WIDTH + L]) if detail and prog is tree else None,
            best_path=best if detail and prog is tree else None,
            finish_reason=reason,
            drafter=d.drafter,
        )
        seq_len, index = seq_len + len(new), index + 1
