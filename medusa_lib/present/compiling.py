"""The compiled engine built while the page already serves: Inductor's step programs compiled one at a time
between runs, and swapped in between runs once all are built.

A compiled engine (``kv.StaticKV`` with capture "compile": the GPU default, ``--cache static --capture
compile`` on a CPU) costs seconds to minutes per step shape at its first start. Instead of making the
first visitor wait for them, a server (``Playground.load(compile_in_background=True)``) serves on the
engine that needs no compiling (a GPU: each step one CUDA graph of eager kernels; a CPU: the dynamic
cache) and hands the compiled engine here. Its own static cache is never one a run uses: the programs
are built with their own buffers. ``compile_next`` builds one program (on the device's thread, while
no run holds it: the server's ``DeviceTurn``); ``swap`` makes the compiled engine the one runs take,
between two runs. A program that fails to compile is left to eager kernels, as at load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..core.decoding import Decoder
from ..core.fused import Program
from ..core.kv import StaticKV
from ..core.messages import cause
from ..core.static_run import capture_program, programs, record_prefill


@dataclass
class Unit:
    """One step program to build, in the compiled engine of one numerics."""

    numerics: str
    # a decoder of the page's first view on that engine, and one of its programs (``static_run.programs``)
    decoder: Decoder
    program: Program


@dataclass
class PendingEngine:
    """A compiled engine being built beside the one runs use."""

    # numerics -> the compiled engine's static cache of that copy
    kvs: dict[str, StaticKV]
    units: list[Unit]
    # what runs use meanwhile, in words ("dynamic KV cache (eager)")
    serving: str
    done: int = 0
    seconds: float = 0.0
    # sentences of programs that fell back to eager kernels, or failed to compile
    notes: list[str] = field(default_factory=list)
    swapped: bool = False

    @property
    def total(self) -> int:
        return len(self.units)

    @property
    def left(self) -> int:
        return self.total - self.done

    def status(self) -> str:
        """The info line's words while it builds ("" once swapped in)."""
        if self.swapped:
            return ""
        if self.left:
            return f"compiling {self.done + 1} of {self.total} step programs; runs use the {self.serving} meanwhile"
        return f"{self.total} step programs compiled in {self.seconds:.0f} s; swapped in before the next run"

    def compile_next(self, say: Callable[[str], None] | None = None) -> bool:
        """Build the next program (call it where no run holds the device: its engine is not any run's, but
        the device is); True while more remain."""
        if not self.left:
            return False
        unit = self.units[self.done]
        kv, prog = self.kvs[unit.numerics], unit.program
        t0 = time.perf_counter()
        what = (
            f"the {prog.num_nodes}-token {unit.decoder.method} step "
            f"({unit.numerics}; {self.done + 1} of {self.total}, in the background)"
        )
        with torch.inference_mode():
            record_prefill(kv, say=say)
            try:
                capture_program(prog, kv, what, say=say)
            except Exception as e:  # noqa: BLE001
                # that step runs its eager kernels on the compiled engine, as at load
                self.notes.append(f"Compiling {what} failed ({cause(e, 120)}); it runs eagerly.")
            if prog.note:
                self.notes.append(prog.note)
        self.seconds += time.perf_counter() - t0
        self.done += 1
        return bool(self.left)

    def swap(self, pg) -> str:
        """Make the compiled engine the one ``pg``'s runs take (between runs); its description."""
        first = self.kvs[pg.dtype]
        pg.cache, pg.static_kv = "static", first
        pg.variant_kv = {k: v for k, v in self.kvs.items() if k != pg.dtype}
        pg.engine = first.describe()
        pg.pending = None
        self.swapped = True
        return pg.engine


def pending_engine(pg, kvs: dict[str, StaticKV], first_view: Callable[[str], object]) -> PendingEngine:
    """The step programs of the page's first view (``first_view(numerics)``: its request) in every numerics,
    each on its copy's compiled engine: what ``Playground.load`` compiles at load otherwise."""
    units, seen = [], set()
    for numerics, kv in kvs.items():
        _, decoders = pg.prepare("Hello", pg.settings_of(first_view(numerics)))
        for d in decoders.values():
            # the same drafter (its lookup chain included) on the compiled engine
            compiled = Decoder(
                d.model, method=d.method, config=replace(d.config, cache="static"), static_kv=kv, drafter=d.drafter
            )
            # the same root-only step serves several decoders: one unit each program
            for prog in programs(compiled, kv):
                if prog is not None and id(prog) not in seen:
                    seen.add(id(prog))
                    units.append(Unit(numerics, compiled, prog))
    return PendingEngine(kvs, units, serving=pg.engine)


__all__ = ["PendingEngine", "Unit", "pending_engine"]
