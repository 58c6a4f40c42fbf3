"""The page's Drafter choice: who proposes the tree the Medusa columns verify.

Every drafter runs on one verifier (``core/decoding.py``), so the columns compare drafters with the
same acceptance rules and the same exactness guarantees. The drafters offered are the core's
registry (``core.drafters.REGISTRY``): each class says its name, label, note and what it loads
(``Drafter.load``: the Medusa heads, an EAGLE head beside them, a REST datastore beside them, or
nothing), so nothing here names a kind. What each one loaded for each copy of the model (numerics)
is kept in ``Drafters.loaded``.

Which drafter a run uses when it names none (``default_drafter``): the one with the higher
*recorded* speed-up over plain decoding on this kind of device (``Drafter.recorded``), preferring
figures measured together in one bench run (a record that carries the others' figures); without a
recorded figure for another drafter, the first one (the Medusa heads). No figure is quoted from
another kind of device, and nothing is guessed.

The Tree lab's EAGLE sweep (``eagle_budgets``) measures EAGLE's tokens per step and speed-up over
plain decoding for a few node budgets on this device, on the comparison's prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.compose import make_decoder
from ..core.drafters import REGISTRY, Drafter, DrafterError, EagleDrafter
from ..core.drafters.eagle_head import find_eagle
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.file_checks import safetensors_problem
from ..core.heads import HeadsConfig, HeadsError, MedusaHeads, hidden_size_of
from ..core.heads_load import load_heads
from ..core.messages import cause, kind, shown
from ..core.spec_metrics import Acceptance, draft_positions, step_acceptance
from ..core.tree.shape import MedusaTree
from .numerics import EXACT
from .settings import PlaygroundError

# the drafters' names, in the page's order
DRAFTERS = tuple(REGISTRY)
SHIPPED_HEADS = Path(__file__).resolve().parents[2] / "assets" / "heads" / "smollm2-135m-instruct"
# the Tree lab's sweep of EAGLE's node budget
EAGLE_BUDGETS = (3, 8, 16, 24, 40)


# ---------------------------------------------------------------------- the Medusa heads
def untrained_heads(model, num_heads: int = 4) -> MedusaHeads:
    """Identity ResBlocks on the shared lm_head: every head proposes the base model's next token."""
    hidden = hidden_size_of(model.config)
    vocab = model.get_output_embeddings().weight.shape[0]
    p = model.get_output_embeddings().weight
    return (
        MedusaHeads(HeadsConfig(hidden_size=int(hidden), vocab_size=int(vocab), num_heads=num_heads))
        .to(device=p.device, dtype=p.dtype)
        .eval()
    )


def load_medusa(
    path: Path | None, model, *, default_heads: str | Path | None = None, shown: str = ""
) -> tuple[MedusaHeads, str]:
    """(the Medusa heads for ``model``, the line that says which). A missing *default* heads folder
    falls back to untrained heads (with a note); heads the user named must load (HeadsError)."""
    shown = shown or (str(path) if path else "")
    if path is not None and (path.exists() or path != Path(default_heads or "")):
        h = read_medusa(path, model=model, shown=shown)
        note = f"trained heads from {shown}" + (
            " (path-conditioned: each head also reads the tree's root and the tokens of its own branch)"
            if h.path_conditioned
            else " (root-conditioned: they also read the tree's root token)"
            if h.root_conditioned
            else ""
        )
        return h, note
    found = f" at {shown}" if path else ""
    return untrained_heads(model), (
        f"untrained heads (identity ResBlocks on the shared lm_head; trained heads not found{found})"
    )


# heads up to this size are read whole before the model loads (their shapes checked); bigger ones are read once
READ_AHEAD_BYTES = 256 * 2**20
HEADS_FILE = "medusa_lm_head.safetensors"


def read_medusa(path: Path, *, model=None, shown: str = "") -> MedusaHeads:
    """``load_heads`` with every failure in one sentence (HeadsError); without ``model`` it reads and checks the
    files alone (config, tensors, their shapes), before any model loads."""
    try:
        return load_heads(path, model=model)
    except HeadsError:
        raise
    except (ValueError, OSError, RuntimeError) as e:
        # a damaged config.json or safetensors file: one sentence, no traceback
        raise HeadsError(
            f"Could not read the Medusa heads at {shown or path} ({cause(e, 200)}); check the files or train new heads."
        ) from None


def check_files(
    folder: Path | None,
    options: Mapping[str, Any],
    *,
    default_heads: str | Path | None = None,
    shown: str = "",
    sizes: tuple[int, int] | None = None,
) -> dict[str, str]:
    """Before any model loads: the Medusa heads' files (read and checked whole, ``read_medusa``; heads the operator
    named, or the default ones where they are) and every drafter's (``Drafter.check_files``). A damaged file the
    operator named raises its sentence; a drafter beside the heads whose files are damaged is left out: returns
    {drafter: the sentence that says so}. ``sizes``: the model's (hidden size, vocabulary) by its config where it
    can be read before the weights load (``file_checks.model_sizes``), which heads and drafters must fit."""
    if folder is not None and folder.is_dir():
        # a small checkpoint (all shipped heads) is read whole and its shapes checked against its config; a big one
        # is read once, with the model, and only its weights' header and size are checked now (a cut copy)
        if sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) <= READ_AHEAD_BYTES:
            heads = read_medusa(folder, shown=shown)
            if sizes is not None:
                heads.check_sizes(*sizes)
        elif (weights := folder / HEADS_FILE).exists() and (problem := safetensors_problem(weights)):
            raise HeadsError(
                f"The heads file {weights} is not a readable safetensors file ({problem}); "
                "copy the heads again or train new ones."
            )
    left = {}
    for name, cls in REGISTRY.items():
        why = cls.check_files(options.get(name), folder=folder, sizes=sizes)
        if why:
            left[name] = why
    return left


# ---------------------------------------------------------------------- loading
def check_options(options: Mapping[str, Any], *, folder) -> None:
    """Refuse, before any model loads, what the operator named for a drafter that cannot be one
    (``Drafter.check_option``): one sentence."""
    for name, option in options.items():
        if name not in REGISTRY:
            raise PlaygroundError(f"Unknown drafter {shown(name)}; the drafters are: {', '.join(REGISTRY)}.")
        takes = [n for n, cls in REGISTRY.items() if cls.option]
        if not REGISTRY[name].option and option not in (None, "", "auto"):
            raise PlaygroundError(
                f"The {REGISTRY[name].label} drafter takes no option (got {shown(option)}); "
                f"only {', '.join(takes) or 'none'} take{'s' if len(takes) == 1 else ''} one."
            )
        REGISTRY[name].check_option(option, folder=folder)


def load_drafters(
    copies: Mapping[str, tuple],
    *,
    folder,
    options: Mapping[str, Any] | None = None,
    say=None,
    left_out: Mapping[str, str] | None = None,
) -> tuple[dict, dict]:
    """What every registered drafter loads for each copy of the model: ``copies`` numerics -> (model,
    heads), the first the loaded copy. Returns ({name: {numerics: state}} of the drafters offered
    (one that loads nothing for the first copy is not offered), {name: the line saying why not}). ``left_out``:
    drafters not loaded at all, with the sentence that says why (``check_files``)."""
    loaded, notes = {}, dict(left_out or {})
    for name, cls in REGISTRY.items():
        if name in notes:
            continue
        option = (options or {}).get(name)
        states = {}
        for numerics, (model, heads) in copies.items():
            got = cls.load(model, heads=heads, folder=folder, option=option)
            if got.state is None:
                if not states:
                    notes[name] = got.note
                    break
                # offered for the first copy only: runs in this numerics say so (Drafters.state)
                if say:
                    say(f"note: {cls.label} in {numerics}: {got.note}")
                continue
            states[numerics] = got.state
            if say and len(states) == 1 and got.note:
                say(f"{cls.label}: {got.note}")
        if states:
            loaded[name] = states
        elif say and notes.get(name):
            say(f"note: {notes[name]}")
    return loaded, notes


# ---------------------------------------------------------------------- the default rule
def default_drafter(figures: Mapping[str, float | None]) -> str:
    """The drafter a run uses when it names none: the one with the highest recorded speed-up, where it
    beats the first drafter's (a missing figure counts as none; a tie keeps the first)."""
    first = next(iter(REGISTRY))
    best = max((n for n in REGISTRY if figures.get(n) is not None), key=lambda n: figures[n], default=first)
    return best if best != first and figures[best] > (figures.get(first) or 0.0) else first


def _the(cls: type[Drafter]) -> str:
    return cls.drafted_by[:1].upper() + cls.drafted_by[1:]


def default_reason(chosen: str, figures: Mapping[str, float | None], *, device: str, source: str = "") -> str:
    """Why the default is what it is, in one sentence (shown under the choice). ``source``: where the
    figures come from (one bench run, or separate records)."""
    cls, first = REGISTRY[chosen], next(iter(REGISTRY))
    start = f"{_the(cls)} start{'' if cls.plural else 's'} selected"
    named = [f"{REGISTRY[n].label} {figures[n]:.2f}x" for n in REGISTRY if figures.get(n) is not None]
    listed = f"{source or 'recorded speed-ups'} on {device}: {', '.join(named)} plain"
    if chosen != first:
        why = listed if figures.get(first) else f"its recorded speed-up on {device}: {figures[chosen]:.2f}x plain"
        return f"{start}: {'they are' if cls.plural else 'it is'} the faster drafter here ({why})."
    silent = [c.records for n, c in REGISTRY.items() if n != first and c.records and figures.get(n) is None]
    if len(named) < 2 and silent:
        return (
            f"{start}: {' and '.join(silent)} records no measured speed-up on {device} "
            "(the Tree lab measures it on your prompt)."
        )
    return f"{start}: {'they are' if cls.plural else 'it is'} the faster drafter here ({listed})."


def either(names) -> str:
    """Drafter names as a sentence offers them: '"a"', '"a" or "b"', '"a", "b" or "c"'."""
    quoted = [f'"{n}"' for n in names]
    return ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else quoted[0]


# ---------------------------------------------------------------------- a run's drafter
@dataclass(frozen=True)
class Drafters:
    """The drafters a Playground offers: what each loaded per numerics, the default and why."""

    # name -> {numerics: what the drafter loaded for that copy}
    loaded: dict
    default: str = next(iter(REGISTRY))
    # the line under the page's choice: the default's reason, or why a drafter is not offered
    note: str = ""
    missing: dict = field(default_factory=dict)

    @property
    def available(self) -> tuple[str, ...]:
        """The drafters offered, in the page's order."""
        return tuple(n for n in REGISTRY if n in self.loaded)

    @property
    def tree_drafter(self) -> str:
        """The drafter whose tree the page's tree controls and the Tree lab shape (the Medusa heads)."""
        return next(n for n, cls in REGISTRY.items() if cls.tree_controls)

    @property
    def eagles(self) -> dict:
        """The EAGLE head per numerics (the Tree lab's EAGLE section; {}: none offered)."""
        return self.loaded.get(EagleDrafter.name, {})

    @property
    def tree(self) -> DynamicTreeConfig | None:
        """The EAGLE head's own dynamic tree (top-k, depth, nodes) in the page's first numerics, or None."""
        return self.tree_of()

    def tree_of(self, numerics: str | None = None) -> DynamicTreeConfig | None:
        """The dynamic tree of the EAGLE head loaded for ``numerics`` (None: float32, the page's first
        numerics, where loaded, else the one loaded): each numerics may have its own, timed on machines
        like this one (``defaults.swept_tree``)."""
        head = self.eagles.get(numerics or EXACT) or next(iter(self.eagles.values()), None)
        return head.config.tree if head is not None else None

    def resolve(self, drafter) -> str:
        """A run's drafter: ``drafter`` checked, None or "" meaning the default. One sentence on bad input."""
        if drafter is None or drafter == "":
            return self.default
        names = either(REGISTRY)
        if not isinstance(drafter, str):
            raise PlaygroundError(f"The drafter must be {names}, not {kind(drafter)} (got {shown(drafter)}).")
        if drafter not in REGISTRY:
            raise PlaygroundError(f"The drafter must be {names} (got {shown(drafter)}).")
        if drafter not in self.available:
            raise PlaygroundError(
                f"This server has no {REGISTRY[drafter].label} for its model, so the drafter must be "
                f"{either(self.available)} "
                "(or left empty)."
            )
        return drafter

    def state(self, drafter: str, numerics: str):
        """What ``drafter`` loaded for the copy with ``numerics``."""
        states = self.loaded[drafter]
        if numerics not in states:
            label = REGISTRY[drafter].label
            raise PlaygroundError(
                f"The {label} is loaded for {', '.join(states)} only; pick that Numerics or another drafter."
            )
        return states[numerics]

    def make(
        self, drafter: str, *, numerics: str, heads: MedusaHeads, tree: Callable[[], MedusaTree], lookup: int
    ) -> Drafter:
        """The core drafter a run's decoders share: ``drafter`` as ``resolve`` gave it, for the copy of
        the model with ``numerics``; ``tree()`` is the checked tree of the run's settings (for a drafter
        whose tree the page's controls shape); ``lookup`` the lookup length the heads run with."""
        try:
            return REGISTRY[drafter].for_run(self.state(drafter, numerics), heads=heads, tree=tree, lookup=lookup)
        except DrafterError as e:
            raise PlaygroundError(str(e)) from None

    def takes_tree(self, drafter: str) -> bool:
        """Whether the page's tree controls (preset, custom tree) shape ``drafter``'s tree."""
        return REGISTRY[drafter].tree_controls

    def note_of(self, drafter: str) -> str:
        """What the tree controls mean under ``drafter`` ("": they shape its tree)."""
        return REGISTRY[drafter].about(self.loaded.get(drafter, {}))


def make_drafters(
    loaded: Mapping,
    *,
    defaults,
    device,
    device_label: str,
    missing: Mapping | None = None,
    numerics: str | None = None,
) -> Drafters:
    """The Drafters of a Playground: the default by ``default_drafter`` from the recorded figures,
    those of one bench run where a record carries several, among the drafters loaded for the
    default ``numerics`` (None: any) so a run that names none can take it."""
    figures, sources, together = {}, [], None
    for name in (n for n in REGISTRY if n in loaded and (numerics is None or numerics in loaded[n])):
        first = next(iter(loaded[name].values()))
        speedup, peers, source = REGISTRY[name].recorded(first, defaults=defaults, device=device)
        figures[name] = speedup
        if speedup is not None:
            sources.append(source)
        if peers and speedup is not None and together is None:
            together = ({name: speedup, **peers}, source)
    if together is not None:
        figures, source = {**figures, **{n: f for n, f in together[0].items() if n in figures}}, together[1]
    elif len(sources) > 1:
        source = f"recorded separately ({' and '.join(sources)}, perhaps on other machines)"
    else:
        source = ""
    chosen = default_drafter(figures)
    note = default_reason(chosen, figures, device=device_label, source=source)
    absent = [why for n, why in (missing or {}).items() if why and REGISTRY[n].records]
    if absent and len([f for f in figures.values() if f is not None]) < 2:
        note = " ".join(absent)
    return Drafters(dict(loaded), chosen, note, dict(missing or {}))


def drafter_label(drafter: str | None) -> str:
    """How the page names the drafter of a record ("" for plain decoding)."""
    return REGISTRY[drafter].label if drafter in REGISTRY else ""


# ---------------------------------------------------------------------- the Tree lab's sweep
@dataclass(frozen=True)
class BudgetPoint:
    # nodes verified per step besides the root (the lookup branch aside)
    nodes: int
    tokens_per_step: float
    tokens_per_second: float
    # tokens/s over plain greedy's, on the same prompt
    speedup: float | None
    # mean acceptance length, rate per draft position (core/spec_metrics.py)
    acceptance: Acceptance | None = None


def eagle_budgets(
    pg,
    prompt: str,
    *,
    max_new_tokens: int,
    chat_template: bool = True,
    numerics: str | None = None,
    budgets: Sequence[int] = EAGLE_BUDGETS,
    stop=None,
    progress: Callable[[int, int], None] | None = None,
) -> list[BudgetPoint]:
    """EAGLE greedy with each node budget (its top-k and depth kept), against plain greedy, on the
    prompt, one run after another on this device (the Playground's checks, warm-up and timing;
    no lookup branch, so the points show the drafter alone). ``progress(done, total)`` after each run."""
    settings = pg.settings_of(
        dict(
            max_new_tokens=max_new_tokens,
            temperature=0.0,
            chat_template=chat_template,
            lookup_branch=False,
            numerics=numerics,
            drafter="eagle",
        )
    )
    ids, decoders = pg.prepare(prompt, settings)
    plain, eagle = decoders["plain"], decoders["medusa-greedy"]
    base = eagle.drafter.tree
    runs = {0: plain} | {
        n: make_decoder(
            eagle.model,
            method="medusa-greedy",
            drafter=EagleDrafter(eagle.drafter.head, replace(base, num_nodes=min(n, base.num_candidates))),
            config=eagle.config,
        )
        for n in budgets
    }
    pg.warmup(ids, [plain, eagle])
    results, total = {}, len(runs)
    for done, (n, dec) in enumerate(runs.items(), 1):
        events = list(pg.run_method("plain" if n == 0 else "medusa-greedy", dec, ids, stop=stop))
        results[n] = events[-1].record.result
        if progress is not None:
            progress(done, total)
    ref = results.pop(0)
    if any(r.decode_steps == 0 for r in results.values()):
        raise PlaygroundError(
            "The run ended at its prefill, so there is no EAGLE step to measure; "
            "raise Max new tokens and measure again."
        )
    base_tps = ref.tokens_per_second if ref.decode_steps else 0.0
    return [
        BudgetPoint(
            runs[n].drafter.tree.num_nodes,
            r.tokens_per_step,
            r.tokens_per_second,
            r.tokens_per_second / base_tps if base_tps > 0 else None,
            step_acceptance(r.steps, depth=draft_positions(runs[n])),
        )
        for n, r in results.items()
    ]


__all__ = [
    "BudgetPoint",
    "DRAFTERS",
    "Drafters",
    "EAGLE_BUDGETS",
    "check_files",
    "check_options",
    "default_drafter",
    "default_reason",
    "drafter_label",
    "eagle_budgets",
    "find_eagle",
    "load_drafters",
    "load_medusa",
    "read_medusa",
    "make_drafters",
    "untrained_heads",
]
