"""The drafter interface: who proposes the tree that a Medusa step verifies.

The verifier (``decoding.Decoder`` and the static engine's ``fused.Program``) never learns which
drafter it runs: it meets one through ``draft.py``'s contract only (``Draft``, ``StaticDraft``).
A drafter is one class, and that class is the whole drafter: its name in the step records and the
API, its label and note for the page, what it loads (``load``), whether the page's tree controls
shape its tree and whether a lookup branch may sit beside it. Per run it is bound to one decoder's
devices (``bind``), opens one run's state (``open``), is told what each step verified
(``DraftRun.verified``) and proposes the next tree under a root (``DraftRun.propose``). ``static``
says what a captured, fixed-shape step holds of it (None: the dynamic cache only, said by
``static_note``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, ClassVar, NamedTuple

from ..draft import Draft, DraftRun, StaticDraft, no_context
from ..messages import InputError
from ..tree.masks import TreeBuffers
from ..tree.shape import MedusaTree


class DrafterError(InputError):
    """A drafter that cannot run with these settings. One sentence that says what to change."""


class Loaded(NamedTuple):
    """What a drafter loaded for one copy of the model (``Drafter.load``): ``state`` is handed back
    to ``for_run``; ``note`` is the line the page and the load log show (why it is missing, or
    what it is)."""

    state: Any
    note: str = ""


class Drafter:
    """One drafter, from the core to the page: the class attributes are the unit the page, the API
    and the bench read; an instance is one run's drafter (``bind``, ``open``, ``static``)."""

    # the records' and the API's name, the page's label, the records' wording ("drafted by ...")
    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    drafted_by: ClassVar[str] = ""
    # its place on the page's choice; its label is plural ("the Medusa heads start selected")
    order: ClassVar[int] = 100
    plural: ClassVar[bool] = False
    # offered on the page and as bench methods
    listed: ClassVar[bool] = True
    # a lookup branch may sit beside its tree; the page's tree preset and custom tree shape its tree
    branch: ClassVar[bool] = True
    tree_controls: ClassVar[bool] = False
    # where its measured speed-ups are kept ("": nowhere)
    records: ClassVar[str] = ""
    # the help of the app's --<name> flag, for a drafter the operator may point somewhere ("": none)
    option: ClassVar[str] = ""
    # what the page's "How to read this page" says about it
    teach: ClassVar[str] = ""
    # what the inspector calls its tree's levels: "head" where depth k is the k-th head's guess
    levels: ClassVar[str] = "depth"
    static_note: ClassVar[str] = "This drafter has no static form, so the run uses the dynamic cache."
    # per run: its deepest node, its fixed tree (None: a new tree every step)
    depth = 0
    buffers: TreeBuffers | None = None

    # ------------------------------------------------------------------ the unit
    @classmethod
    def load(cls, model, *, heads=None, folder=None, option: str | None = None) -> Loaded:
        """What this drafter needs for ``model`` (weights, a datastore, or nothing). ``heads``: the
        Medusa heads loaded for that copy; ``folder``: the heads' folder (drafters ship beside it);
        ``option``: what the operator named for this drafter (a folder, "auto" or "none").
        ``Loaded(None, why)``: not offered, with the reason."""
        return Loaded(True)

    @classmethod
    def check_option(cls, option, *, folder=None) -> None:
        """Refuse, before any model loads, an ``option`` that cannot work (one sentence)."""

    @classmethod
    def check_files(cls, option, *, folder=None, sizes: tuple[int, int] | None = None) -> str | None:
        """Read, before any model loads, what this drafter would load (``file_checks``): a damaged file the
        operator named raises its sentence (DrafterError); one found beside the heads (``folder``) returns the
        sentence that leaves this drafter out; None when there is nothing wrong, or nothing to read. ``sizes``: the
        model's (hidden size, vocabulary) by its config, where known, which the files must fit."""
        return None

    @classmethod
    def for_run(cls, state, *, heads, tree: Callable[[], MedusaTree], lookup: int) -> "Drafter":
        """The drafter of one run from what ``load`` gave (``tree()``: the checked tree of the page's
        controls, for a drafter with ``tree_controls``; ``lookup``: the branch length asked for)."""
        raise NotImplementedError

    @classmethod
    def recorded(cls, state, *, defaults, device) -> tuple[float | None, dict, str]:
        """(this drafter's recorded speed-up over plain decoding on this kind of device or None, the
        other drafters' figures measured in the same run {name: speed-up}, where they come from).
        ``defaults``: the Medusa heads' defaults on this device (``defaults.heads_defaults``)."""
        return None, {}, ""

    @classmethod
    def about(cls, states: dict) -> str:
        """What the page says under the choice: what it drafts and what the page's tree controls mean
        under it ("": they shape its tree). ``states``: what it loaded, per numerics."""
        return ""

    def tree_label(self) -> str:
        """The name of the tree this drafter verifies, as the page's JSON gives it."""
        return self.name

    @property
    def positions(self) -> int:
        """The deepest draft position its steps can reach (a lookup chain's too)."""
        return self.depth

    # ------------------------------------------------------------------ a run
    def bind(self, dec) -> "Drafter":
        """A copy checked against ``dec``'s model and placed on its devices."""
        bound = copy.copy(self)
        bound._bind(dec)
        return bound

    def _bind(self, dec) -> None:
        pass

    def open(self) -> DraftRun:
        raise NotImplementedError

    def static(self, dec) -> StaticDraft | None:
        return None


def beside(heads, suffix: str) -> Path | None:
    """The folder a drafter ships in beside a Medusa heads folder: the heads folder's name + ``suffix``
    (``<heads>-eagle``, ``<heads>-rest``); None without a heads folder."""
    if not heads:
        return None
    path = Path(heads).expanduser()
    # "." or "..": name the folder itself
    path = path if path.name else path.resolve()
    return path.with_name(path.name + suffix)


__all__ = ["Draft", "DraftRun", "Drafter", "DrafterError", "Loaded", "StaticDraft", "beside", "no_context"]
