"""What travels to a GPU machine reached by copying files, and in how many calls: sizes and slices.

Each call to that machine carries the working tree (tracked and untracked-not-ignored files) and the
ignored folders it names, 64 MiB in all. ``plan_copies`` fits the wheels and the model into the fewest
calls beside the tree as it is now; the stage there (medusa_lib/pipeline/gpu_stage.py) takes, checks and
joins what they carry.
"""

from __future__ import annotations

import lzma
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from medusa_lib.pipeline.gpu_stage import CHUNK, StageError, mb

# What one call may carry: the working tree and the carried folders.
CALL_LIMIT = 64 * 2**20
# Allowance for each file's bookkeeping in a copy (archive headers, padding).
PER_FILE = 1024
# Headroom for small changes of the tree between packing and the copies.
SAFETY = 2**20
# The manifest and the folder itself, in every call.
RESERVE = 64 * 2**10


# ------------------------------------------------------------------------- what travels
def travelling_files(root: Path) -> list[Path]:
    """The files a call copies besides its carried folders: tracked and untracked-not-ignored files,
    and ``shared/`` where the checkout has one (it travels even when ignored)."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    names = {n for n in out.decode("utf-8", "surrogateescape").split("\0") if n}
    shared = root / "shared"
    if shared.is_dir():
        names |= {str(p.relative_to(root)) for p in shared.rglob("*") if p.is_file() or p.is_symlink()}
    files = [root / n for n in sorted(names)]
    # A tracked file deleted since, or a submodule, copies nothing.
    return [p for p in files if p.is_symlink() or p.is_file()]


def tree_size(root: Path) -> tuple[int, int]:
    """(bytes, files) of what every call copies before its carried folders."""
    files = travelling_files(root)
    return sum(p.lstat().st_size for p in files), len(files)


def room_per_call(tree_bytes: int, tree_files: int, *, limit: int = CALL_LIMIT) -> int:
    """Bytes one call can carry beside the tree (before the per-file allowance of what it carries)."""
    return limit - tree_bytes - PER_FILE * tree_files - SAFETY - RESERVE


# ------------------------------------------------------------------------- the copies
@dataclass(frozen=True)
class Copy:
    """What one call carries: whole wheels and one slice [start, start + size) of the stored model."""

    wheels: tuple[str, ...]
    start: int
    size: int


def plan_copies(*, room: int, wheels: dict[str, int], model_size: int) -> list[Copy]:
    """The fewest calls that carry every wheel (whole) and the model (in slices), each within ``room``.

    n = ceil(total / room) calls suffice whenever the wheels fit them first-fit (the model fills any
    gap); the model is spread over the calls in proportion to their free space, so each call keeps
    the same share of slack."""
    if room <= PER_FILE:
        raise StageError(
            f"The working tree alone leaves no room in a {mb(CALL_LIMIT)} call; "
            "ignore or remove large untracked files (git status shows them) and pack again."
        )
    big = [w for w, s in wheels.items() if s + PER_FILE > room]
    if big:
        raise StageError(
            f"The wheel {big[0]} ({mb(wheels[big[0]])}) is larger than one call can carry beside the "
            f"working tree ({mb(room)}); make the tree smaller or leave that wheel out."
        )
    need = sum(s + PER_FILE for s in wheels.values()) + model_size
    n = max(1, math.ceil(need / room))
    while True:
        loads, placed = [0] * n, [[] for _ in range(n)]
        # First-fit decreasing.
        for w in sorted(wheels, key=lambda w: (-wheels[w], w)):
            i = next((i for i in range(n) if loads[i] + wheels[w] + PER_FILE <= room), None)
            if i is None:
                break
            loads[i] += wheels[w] + PER_FILE
            placed[i].append(w)
        else:
            # One model part per call: its own allowance.
            free = [max(room - load - PER_FILE, 0) for load in loads]
            if sum(free) >= model_size:
                break
        n += 1
    shares, left, total_free = [], model_size, sum(free)
    for i, f in enumerate(free):
        share = left if i == n - 1 else min(f, left, (model_size * f) // max(total_free, 1) + 1)
        shares.append(share)
        left -= share
    copies, start = [], 0
    for i in range(n):
        copies.append(Copy(tuple(sorted(placed[i])), start, shares[i]))
        start += shares[i]
    return copies


def part_name(index: int, count: int) -> str:
    return f"model.part{index}of{count}"


def stored_model(gguf: Path, folder: Path, *, compress: bool) -> Path:
    """The model as it travels: the file itself, or an xz copy of it kept in ``folder`` (reused while
    the source's size and time are unchanged)."""
    if not compress:
        return gguf
    out = Path(folder) / (gguf.name + ".xz")
    stamp = out.with_suffix(".source")
    key = f"{gguf.stat().st_size} {gguf.stat().st_mtime_ns}"
    if not (out.exists() and stamp.exists() and stamp.read_text() == key):
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(gguf, "rb") as src, lzma.open(out.with_suffix(".tmp"), "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst, CHUNK)
        os.replace(out.with_suffix(".tmp"), out)
        stamp.write_text(key)
    return out
