"""The page's Drafter choice: who proposes the tree the Medusa columns verify.

Every drafter runs on one verifier (``core/decoding.py``), so the columns compare drafters with the
same acceptance rules and the same exactness guarantees. The drafters offered are the core's
registry (``core.drafters.REGISTRY``): each class says its name, label, note and what it loads
(``Drafter.load``: the Medusa heads, an EAGLE head beside them, a REST datastore beside them, or
nothing), so nothing here names a kind. What each one loaded for each copy of the model (numerics)
is kept in ``Drafters.loaded`` (``drafter_files.py`` reads and loads it).

Which drafter a run uses when it names none (``default_drafter``): the one with the higher
*recorded* speed-up over plain decoding on this kind of device (``Drafter.recorded``), preferring
figures measured together in one bench run (a record that carries the others' figures); without a
recorded figure for another drafter, the first one (the Medusa heads). No figure is quoted from
another kind of device, and nothing is guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..core.drafters import REGISTRY, Drafter, DrafterError, EagleDrafter
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.heads import MedusaHeads
from ..core.messages import kind, shown
from ..core.tree.shape import MedusaTree
from .numerics import EXACT
from .settings import PlaygroundError

# the drafters' names, in the page's order
DRAFTERS = tuple(REGISTRY)


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


__all__ = [
    "DRAFTERS",
    "Drafters",
    "default_drafter",
    "default_reason",
    "drafter_label",
    "make_drafters",
]
