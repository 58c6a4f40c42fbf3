"""The tree lab's curves: the cost, gain and speed-up curves of the loaded heads on this device, and where
a tree sits on them (its predicted point).

Pure data for the page (no gradio); the maths is ``core/lab.py``. Sizes are tokens verified per
step, root included; a tree with the lookup branch on also verifies the branch's tokens. The tree being
edited is ``tree_editor.py``'s; the Measure run and what each head got right in a run, ``lab_measure.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ..core.defaults import KIND_NAMES, calibration_records, device_kind, record_kind
from ..core.device import device_label, device_name
from ..core.lab import (
    MAX_SIZE,
    SIZES,
    CostCurve,
    GainCurve,
    gain_curve,
    predicted_speedup,
    recorded_costs,
    speedup_curve,
    step_costs,
)
from ..core.model import input_device
from ..core.packing import few_row_kernels
from ..core.tree.design import expected_tokens_per_step
from ..core.tree.shape import MedusaTree


@dataclass(frozen=True)
class TreeLab:
    """What the lab knows before anything runs.

    accuracy  acc[k][r] of the heads' calibration (None: not calibrated)
    record    that calibration record (its simulated and measured figures), or None
    cost      the cost curve of this kind of device: the record's when it was made on this kind, or
              one measured here (``measure_costs``); None until then
    gain      the greedy trees' gain curve (None without accuracies)
    lookup    the lookup branch's length when it is on
    elsewhere the cost curves of the heads' calibrations on other kinds of device (a GPU's on a CPU, and
              the reverse), drawn beside this device's so the page shows why Medusa pays more there
    """

    accuracy: list[list[float]] | None
    record: dict | None
    cost: CostCurve | None
    gain: GainCurve | None
    lookup: int
    num_heads: int
    device: str
    elsewhere: tuple[CostCurve, ...] = ()

    @property
    def elsewhere_note(self) -> str:
        """One sentence per other device's curve: what a step of about 33 tokens costs there and here."""
        said = []
        for c in self.elsewhere:
            there = f"{c.at(33):.1f}x"
            here = f", here {self.cost.at(33):.1f}x by its fit" if self.cost is not None else ""
            why = (
                "a GPU verifies a tree for little more than one token, so larger trees pay there"
                if c.kind == "cuda"
                else "a CPU pays for every token it verifies, so smaller trees pay there"
            )
            said.append(
                f" The dashed curve: the step costs {c.device} measured in its calibration (a 33-token step "
                f"{there} a plain one{here}): {why}."
            )
        return "".join(said)

    @property
    def cost_note(self) -> str:
        if self.cost is None:
            return (
                f"No cost figures for {self.device} yet: "
                "press Measure costs to time one verify step of each size on this machine." + self.elsewhere_note
            )
        if self.cost.source == "start-up":
            return (
                f"Step costs timed at start-up on this machine ({self.cost.device or self.device}): whole decode "
                "steps of the shipped trees (draft, verify, accept) over a plain step's, the measurement the page's "
                "default tree was chosen by; press Measure costs to time each size's verify forward."
                + self.elsewhere_note
            )
        if self.cost.source == "calibration":
            return (
                f"Step costs from the calibration on {self.cost.device or self.device} (time per step over plain's, "
                "from its measured trees); press Measure costs to time each size on this machine."
                + self.kernel_note
                + self.elsewhere_note
            )
        return (
            f"Step costs measured on this machine ({self.cost.device or self.device}): "
            "the median verify forward of each size (eager, over a dynamic cache, whatever engine serves), "
            "which leaves out the heads' draft and the acceptance a real step adds, "
            "so they read lower than a calibration's." + self.kernel_note + self.elsewhere_note
        )

    @property
    def kernel_note(self) -> str:
        """Why the fit may dip: the sizes whose products ran through MKL are fitted apart."""
        if self.cost is None or not self.cost.mkl_rows:
            return ""
        rows = ", ".join(map(str, self.cost.mkl_rows))
        return (
            f" Steps of {rows} tokens ran their products through MKL (faster here for so few rows), "
            "so the fit keeps them apart: one of them can cost less than a smaller step."
        )

    @property
    def gain_note(self) -> str:
        if self.accuracy is None:
            return (
                "These Medusa heads carry no calibrated accuracies "
                "(python -m medusa_lib.pipeline.calibrate --write records them), so there is no gain curve."
            )
        return ""


def tree_lab(pg) -> TreeLab:
    """The lab of a Playground: its heads' calibration (``defaults.calibration``) and this device's costs."""
    record = pg.defaults.calibration or getattr(pg.heads, "calibration", None)
    record = record if isinstance(record, dict) else None
    accuracy = record.get("accuracy") if record else None
    accuracy = [list(map(float, row)) for row in accuracy[: pg.heads.num_heads]] if accuracy else None
    kind = device_kind(pg.device)
    cost = None
    if record and record_kind(record) == kind and recorded_costs(record):
        cost = CostCurve.of(
            recorded_costs(record),
            source="calibration",
            device=record.get("device") or KIND_NAMES.get(kind, kind),
            mkl_rows=record.get("mkl_rows") or (),
        )
    # the start-up measurement of this machine (present/fit.py), where it timed the trees
    fit = pg.fits.get(pg.default_numerics)
    rows = [r for r in (fit.rows if fit is not None else ()) if r.candidate.drafter == "medusa"]
    if rows and not (record and fit.key.same_as(record)):
        cost = CostCurve.of(
            {1: 1.0, **{r.candidate.tokens: r.cost for r in rows}}, source="start-up", device=fit.key.label()
        )
    gain = gain_curve(accuracy, SIZES, record=record) if accuracy else None
    # device kind -> its first calibration's curve
    elsewhere = {}
    for other, _, _ in calibration_records(pg.heads):
        if record_kind(other) != kind and record_kind(other) not in elsewhere and recorded_costs(other):
            name = other.get("device") or KIND_NAMES.get(record_kind(other), record_kind(other))
            curve = CostCurve.of(recorded_costs(other), source="calibration", device=name)
            elsewhere[record_kind(other)] = replace(curve, kind=record_kind(other))
    return TreeLab(
        accuracy,
        record,
        cost,
        gain,
        int(pg.defaults.lookup),
        int(pg.heads.num_heads),
        device_name(input_device(pg.model)),
        tuple(elsewhere.values()),
    )


def measure_costs(
    pg,
    lab: TreeLab,
    *,
    sizes: Sequence[int] = SIZES,
    repeats: int = 3,
    progress: Callable[[int, int], None] | None = None,
) -> TreeLab:
    """The lab with the cost curve measured on this machine (``core.lab.step_costs`` on the loaded model),
    through the engine its runs use: with a captured static engine, its replayed fixed-shape steps."""
    kv = pg.static_kv if pg.static_kv is not None and pg.static_kv.capture != "none" else None
    rows = step_costs(pg.model, sizes, repeats=repeats, progress=progress, static_kv=kv)
    mkl = few_row_kernels(pg.model) if kv is None else ()
    return replace(lab, cost=CostCurve.from_rows(rows, device=device_label(input_device(pg.model)), mkl_rows=mkl))


@dataclass(frozen=True)
class TreePoint:
    """A tree on the three curves: ``size`` its tokens (root included), ``tokens`` with the lookup branch."""

    size: int
    tokens: int
    gain: float | None
    cost: float | None
    speedup: float | None


def tree_point(lab: TreeLab, tree: MedusaTree, *, lookup_on: bool) -> TreePoint:
    """Where a tree sits: its expected tokens/step from the accuracies (plus the branch's simulated
    gain when it is on), the cost of its step, and gain / cost."""
    lookup = lab.lookup if lookup_on and lab.gain is not None and lab.gain.lookup_gain is not None else 0
    size = tree.num_nodes
    gain = None
    if lab.accuracy is not None:
        gain = expected_tokens_per_step(tree.choices, lab.accuracy) + (lab.gain.lookup_gain_at(size) if lookup else 0.0)
    cost = lab.cost.at(size + lookup) if lab.cost is not None else None
    speedup = (
        predicted_speedup(gain, size, lab.cost, lookup=lookup) if gain is not None and lab.cost is not None else None
    )
    return TreePoint(size, size + lookup, gain, cost, speedup)


@dataclass(frozen=True)
class Curves:
    """The three curves over sizes 1 .. MAX_SIZE, ready to draw (None where the lab lacks their half)."""

    sizes: tuple[int, ...]
    cost: CostCurve | None
    gain: GainCurve | None
    # heads only
    speedup: tuple[float, ...] | None
    optimum: int | None
    # with the lookup branch (its simulated gain, its tokens in the cost)
    speedup_lookup: tuple[float, ...] | None
    optimum_lookup: int | None
    lookup: int
    # other kinds of device's cost curves (TreeLab.elsewhere)
    elsewhere: tuple[CostCurve, ...] = ()


def curves(lab: TreeLab) -> Curves:
    heads = speedup_curve(lab.gain, lab.cost) if lab.gain and lab.cost else None
    both = (
        speedup_curve(lab.gain, lab.cost, lookup=lab.lookup)
        if lab.gain and lab.cost and lab.gain.lookup_gain is not None
        else None
    )
    return Curves(
        SIZES,
        lab.cost,
        lab.gain,
        heads.speedup if heads else None,
        heads.optimum if heads else None,
        both.speedup if both else None,
        both.optimum if both else None,
        lab.lookup,
        lab.elsewhere,
    )


__all__ = [
    "MAX_SIZE",
    "Curves",
    "TreeLab",
    "TreePoint",
    "curves",
    "measure_costs",
    "tree_lab",
    "tree_point",
]
