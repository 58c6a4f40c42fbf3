"""The machine fit: which Medusa tree, lookup length and EAGLE node budget run fastest on *this* machine.

A tree's speed-up over plain decoding is its tokens per step over what one of its steps costs against a
plain step (the Medusa paper's acceleration rate over overhead, Sec. 3.3.1; the Tree lab's model). The
first half hardly depends on the machine: the shipped calibrations simulate it for every shipped tree,
with and without the lookup branch, and EAGLE's timed sweeps counted it for every node budget. The
second half is all machine: a 17-token verify costs 1.31x a plain step on an Intel Xeon with AMX in
bfloat16, about 1.6x on an AVX2-only CPU, and as much as a plain step on a GPU.

So at start-up the app times whole decode steps of each candidate here (``present/fit.py``: drafting,
verifying and accepting, as runs take them), predicts each candidate's speed-up from the shipped
tokens per step, and keeps the best. The result is cached per :class:`MachineKey` (device, CPU flags,
numerics, torch threads, engine) in the user cache, so later starts read it. A shipped calibration
made on the same machine key still wins: it measured real runs, where this predicts them.

This module is the arithmetic and the cache; it runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import torch

from .model import CACHE_DIR

# a change of what a fit holds or how it is measured makes every cached fit stale
FIT_VERSION = 1
FIT_DIR = CACHE_DIR / "machine_fit"
# a bigger candidate must predict this much more to be chosen over a smaller one (the calibration's tie)
TIE = 0.02
# the CPU flags that decide what a wide verify costs against a plain step
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
# environment variables that cap the kernels torch and oneDNN use below what the CPU has
CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
# what a candidate is, for the page's words
KIND_WORDS = {"medusa": "tree", "eagle": "EAGLE node budget"}


# ---------------------------------------------------------------------- the machine
@dataclass(frozen=True)
class MachineKey:
    """What a fit holds for: two machines with the same key verify a tree at the same relative cost."""

    # "AMD EPYC", "NVIDIA H200"
    device: str
    # the CPU flags among CPU_FLAGS, and torch's kernel level where it is capped below them (ATEN_CPU_CAPABILITY)
    flags: str
    # "float32", "bfloat16"
    numerics: str
    # torch's threads on a CPU (0 on a GPU)
    threads: int
    # "dynamic", "static", "static, compile", "static, cuda-graph"
    engine: str

    def label(self) -> str:
        """The key in words: 'AMD EPYC (avx2 avx512f avx512_bf16), bfloat16, 2 threads, dynamic'."""
        device = f"{self.device} ({self.flags})" if self.flags else self.device
        threads = f"{self.threads} threads, " if self.threads else ""
        return f"{device}, {self.numerics}, {threads}{self.engine} engine"

    def slug(self) -> str:
        """A file name for the key: its device's words and a digest of the whole key."""
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]
        words = "".join(c if c.isalnum() else "-" for c in self.device.lower()).strip("-")
        return f"{words[:40]}-{self.numerics}-{digest}"

    def same_as(self, record: dict) -> bool:
        """Whether a calibration record's ``machine`` (``{device, flags, threads, engine}``) and ``dtype`` name
        this key."""
        machine = record.get("machine")
        if not isinstance(machine, dict):
            return False
        numerics = str(record.get("dtype") or "").removeprefix("torch.")
        return (
            numerics == self.numerics
            and machine.get("device") == self.device
            and machine.get("flags", "") == self.flags
            and int(machine.get("threads") or 0) == self.threads
            and machine.get("engine") == self.engine
        )

    def swept_here(self, sweep: dict) -> bool:
        """Whether an EAGLE head's timed sweep (``eagle_tune``: its ``machine`` line, "AMD EPYC, 2 cores,
        flags: avx2 avx512f avx512_bf16, torch threads 2", and ``dtype``) ran on this key. Sweeps ran on the
        dynamic cache (a CPU's engine) unless they name an ``engine``."""
        line = str(sweep.get("machine") or "")
        parts = {p.split(":")[0].strip(): p for p in line.split(", ")}
        flags = parts.get("flags", "flags:").split(":", 1)[1].strip()
        threads = parts.get(next((k for k in parts if k.startswith("torch threads")), ""), "")
        return (
            str(sweep.get("dtype") or "").removeprefix("torch.") == self.numerics
            and line.split(", ")[0] == self.device
            and flags == self.flags
            and threads == f"torch threads {self.threads}"
            and str(sweep.get("engine") or "dynamic") == self.engine
        )


def cpu_name_and_flags() -> tuple[str, str]:
    """The CPU's model name and its flags among CPU_FLAGS (/proc/cpuinfo), plus torch's kernel level where
    an environment caps it below them (ATEN_CPU_CAPABILITY=avx2 on an AVX512 machine: a different machine
    for this purpose)."""
    import platform

    name, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = info.splitlines()
        name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), name)
        flags = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
    except OSError:
        pass
    have = [f for f in CPU_FLAGS if f in flags]
    capped = [
        f"{var}={os.environ[var]}" for var in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if os.environ.get(var)
    ]
    return name, " ".join(have + capped)


def this_machine(device: torch.device | str, numerics: str, engine: str) -> MachineKey:
    """The key of this machine for runs on ``device`` in ``numerics`` through ``engine``."""
    device = torch.device(device)
    numerics = str(numerics).removeprefix("torch.")
    if device.type == "cuda":
        return MachineKey(torch.cuda.get_device_name(device), "", numerics, 0, engine)
    if device.type != "cpu":
        return MachineKey(device.type, "", numerics, 0, engine)
    name, flags = cpu_name_and_flags()
    return MachineKey(name, flags, numerics, torch.get_num_threads(), engine)


def engine_of(cache: str, capture: str | None) -> str:
    """A MachineKey's engine: 'dynamic', 'static', or 'static, <capture>'."""
    if cache == "dynamic":
        return "dynamic"
    return "static" if capture in (None, "", "none") else f"static, {capture}"


def machine_record(device: torch.device | str, cache: str, capture: str | None) -> dict:
    """What a calibration record made here says of its machine (``MachineKey.same_as`` reads it; its numerics
    are the record's ``dtype``)."""
    key = this_machine(device, "float32", engine_of(cache, capture))
    return {"device": key.device, "flags": key.flags, "threads": key.threads, "engine": key.engine}


# ---------------------------------------------------------------------- what may run
@dataclass(frozen=True)
class Candidate:
    """One setup the fit may choose."""

    # "medusa" (a tree preset and a lookup length) or "eagle" (a node budget)
    drafter: str
    # the tree preset, or the EAGLE tree as "top_k,depth,nodes"
    name: str
    # tokens one step verifies: the tree's nodes, the root and the lookup branch
    tokens: int
    # the lookup branch's length (0: heads only)
    lookup: int
    # tokens per step the shipped figures give it (the same figure for every machine)
    gain: float
    # where that figure comes from
    source: str

    @property
    def label(self) -> str:
        lookup = f" + lookup-{self.lookup}" if self.lookup else ""
        return f"{self.name}{lookup}"


def medusa_candidates(records: Iterable[tuple[dict, str | None, int | None]], trees: Iterable[str], numerics: str):
    """The Medusa setups with shipped figures: every tree of ``trees`` that a calibration record simulated,
    with its recorded lookup length (simulated_tokens_per_step) and without it
    (heads_only_simulated_tokens_per_step). ``records``: ``defaults.calibration_records``; a record in
    ``numerics`` speaks first for a tree, then any other."""
    ordered = sorted(records, key=lambda r: str(r[0].get("dtype") or "").removeprefix("torch.") != numerics)
    known, out = set(trees), {}
    for record, _, _ in ordered:
        lookup = int(record.get("lookup") or 0)
        where = f"{record.get('device') or 'a calibration'}, {str(record.get('dtype', '')).removeprefix('torch.')}"
        for name, fig in (record.get("trees") or {}).items():
            nodes = fig.get("nodes")
            if name not in known or not nodes:
                continue
            pairs = [(0, fig.get("heads_only_simulated_tokens_per_step"))]
            if lookup:
                pairs.append((lookup, fig.get("simulated_tokens_per_step")))
            for length, gain in pairs:
                if gain and (name, length) not in out:
                    out[(name, length)] = Candidate(
                        "medusa", name, int(nodes) + length, length, float(gain), f"simulated, {where}"
                    )
    return sorted(out.values(), key=lambda c: (c.tokens, c.lookup, c.name))


def eagle_sweeps(meta: dict) -> list[dict]:
    """An EAGLE head's timed sweeps (its config.json ``tree_sweeps`` per kind of machine, and ``tree_sweep``)."""
    return [s for s in [*(meta.get("tree_sweeps") or {}).values(), meta.get("tree_sweep")] if isinstance(s, dict)]


def eagle_candidates(meta: dict, numerics: str) -> list[Candidate]:
    """The EAGLE node budgets with counted tokens per step: the rows of the head's timed sweeps
    (``eagle_sweeps``), a sweep in ``numerics`` first."""
    sweeps = eagle_sweeps(meta)
    sweeps.sort(key=lambda s: str(s.get("dtype") or "") != numerics)
    out = {}
    for sweep in sweeps:
        for row in sweep.get("rows") or ():
            name, tps = str(row.get("tree", "")), row.get("tokens_per_step")
            try:
                _, _, nodes = (int(x) for x in name.split(","))
            except ValueError:
                continue
            if tps and name not in out:
                where = f"{sweep.get('machine', 'a sweep')}, {sweep.get('dtype', '')}"
                out[name] = Candidate("eagle", name, nodes + 1, 0, float(tps), f"counted, {where}")
    return sorted(out.values(), key=lambda c: (c.tokens, c.name))


# ---------------------------------------------------------------------- what was measured
@dataclass(frozen=True)
class Timed:
    """A candidate's measured step, and its predicted speed-up."""

    candidate: Candidate
    # median ms of one whole decode step (draft, verify, accept)
    step_ms: float
    # step_ms over a plain step's
    cost: float

    @property
    def predicted(self) -> float:
        return self.candidate.gain / self.cost


def choose(rows: Iterable[Timed], tie: float = TIE) -> Timed | None:
    """The best predicted speed-up; a candidate that verifies more tokens must beat a smaller one by ``tie``."""
    best = None
    for r in sorted(rows, key=lambda r: (r.candidate.tokens, r.candidate.lookup)):
        if best is None or r.predicted > best.predicted * (1 + tie):
            best = r
    return best


@dataclass(frozen=True)
class Fit:
    """What the start-up measurement chose on one machine key, and the rows it chose from."""

    key: MachineKey
    # median ms of a plain decode step
    plain_ms: float
    rows: tuple[Timed, ...]
    # seconds the measurement took
    seconds: float
    # "2026-11-29"
    measured: str
    # "measured" now, or "cached" (read from an earlier start)
    how: str = "measured"
    # candidates left unmeasured because even their best gain could not beat the chosen one at their cost
    skipped: tuple[str, ...] = field(default_factory=tuple)

    def best(self, drafter: str) -> Timed | None:
        return choose(r for r in self.rows if r.candidate.drafter == drafter)

    def why(self, drafter: str = "medusa") -> str:
        """One sentence for the info line and the Tree lab: which setup runs and why."""
        best = self.best(drafter)
        if best is None:
            return ""
        when = "at start-up" if self.how == "measured" else f"at an earlier start ({self.measured})"
        c, what = best.candidate, KIND_WORDS[drafter]
        return (
            f"{what[0].upper()}{what[1:]} {c.label} chosen {when} from this machine's measured costs: "
            f"{c.tokens} tokens for {best.cost:.2f}x a plain step, {c.gain:.2f} tokens/step (simulated)."
        )

    def to_json(self) -> dict:
        return {
            "version": FIT_VERSION,
            "key": asdict(self.key),
            "plain_ms": self.plain_ms,
            "seconds": self.seconds,
            "measured": self.measured,
            "skipped": list(self.skipped),
            "rows": [{**asdict(r.candidate), "step_ms": r.step_ms, "cost": r.cost} for r in self.rows],
        }

    @classmethod
    def from_json(cls, data: dict) -> "Fit":
        rows = []
        for r in data["rows"]:
            r = dict(r)
            step_ms, cost = float(r.pop("step_ms")), float(r.pop("cost"))
            rows.append(Timed(Candidate(**r), step_ms, cost))
        return cls(
            MachineKey(**data["key"]),
            float(data["plain_ms"]),
            tuple(rows),
            float(data["seconds"]),
            str(data["measured"]),
            how="cached",
            skipped=tuple(data.get("skipped") or ()),
        )


def fit_path(key: MachineKey, folder: Path | None = None) -> Path:
    return (folder or FIT_DIR) / f"{key.slug()}.json"


def read_fit(key: MachineKey, folder: Path | None = None) -> Fit | None:
    """The cached fit of ``key``, None if there is none or it is unreadable or stale (measured again then)."""
    try:
        data = json.loads(fit_path(key, folder).read_text())
        if data.get("version") != FIT_VERSION:
            return None
        fit = Fit.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return fit if fit.key == key else None


def write_fit(fit: Fit, folder: Path | None = None) -> Path | None:
    """Cache ``fit`` under its key; None where the cache cannot be written (a read-only home: measured again
    at the next start)."""
    path = fit_path(fit.key, folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(fit.to_json(), indent=1))
        tmp.replace(path)
    except OSError:
        return None
    return path


__all__ = [
    "Candidate",
    "FIT_DIR",
    "Fit",
    "MachineKey",
    "Timed",
    "choose",
    "eagle_candidates",
    "eagle_sweeps",
    "engine_of",
    "machine_record",
    "medusa_candidates",
    "read_fit",
    "this_machine",
    "write_fit",
]
