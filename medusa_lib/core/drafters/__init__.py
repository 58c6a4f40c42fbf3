"""Drafters: who proposes the tree that a Medusa step verifies, one class each (``base.Drafter``).

Every module of this package is a drafter's file; each is imported here and every ``Drafter``
subclass with ``listed`` set is registered under its ``name`` (``REGISTRY``, in ``order``). The
page's Drafter choice, ``/compare``'s ``drafter`` and the bench's methods are read from the
registry, so a new drafter is one new file here. ``make_drafter`` resolves a Decoder's keywords
(``drafter=``, or the ``eagle=`` / ``heads=`` + ``tree=`` conveniences) and puts a lookup branch
beside the drafter's tree when one is asked for (``branch.LookupBranch``). docs/engine.md,
"Writing a drafter".
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Draft, Drafter, DrafterError, DraftRun, Loaded, StaticDraft
from .branch import LookupBranch
from .eagle_head import EagleDrafter
from .medusa_heads import MedusaDrafter
from .prompt_lookup import LookupDrafter

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def _subclasses(cls: type) -> list[type]:
    return [c for s in cls.__subclasses__() for c in (s, *_subclasses(s))]


# name -> drafter class, in the page's order
REGISTRY: dict[str, type[Drafter]] = {
    c.name: c for c in sorted((c for c in _subclasses(Drafter) if c.listed), key=lambda c: (c.order, c.name))
}


def make_drafter(*, heads=None, tree=None, eagle=None, drafter: Drafter | None = None, lookup: int = 0) -> Drafter:
    """The drafter of Decoder's keywords: ``drafter`` itself, else the EAGLE head ``eagle``, else the
    Medusa ``heads`` on ``tree``; with a lookup chain of ``lookup`` tokens beside it where it takes one."""
    if drafter is not None and not isinstance(drafter, Drafter):
        names = ", ".join(c.__name__ for c in REGISTRY.values())
        raise DrafterError(f"drafter must be a Drafter ({names}), not {type(drafter).__name__}.")
    if drafter is None:
        drafter = EagleDrafter(eagle, tree) if eagle is not None else MedusaDrafter(heads, tree)
    return LookupBranch(drafter, lookup) if lookup and drafter.branch else drafter


__all__ = [
    "Draft",
    "DraftRun",
    "Drafter",
    "DrafterError",
    "EagleDrafter",
    "Loaded",
    "LookupBranch",
    "LookupDrafter",
    "MedusaDrafter",
    "REGISTRY",
    "StaticDraft",
    "make_drafter",
]
