"""The GPU check: take the copies, verify and reassemble the model, install the wheels, then run every
part (gpu_parts.py; gpu_run.py runs them), each under its own time limit, writing check.json and check.md
as it goes.

On the GPU machine, in the calls that ``gpu_pack`` prints (docs/gpu.md):
    python3 medusa_lib/pipeline/gpu_check.py --take .gpu/call-1                       # a copy: stage and check it
    PYTHONUNBUFFERED=1 python3 medusa_lib/pipeline/gpu_check.py --take .gpu/call-4 --out $OUT   # the last: run all
Here, the same parts on a CPU with a tiny budget (the slow tests run it):
    python medusa_lib/pipeline/gpu_check.py --stage /tmp/s --out /tmp/o --device cpu --tiny

--out gets check.json (every part with a status, rewritten after each), check.md and raw.tar.gz (each
part's log and JSON). One failing part never stops the others; the whole check keeps to --budget seconds.
Run as a file, before any wheel is installed: standard library only here; the parts run the pipeline CLIs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

try:
    from . import gpu_figures, gpu_parts, gpu_probe, gpu_run, gpu_stage
    from .gpu_run import say
except ImportError:
    # run as a file: its folder is on sys.path
    import gpu_figures
    import gpu_parts
    import gpu_probe
    import gpu_run
    import gpu_stage
    from gpu_run import say

ROOT = Path(__file__).resolve().parents[2]
# Seconds for all parts: one 600-s call keeps a minute for the copy, the reassembly and the install.
BUDGET = {"gpu": 540, "tiny": 1800}
INSTALL_LIMIT_S = 180


# ------------------------------------------------------------------------- the stage
def install_wheels(stage: Path, site: Path, manifest: dict) -> int:
    """Install the carried wheels into ``site`` (once per packing; the machine's own packages stay as they are)."""
    wheels = [stage / f["name"] for f in manifest["files"] if f["kind"] == "wheel"]
    marker = site / f".installed-{gpu_stage.manifest_id(manifest)}"
    if wheels and not marker.exists():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(site),
            *map(str, wheels),
        ]
        try:
            done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=INSTALL_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise gpu_stage.StageError(
                f"Installing the wheels took over {INSTALL_LIMIT_S} s; run the check again."
            ) from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise gpu_stage.StageError(
                f"pip could not install the carried wheels ({last[:200]}); pack again with other versions."
            )
        marker.touch()
    return len(wheels)


def prepare_stage(stage: Path, site: Path) -> str:
    """Verify every copy, reassemble the model into ``site`` and install the wheels there."""
    manifest = gpu_stage.load_manifest(stage)
    gpu_stage.reassemble(stage, manifest, site, say=say)
    n = install_wheels(stage, site, manifest)
    return f"model reassembled and verified, {n} wheel(s) installed into {site}"


def staging_call(stage: Path, device: str, *, try_env: bool = True) -> None:
    """A copy's own call: check what has arrived; once the wheels are all here, install them and try the
    environment (seconds), so a package that does not fit the machine shows before the last copies."""
    manifest = gpu_stage.load_manifest(stage)
    done = gpu_stage.calls_present(stage, manifest)
    gpu_stage.verify(stage, manifest, calls=done)
    nxt = (
        f"next: call {done + 1}"
        if done < manifest["calls"]
        else "all here: the last call runs the check with --out $OUT"
    )
    say(f"Calls 1-{done} of {manifest['calls']} are in {stage} and match their checksums; {nxt}.")
    wheels_here = all(f["call"] <= done for f in manifest["files"] if f["kind"] == "wheel")
    if try_env and wheels_here and not (stage / "env-tried").exists():
        install_wheels(stage, stage / "site", manifest)
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--probe", "env", "--device", device],
                check=False,
                env=gpu_run.part_env(stage),
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            fig = gpu_figures.probe_figures_text(done.stdout)
            say(
                f"env: {gpu_figures.env_words(fig)}"
                if done.returncode == 0
                else f"env failed: {gpu_figures.last_line(done.stdout + done.stderr)}"
            )
        except subprocess.TimeoutExpired:
            say("env: the probe took over 120 s (importing torch and transformers); the last call tries again.")
        (stage / "env-tried").touch()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--stage",
        default=gpu_stage.STAGE,
        help="where the copies gather (outlives a call while the machine stays warm)",
    )
    ap.add_argument("--take", default=None, help="first copy this call's folder (.gpu/call-N) into the stage")
    ap.add_argument(
        "--out",
        default=None,
        help="run the check, writing check.json, check.md and raw.tar.gz here; without it: stage only",
    )
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (the dry run)")
    ap.add_argument("--tiny", action="store_true", help="the dry run's sizes: one prompt, one repeat, a few tokens")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds for all parts (default {BUDGET['gpu']}; tiny {BUDGET['tiny']})",
    )
    ap.add_argument(
        "--only",
        default=None,
        help="comma list of the parts to run (env always runs): " + ",".join(p.name for p in gpu_parts.PARTS),
    )
    ap.add_argument("--skip", default="", help="comma list of parts not to run")
    ap.add_argument(
        "--limit",
        default="",
        help="comma list of NAME=SECONDS: a part's own limit for this call, e.g. --only eagle --limit eagle=500",
    )
    ap.add_argument(
        "--no-stage", action="store_true", help="use this environment as it is (a GPU box with `make setup`): no copies"
    )
    ap.add_argument(
        "--no-env", action="store_true", help="a copy's call: do not install the wheels and try the environment yet"
    )
    ap.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        return gpu_probe.probe(args.probe, args.device)
    stage = Path(args.stage)
    try:
        if args.take:
            say(gpu_stage.take(Path(args.take), stage))
        if args.out is None:
            return staging_call(stage, args.device, try_env=not args.no_env)
    except gpu_stage.StageError as e:
        if args.out is None:
            raise SystemExit(str(e)) from None
        say(str(e))
    args.budget = args.budget or BUDGET["tiny" if args.tiny else "gpu"]
    work = stage / "work" / time.strftime("run-%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    ctx = gpu_parts.Context(
        python=sys.executable,
        root=ROOT,
        work=work,
        device=args.device,
        tiny=args.tiny,
        check=str(Path(__file__).resolve()),
        out=Path(args.out),
    )
    check = gpu_run.Check(args, ctx, list(gpu_parts.PARTS))
    staged, note = True, "--no-stage: this environment as it is"
    if not args.no_stage:
        try:
            note = prepare_stage(stage, stage / "site")
        except gpu_stage.StageError as e:
            staged, note = False, str(e)
    say(f"stage: {note}")
    check.run(staged=staged, stage_note=note)


if __name__ == "__main__":
    main()
