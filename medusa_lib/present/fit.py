"""The start-up measurement of a Playground: time whole decode steps of every candidate setup on this machine
and keep the fastest by prediction (``core/machine_fit.py`` holds the arithmetic and the cache).

A candidate's step is timed as a run takes it, through ``Playground.prepare``: the drafter drafts, the
model verifies the tree (its lookup branch too) and the step accepts, on the engine runs use. Each candidate's
run starts from one prompt's prefill; neither the prefill nor the first decode step is timed (``Stepper``).
Rounds go over the candidates in turn (plain among them), so a drift of a shared machine moves them alike. The
first round goes from the smallest step up and skips a size that cannot win: its best gain over the cost of a
smaller size (the second largest measured, so one noisy step cannot skip it) is under the best prediction so
far (on a CPU the 64-node trees never run). Later rounds time again only the candidates within ``NEAR`` of the
best.
"""

from __future__ import annotations

import json
import statistics
import time
from contextlib import closing
from dataclasses import replace
from datetime import date
from typing import Callable, Iterable

from ..core.compose import make_decoder
from ..core.decoding import Decoder
from ..core.drafters import EagleDrafter
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.machine_fit import (
    Candidate,
    Fit,
    MachineKey,
    Timed,
    eagle_candidates,
    medusa_candidates,
)
from ..core.model import input_device

# a prompt that runs long in every model; with the chat template about 120 tokens of context, as the page's
# examples and the bench's prompts have, so attention's share of a step is a real one
FIT_PROMPT = (
    "I keep a small vegetable garden behind my house: tomatoes, beans, lettuce, carrots and a few herbs. This "
    "summer the tomato leaves turned yellow from the bottom up, the beans flowered but set few pods, and the "
    "lettuce bolted in June. The soil is heavy clay, I water every evening, and the beds get sun from about ten "
    "in the morning until late afternoon. Explain, step by step, what is most likely going wrong with each crop, "
    "and what I should change next year."
)
# decode steps timed per candidate and round
STEPS = 3
# rounds after the first, over the candidates near the best (each of twice as many steps)
MORE_ROUNDS = 2
# a candidate within this of the best prediction is timed again; one further off is not
NEAR = 0.06
# the first round stops timing new sizes after this many seconds, shared by the drafters (the rest are listed as
# skipped): a slow machine with many candidates still starts within seconds
FIRST_ROUND_SECONDS = 6.0
# the first round skips a candidate whose best case (its gain over the largest cost measured at or below its
# size) is this far under the best prediction so far: wide enough for one noisy step
SKIP_MARGIN = 0.12


def _eagle_tree(name: str) -> DynamicTreeConfig:
    """An EAGLE candidate's tree from its name, "top_k,depth,nodes" (as the sweeps and bench --eagle-tree write it)."""
    return DynamicTreeConfig(*map(int, name.split(",")))


def decoder_for(pg, numerics: str, candidate: Candidate | None) -> tuple[list[int], Decoder]:
    """The prompt's ids and a greedy decoder of ``candidate`` (None: plain decoding) in ``numerics``."""
    drafter = candidate.drafter if candidate is not None else pg.drafters.tree_drafter
    request = dict(
        max_new_tokens=min(128, pg.max_new_tokens_limit),
        temperature=0.0,
        numerics=numerics,
        drafter=drafter,
        lookup_branch=bool(candidate and candidate.lookup),
    )
    if candidate is not None and candidate.drafter == pg.drafters.tree_drafter:
        request["tree"] = candidate.name
    settings = pg.settings_of(request)
    ids, decoders = pg.prepare(FIT_PROMPT, settings)
    plain, tree = decoders["plain"], decoders["medusa-greedy"]
    if candidate is None:
        return ids, plain
    config = replace(tree.config, lookup=candidate.lookup)
    draft = tree.drafter
    if candidate.drafter == EagleDrafter.name:
        draft = EagleDrafter(draft.head, _eagle_tree(candidate.name))
    return ids, make_decoder(tree.model, method="medusa-greedy", config=config, drafter=draft, static_kv=tree.static_kv)


def typical(seconds: list[float]) -> float:
    """A step's time from several: the lower quartile. A shared machine only ever adds time to a step (another
    process, an interrupt), so the low end of the samples is the step's own cost; the minimum would be one lucky
    sample."""
    return statistics.quantiles(seconds, n=4)[0] if len(seconds) >= 4 else min(seconds)


def step_seconds(decoder: Decoder, ids: list[int], steps: int = STEPS) -> list[float]:
    """Seconds of decode steps 2 .. ``steps`` + 1 of a fresh run: not its prefill, nor its first step, which
    pays one-off costs of a new shape (kernels chosen, buffers built)."""
    out = []
    with closing(decoder.steps(ids)) as run:
        for step in run:
            if step.index > 1:
                out.append(step.seconds)
            if len(out) >= steps:
                break
    return out


class Stepper:
    """One candidate's run, stepped a few steps at a time. On the dynamic cache one run goes on from round to
    round (its prefill and first step paid once, never timed); on a static cache, which every run shares, each
    round is a fresh run (``step_seconds``)."""

    def __init__(self, decoder: Decoder, ids: list[int]):
        self.decoder, self.ids, self.live = decoder, ids, None

    def take(self, steps: int) -> list[float]:
        if self.decoder.config.cache == "static":
            return step_seconds(self.decoder, self.ids, steps)
        out = []
        while len(out) < steps:
            if self.live is None:
                self.live = self.decoder.steps(self.ids)
                # the prefill and the first step (``step_seconds``): not timed
                for _ in zip(range(2), self.live):
                    pass
            step = next(self.live, None)
            if step is None:
                # the answer ended: a fresh run
                self.live = None
                continue
            out.append(step.seconds)
        return out

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
            self.live = None


def measure(
    pg,
    numerics: str,
    key: MachineKey,
    candidates: Iterable[Candidate],
    *,
    steps: int = STEPS,
    more_rounds: int = MORE_ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> Fit:
    """Time plain decoding and ``candidates`` (``medusa_candidates``, ``eagle_candidates``) on ``pg`` in
    ``numerics``; the Fit of ``key``. Candidates of one drafter that verify as many tokens cost the same
    (their steps run the same shapes): one of them is timed for all. The first round times each drafter's
    candidates with its longest lookup branch (the one the calibrations chose); a tree near the best is then
    also timed with its other branch lengths (heads only)."""
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    candidates = list(candidates)
    # (drafter, tokens) -> the candidate timed for all of that size
    sizes: dict[tuple[str, int], Candidate] = {}
    for c in candidates:
        sizes.setdefault((c.drafter, c.tokens), c)
    runs: dict = {}
    times: dict = {g: [] for g in [None, *sizes]}

    def size(c: Candidate) -> tuple[str, int]:
        return (c.drafter, c.tokens)

    def cost(g) -> float:
        return typical(times[g]) / typical(times[None])

    def predicted(c: Candidate) -> float:
        return c.gain / cost(size(c))

    def timed(drafter: str) -> list[Candidate]:
        return [c for c in candidates if c.drafter == drafter and times[size(c)]]

    def best_so_far(drafter: str) -> float:
        return max((predicted(c) for c in timed(drafter)), default=0.0)

    def run(g, n: int = steps) -> None:
        if g not in runs:
            ids, decoder = decoder_for(pg, numerics, sizes.get(g))
            runs[g] = Stepper(decoder, ids)
        times[g].extend(runs[g].take(n))

    run(None)
    drafters = list(dict.fromkeys(c.drafter for c in candidates))
    # round 1: each drafter's candidates with its longest branch, smallest step first; one that cannot win is
    # skipped (its best gain over the cost of a smaller step is under the best so far: one noisy step excepted)
    for drafter in drafters:
        # each drafter its share of the first round's time
        late = time.perf_counter() + FIRST_ROUND_SECONDS / len(drafters)
        longest = max(c.lookup for c in candidates if c.drafter == drafter)
        mine = sorted({size(c) for c in candidates if c.drafter == drafter and c.lookup == longest}, key=lambda g: g[1])
        for g in mine:
            below = sorted(cost(m) for m in mine if times[m] and m[1] <= g[1])
            bound = below[-2] if len(below) > 1 else (below[-1] if below else 0.0)
            best_gain = max(c.gain for c in candidates if size(c) == g)
            if below and (best_gain / bound < best_so_far(drafter) * (1 - SKIP_MARGIN) or time.perf_counter() > late):
                continue
            run(g)
        say(f"Machine fit ({numerics}): {drafter}, {sum(bool(times[g]) for g in mine)} of {len(mine)} sizes timed")
    # later rounds: plain and the sizes near the best, in turn; a tree near the best with its other branch lengths
    for _ in range(more_rounds):
        near_trees = {
            (c.drafter, c.name)
            for c in candidates
            if times[size(c)] and predicted(c) >= best_so_far(c.drafter) * (1 - NEAR)
        }
        near = {size(c) for c in candidates if (c.drafter, c.name) in near_trees}
        # twice the steps: the choice is made among these
        for g in [None, *sorted(near)]:
            run(g, 2 * steps)
    for stepper in runs.values():
        stepper.close()
    rows = tuple(Timed(c, 1000 * typical(times[size(c)]), cost(size(c))) for c in candidates if times[size(c)])
    skipped = tuple(c.label for c in candidates if not times[size(c)])
    return Fit(
        key,
        1000 * typical(times[None]),
        rows,
        round(time.perf_counter() - t0, 2),
        date.today().isoformat(),
        skipped=skipped,
    )


def candidates_of(pg, numerics: str, *, medusa: bool = True, eagle_meta: dict | None = None) -> list[Candidate]:
    """What the fit times for ``pg`` in ``numerics``: the shipped trees with figures (``medusa``), the EAGLE budgets
    with counted tokens per step in ``eagle_meta`` (the head's config.json, where one is loaded for these
    numerics)."""
    from ..core.defaults import calibration_records

    out = []
    if medusa and pg.drafters.tree_drafter in pg.drafters.available:
        out += medusa_candidates(calibration_records(pg.heads), pg.tree_names(), numerics)
    if eagle_meta:
        out += eagle_candidates(eagle_meta, numerics)
    return out


# ---------------------------------------------------------------------- a Playground's start-up choice
FIT_MODES = ("auto", "again", "off")


def fit_playground(pg, mode: str = "auto", *, folder=None, say: Callable[[str], None] | None = None) -> dict:
    """Choose, for each numerics ``pg`` loaded, the tree and lookup length and the EAGLE node budget from this
    machine's costs (``mode``: "auto" reads a cached fit of this machine key or measures one and caches it,
    "again" measures every drafter anew, "off" keeps the shipped choices), and make them ``pg``'s defaults. A
    shipped calibration (or EAGLE sweep) made on this very machine key wins, and "auto" does not time that
    drafter. Returns {numerics: Fit}; what runs and why goes to ``say``."""
    from ..core.defaults import calibration_records
    from ..core.machine_fit import eagle_sweeps, engine_of, read_fit, this_machine, write_fit

    say = say or (lambda msg: None)
    if mode == "off":
        return {}
    capture = pg.static_kv.capture if pg.static_kv is not None else None
    if capture == "compile":
        # every candidate's shape would be compiled first (minutes on a GPU); a server builds that engine in the
        # background and fits on the one it serves with meanwhile (Playground.load(compile_in_background=True))
        say("Machine fit: not timed on an engine that compiles at load; the shipped choices hold.")
        return {}
    for numerics, (model, _) in pg.variants.items():
        key = this_machine(input_device(model), numerics, engine_of(pg.cache, capture))
        head = pg.drafters.eagles.get(numerics)
        meta = _eagle_meta(head) if head is not None else {}
        shipped_tree = any(key.same_as(r) for r, _, _ in calibration_records(pg.heads))
        shipped_eagle = head is not None and any(key.swept_here(s) for s in eagle_sweeps(meta))
        fit = read_fit(key, folder) if mode == "auto" else None
        if fit is None:
            # "again" times every drafter (to hold it against what was shipped); the shipped choice still wins
            again = mode == "again"
            candidates = candidates_of(
                pg, numerics, medusa=again or not shipped_tree, eagle_meta=meta if again or not shipped_eagle else None
            )
            if candidates:
                say(f"Machine fit ({numerics}): timing {len(candidates)} setups on {key.label()}...")
                fit = measure(pg, numerics, key, candidates, progress=say)
                where = write_fit(fit, folder)
                say(
                    f"Machine fit ({numerics}): measured in {fit.seconds:.1f} s"
                    + (f", cached in {where}" if where else " (not cached: the cache cannot be written)")
                )
            else:
                fit = Fit(key, 0.0, (), 0.0, date.today().isoformat(), how="shipped")
        pg.fits[numerics] = fit
        best = fit.best("eagle")
        if best is not None and head is not None and not shipped_eagle:
            tree = _eagle_tree(best.candidate.name)
            object.__setattr__(
                head, "config", replace(head.config, top_k=tree.top_k, depth=tree.depth, num_nodes=tree.num_nodes)
            )
            say(f"Machine fit ({numerics}): {fit.why('eagle')}")
        elif head is not None and shipped_eagle:
            say(f"Machine fit ({numerics}): EAGLE's node budget is its timed sweep's on this machine ({key.label()}).")
        why = pg.defaults_for(numerics).why
        if why:
            say(f"Machine fit ({numerics}): {why}")
    pg.defaults = pg.defaults_for(None)
    return dict(pg.fits)


def _eagle_meta(head) -> dict:
    """The EAGLE head's config.json (its timed sweeps), {} where it cannot be read."""
    try:
        meta = json.loads((head.folder / "config.json").read_text())
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
    return meta if isinstance(meta, dict) else {}


__all__ = ["FIT_MODES", "FIT_PROMPT", "candidates_of", "decoder_for", "fit_playground", "measure", "step_seconds"]
