"""A live ``python app.py`` for the server checks (``server_check``, ``class_check``): start it, wait until it
answers, watch what it prints, read its memory, and name the machine every figure is measured on."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
# what the server prints when its examples are recorded (ui/sharing.py)
RECORDED = "Examples:"


def machine() -> str:
    """The CPU, the flags that decide bfloat16's speed (``machine_fit.cpu_name_and_flags``: an ISA cap set in the
    environment too), and torch's threads: every figure names its machine."""
    import torch

    from ..core.machine_fit import cpu_name_and_flags

    name, flags = cpu_name_and_flags()
    return f"{name}, {os.cpu_count()} cores, flags: {flags or 'unknown'}, torch threads {torch.get_num_threads()}"


def wait_until_up(url: str, server: subprocess.Popen, timeout: float) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if server.poll() is not None:
            sys.exit(f"error: the server exited at start (code {server.returncode}); run python app.py to see why.")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1)
    sys.exit(f"error: the server did not answer at {url} within {timeout:g} s.")


def rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kb = next((int(line.split()[1]) for line in text.splitlines() if line.startswith("VmRSS:")), None)
    return kb / 1024 if kb is not None else None


def start_server(
    port: int, args: tuple[str, ...] = (), *, heard: Callable[[float, str], None] | None = None
) -> tuple[subprocess.Popen, threading.Event]:
    """``python app.py`` on ``port`` (with ``args``), its output watched for the line that says the examples are
    recorded; ``heard(seconds since the start, line)`` hears every line it prints."""
    t0 = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--port", str(port), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    recorded = threading.Event()

    def watch() -> None:
        for line in server.stdout:
            if heard is not None:
                heard(time.perf_counter() - t0, line.rstrip())
            if line.startswith(RECORDED):
                print(f"server: {line.strip()}")
                recorded.set()

    threading.Thread(target=watch, daemon=True).start()
    return server, recorded
