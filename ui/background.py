"""What the server builds while no run needs the device: the compiled engine (``present/compiling.py``), one
step program at a time, swapped in between two runs once all are built."""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .live import DeviceTurn
from .sharing import IDLE_SECONDS

log = logging.getLogger("medusa_playground")


def compile_between_runs(
    pg, device: DeviceTurn, *, say: Callable[[str], None] = print, then: Callable[[], object] | None = None
) -> threading.Thread:
    """Build ``pg.pending``'s programs on the device's thread, each once the device has been idle a moment (a run
    that arrives meanwhile waits for the one program being built, never for the rest), then swap the compiled
    engine in (a job on the device's line: between two runs) and call ``then``. Returns the daemon thread."""

    def work() -> None:
        pending = pg.pending
        try:
            while pending.left:
                device.wait_idle(IDLE_SECONDS)
                device.call(pending.compile_next, say)
            engine = device.call(pending.swap, pg)
            say(f"Engine: {engine}; swapped in between runs after {pending.seconds:.0f} s of compiling.")
            for note in pending.notes:
                say(f"note: {note}")
        except Exception:  # noqa: BLE001
            # runs go on with the engine they have
            log.exception("building the compiled engine failed; runs keep the %s", pending.serving)
        if then is not None:
            then()

    thread = threading.Thread(target=work, name="medusa-compile", daemon=True)
    thread.start()
    return thread


__all__ = ["compile_between_runs"]
