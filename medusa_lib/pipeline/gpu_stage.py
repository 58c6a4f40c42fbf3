"""Staging files on a GPU machine that is reached by copying the working tree: sizes, parts, checksums.

Each call to that machine carries the working tree (tracked and untracked-not-ignored files) and the
ignored folders it names, 64 MiB in all. ``plan_copies`` fits the wheels and the model into the fewest
calls beside the tree as it is now; ``take`` puts one call's files into the stage folder there, which
outlives a call while the machine stays warm; ``verify`` and ``reassemble`` check every part against the
manifest and join them, and refuse a missing or damaged part with one sentence. Standard library only:
the check imports this before any wheel is installed.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CALL_LIMIT = 64 * 2**20  # what one call may carry: the working tree and the carried folders
PER_FILE = 1024  # allowance for each file's bookkeeping in a copy (archive headers, padding)
SAFETY = 2**20  # headroom for small changes of the tree between packing and the copies
RESERVE = 64 * 2**10  # the manifest and the folder itself, in every call
STAGE = "/tmp/medusa-stage"  # on the GPU machine: survives from one call to the next while it stays warm
MANIFEST = "manifest.json"
CHUNK = 2**20


class StageError(Exception):
    """A packing or staging problem, said in one sentence that says what to do."""


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


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
    return [
        p for p in files if p.is_symlink() or p.is_file()
    ]  # a tracked file deleted since, or a submodule, copies nothing


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
        for w in sorted(wheels, key=lambda w: (-wheels[w], w)):  # first-fit decreasing
            i = next((i for i in range(n) if loads[i] + wheels[w] + PER_FILE <= room), None)
            if i is None:
                break
            loads[i] += wheels[w] + PER_FILE
            placed[i].append(w)
        else:
            free = [max(room - load - PER_FILE, 0) for load in loads]  # one model part per call: its own allowance
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


def manifest_id(manifest: dict) -> str:
    """One packing's identity: the checksums of everything it carries."""
    return hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()[:16]


def load_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.exists():
        raise StageError(
            f"No {MANIFEST} in {folder}: the stage has none of the copies yet; make the calls from call 1."
        )
    return json.loads(path.read_text())


# ------------------------------------------------------------------------- there: take, verify, reassemble
def take(folder: Path, stage: Path) -> str:
    """Copy one call's folder into the stage; a stage left by another packing is cleared first (said)."""
    folder, stage = Path(folder), Path(stage)
    incoming = load_manifest(folder)
    said = ""
    if (stage / MANIFEST).exists() and manifest_id(load_manifest(stage)) != manifest_id(incoming):
        for f in load_manifest(stage)["files"]:
            (stage / f["name"]).unlink(missing_ok=True)
        said = "The stage held parts of another packing; cleared them. "
    stage.mkdir(parents=True, exist_ok=True)
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name != MANIFEST:
            shutil.copyfile(p, stage / (p.name + ".tmp"))
            os.replace(stage / (p.name + ".tmp"), stage / p.name)  # never half a part under its own name
    shutil.copyfile(folder / MANIFEST, stage / MANIFEST)
    return said + f"Took {folder.name} into {stage}."


def verify(stage: Path, manifest: dict, *, calls: int | None = None) -> list[dict]:
    """Check each file of calls 1..``calls`` (all by default) in the stage against the manifest;
    return them, or raise one sentence naming the first file missing or damaged and the call to redo."""
    stage = Path(stage)
    last = manifest["calls"] if calls is None else calls
    files = [f for f in manifest["files"] if f["call"] <= last]
    parts = [f for f in manifest["files"] if f["kind"] == "model"]
    for f in files:
        path = stage / f["name"]
        what = (
            f"Part {parts.index(f) + 1} of {len(parts)} of the model ({f['name']})"
            if f in parts
            else f"The wheel {f['name']}"
        )
        if not path.exists():
            nothing = not any((stage / g["name"]).exists() for g in manifest["files"])
            redo = "make the calls again from call 1" if nothing else f"make call {f['call']} again"
            raise StageError(
                f"{what}, carried by call {f['call']} of {manifest['calls']}, is missing from {stage}: "
                f"the machine went back between the calls (idle over 30 s) or that call was not made; {redo}."
            )
        size = path.stat().st_size
        if size != f["size"] or sha256_file(path) != f["sha256"]:
            raise StageError(
                f"{what} in {stage} does not match the manifest ({size} bytes, expected {f['size']}, "
                f"or another sha256): the copy was damaged; make call {f['call']} again."
            )
    return files


def calls_present(stage: Path, manifest: dict) -> int:
    """How many calls, in order, have all their files in the stage (not yet checked)."""
    done = 0
    for call in range(1, manifest["calls"] + 1):
        if not all((Path(stage) / f["name"]).exists() for f in manifest["files"] if f["call"] == call):
            break
        done = call
    return done


def reassemble(stage: Path, manifest: dict, site: Path, *, say=print) -> Path:
    """Verify every part, join them (and unpack them when stored compressed), check the whole model
    and put it where the code finds it: ``site/<package>/<file>`` with an ``__init__.py``."""
    stage, model = Path(stage), manifest["model"]
    target = Path(site) / model["package"] / model["file"]
    if target.exists() and target.stat().st_size == model["size"] and sha256_file(target) == model["sha256"]:
        say(f"The model is already in place ({target}, sha256 matches).")
        return target
    verify(stage, manifest)
    target.parent.mkdir(parents=True, exist_ok=True)
    (target.parent / "__init__.py").touch()
    joined = stage / (model["file"] + (".xz" if model["compression"] == "xz" else "") + ".joined")
    with open(joined, "wb") as out:
        for f in (f for f in manifest["files"] if f["kind"] == "model"):
            with open(stage / f["name"], "rb") as part:
                shutil.copyfileobj(part, out, CHUNK)
    if sha256_file(joined) != model["stored_sha256"]:
        joined.unlink()
        raise StageError(
            "The joined parts do not match the packed model's checksum although each part does: "
            "pack again here and redo the calls."
        )
    tmp = target.with_name(target.name + ".tmp")
    if model["compression"] == "xz":
        with lzma.open(joined, "rb") as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK)
        joined.unlink()
    else:
        os.replace(joined, tmp)
    if tmp.stat().st_size != model["size"] or sha256_file(tmp) != model["sha256"]:
        tmp.unlink()
        raise StageError(
            f"The reassembled {model['file']} does not match its checksum: pack again here and redo the calls."
        )
    os.replace(tmp, target)
    say(
        f"Reassembled {model['file']} ({mb(model['size'])}) from "
        f"{sum(f['kind'] == 'model' for f in manifest['files'])} parts; sha256 matches."
    )
    return target


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
