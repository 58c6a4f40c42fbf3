"""The GPU check: take the copies, verify and reassemble the model, install the wheels, then run every
part (gpu_parts.py), each under its own time limit, writing check.json and check.md as it goes.

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
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

try:
    from . import gpu_figures, gpu_parts, gpu_stage
except ImportError:
    # run as a file: its folder is on sys.path
    import gpu_figures
    import gpu_parts
    import gpu_stage

ROOT = Path(__file__).resolve().parents[2]
# Seconds for all parts: one 600-s call keeps a minute for the copy, the reassembly and the install.
BUDGET = {"gpu": 540, "tiny": 1800}
# a part is not started with less time than this left
MIN_START_S = 15
INSTALL_LIMIT_S = 180


def say(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------- probes (run as parts)
PACKAGES = ("transformers", "tokenizers", "huggingface_hub", "safetensors", "gguf", "tqdm", "regex", "accelerate")


def probe(name: str, device: str) -> None:
    """Print one line of figures for the env and model parts (these import torch; the runner does not)."""
    t0 = time.perf_counter()
    here = str(Path(__file__).resolve().parent)
    # The pipeline's own file names (bench, export, ...) must not shadow packages.
    sys.path[:] = [p for p in sys.path if p != here]
    import importlib.metadata

    import torch

    if name == "env":
        import platform

        cuda = torch.cuda.is_available()
        fig = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
        fig |= {"gpu": torch.cuda.get_device_name(0) if cuda else None, "cpu_threads": torch.get_num_threads()}
        for mod in PACKAGES:
            try:
                # importable here, not only installed
                __import__(mod)
                fig[mod] = importlib.metadata.version(mod)
            except (ImportError, importlib.metadata.PackageNotFoundError) as e:
                fig[mod] = f"missing ({type(e).__name__}: {e})"
        found = sys.modules.get("transformers")
        fig["transformers_from"] = str(Path(found.__file__).parent) if found else None
        # what the parts import
        from medusa_lib.pipeline import bench, calibrate, page_check, profile_step  # noqa: F401

        fig |= {"methods": list(bench.ALL_METHODS), "gradio_imported": "gradio" in sys.modules}
        if device.startswith("cuda") and cuda:
            props = torch.cuda.get_device_properties(0)
            fig |= {"capability": f"{props.major}.{props.minor}", "memory_gib": round(props.total_memory / 2**30, 1)}
            fig["bf16"] = torch.cuda.is_bf16_supported()
        elif device.startswith("cuda"):
            print(gpu_figures.MARK + json.dumps(fig))
            raise SystemExit("CUDA was asked for but torch sees no GPU here.")
    elif name == "model":
        from medusa_lib.core.model import _default_cached_folder, default_gguf_path, load_model

        folder = _default_cached_folder()
        fig = {"gguf": str(default_gguf_path()), "folder": str(folder)}
        fig["source"] = "cached" if (folder / "config.json").exists() else "converted"
        load_model(
            "default", device="cpu", dtype="float32", allow_remote=False, prepack=False, packed_gqa=False, progress=say
        )
        fig["cache_bytes"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    else:
        raise SystemExit(f"Unknown probe {name!r}.")
    fig["seconds"] = round(time.perf_counter() - t0, 2)
    print(gpu_figures.MARK + json.dumps(fig))


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


def part_env(stage: Path | None) -> dict:
    """The parts' environment: offline; the carried packages and the reassembled model first, then the machine's."""
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false"
    )
    site = [str(stage / "site")] if stage else []
    env["PYTHONPATH"] = os.pathsep.join(site + [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if stage:
        env["MEDUSA_PLAYGROUND_CACHE"] = str(stage / "cache")
    return env


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
                env=part_env(stage),
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


# ------------------------------------------------------------------------- running parts
def stop_group(proc: subprocess.Popen) -> None:
    """End a job's whole process group (a job runs in its own session: only what it started)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def run_jobs(jobs: list, *, env: dict, timeout: float, cwd: Path) -> list[tuple[int | None, float]]:
    """Run the jobs side by side; stop every one still running at ``timeout``. Return each one's exit
    code (None: stopped at the limit) and seconds."""
    procs, t0 = [], time.monotonic()
    for job in jobs:
        job.log.parent.mkdir(parents=True, exist_ok=True)
        with open(job.log, "w") as log:
            out = {"stdout": log, "stderr": subprocess.STDOUT}
            procs.append(subprocess.Popen(job.argv, cwd=cwd, env=env | job.env, start_new_session=True, **out))
    ended: list[float | None] = [None] * len(procs)
    while None in ended and time.monotonic() < t0 + timeout:
        for i, p in enumerate(procs):
            if ended[i] is None and p.poll() is not None:
                ended[i] = time.monotonic() - t0
                # what it left running (compile workers), if anything
                stop_group(p)
        time.sleep(0.2)
    for i, p in enumerate(procs):
        if ended[i] is None:
            stop_group(p)
    return [
        (p.returncode if e is not None else None, round(e if e is not None else timeout, 1))
        for p, e in zip(procs, ended)
    ]


def log_tail(job) -> str:
    return gpu_figures.last_line(job.log.read_text(errors="replace")) if job.log.exists() else "no output"


def part_limits(text: str, names: list[str]) -> dict[str, float]:
    """``--limit eagle=500,calibrate=300`` -> {part: seconds}, the parts' own limits for this call (the
    check's --budget still bounds them all); a name or a number it cannot use stops the call, said once."""
    limits = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, secs = item.partition("=")
        if name not in names:
            raise SystemExit(f"--limit names a part this check does not have: {name!r} (parts: {', '.join(names)}).")
        try:
            limits[name] = float(secs)
        except ValueError:
            limits[name] = -1.0
        if not limits[name] > 0:
            raise SystemExit(f"--limit {item!r}: give the part's seconds as a positive number, e.g. {name}=500.")
    return limits


class Check:
    """One run of the check: the parts' results, written to --out after each part."""

    def __init__(self, args, ctx: gpu_parts.Context, parts: list):
        self.args, self.ctx, self.parts, self.t0 = args, ctx, parts, time.monotonic()
        self.limits = part_limits(getattr(args, "limit", "") or "", [p.name for p in parts])
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = self.t0 + args.budget
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
        ).stdout.strip()
        self.data = {
            "device": ctx.device,
            "plan": "tiny" if ctx.tiny else "gpu",
            "budget_s": args.budget,
            "commit": commit or None,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "elapsed_s": 0.0,
            "finished": False,
            "parts": {
                "stage": {"status": "pending", "title": "take, verify and reassemble the copies; install the wheels"}
            },
        }
        for p in parts:
            self.data["parts"][p.name] = {"status": "pending", "title": p.title}

    def record(self, name: str, **fields) -> None:
        self.data["parts"][name].update(fields)
        self.data["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.write()

    def write(self) -> None:
        for name, text in (("check.json", json.dumps(self.data, indent=1, default=str)), ("check.md", self.markdown())):
            tmp = self.out / (name + ".tmp")
            tmp.write_text(text + "\n")
            os.replace(tmp, self.out / name)
        tmp = self.out / "raw.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for p in sorted(self.ctx.work.rglob("*")):
                if p.is_file() and p.suffix in (".log", ".json", ".jsonl", ".md") and p.stat().st_size < 2**21:
                    tar.add(p, arcname=str(p.relative_to(self.ctx.work.parent)))
        os.replace(tmp, self.out / "raw.tar.gz")

    def markdown(self) -> str:
        d = self.data
        env = d["parts"].get("env", {}).get("figures") or {}
        head = (
            f"# GPU check: {env.get('gpu') or d['device']}, torch {env.get('torch', '?')}, "
            f"CUDA {env.get('cuda', '?')}, transformers {env.get('transformers', '?')} "
            f"(commit {d['commit']}, {d['plan']} plan, {d['elapsed_s']} s of {d['budget_s']})"
        )
        lines = [head, "", "| part | status | seconds (limit) | figures |", "|---|---|---|---|"]
        words = {p.name: p.words for p in self.parts}
        for name, r in d["parts"].items():
            if r["status"] in ("ok", "timeout") and "figures" in r and name in words:
                try:
                    said = words[name](r["figures"])
                except Exception as e:  # noqa: BLE001
                    # a reader's gap must not lose the table
                    said = f"figures not readable ({type(e).__name__}: {e})"
                said = f"{r['note']}; {said}" if r["status"] == "timeout" else said
            else:
                said = r.get("note") or r.get("title", "")
            secs = f"{r['seconds']:.1f} ({r.get('limit_s', '-')})" if "seconds" in r else "-"
            lines.append(f"| {name} | {r['status']} | {secs} | {said.replace('|', '/')} |")
        lines += [
            "",
            (
                "Figures a part did not produce are not measured. "
                "Commands, logs and each part's JSON: check.json and raw.tar.gz."
            ),
        ]
        return "\n".join(lines)

    def run_group(self, group: list, env: dict) -> None:
        left = self.deadline - time.monotonic()
        own = max(self.limits.get(p.name, p.tiny_limit_s if self.ctx.tiny else p.limit_s) for p in group)
        limit = min(own, left)
        if left < min(own, MIN_START_S):
            for p in group:
                self.record(
                    p.name,
                    status="skipped",
                    note=f"not started: {left:.0f} s of the check's budget left (run it alone with --only {p.name})",
                )
            return
        jobs, spans = [], []
        self.ctx.limit_s = limit
        for p in group:
            try:
                mine = p.jobs(self.ctx)
            except Exception as e:  # noqa: BLE001
                # a part that cannot even be set up fails alone
                self.record(p.name, status="failed", note=f"could not set up: {type(e).__name__}: {e}")
                continue
            spans.append((p, len(jobs), len(jobs) + len(mine)))
            jobs += mine
            self.record(
                p.name, status="running", limit_s=round(limit), commands=[" ".join(map(str, j.argv)) for j in mine]
            )
        say(
            f"[{time.monotonic() - self.t0:6.1f} s] "
            + ", ".join(p.name for p, _, _ in spans)
            + f" (limit {limit:.0f} s)"
        )
        results = run_jobs(jobs, env=env, timeout=limit, cwd=self.ctx.root)
        for p, a, b in spans:
            mine, rc = jobs[a:b], [code for code, _ in results[a:b]]
            seconds = max(secs for _, secs in results[a:b])
            status = "timeout" if None in rc else ("ok" if all(c == 0 for c in rc) else "failed")
            fields = {"status": status, "seconds": seconds, "exit_codes": rc}
            if status == "failed":
                fields["note"] = "; ".join(f"exit {c}: {log_tail(j)}" for j, c in zip(mine, rc) if c)
            elif status == "timeout":
                fields["note"] = f"stopped at its {limit:.0f}-s limit"
            try:
                fields["figures"] = p.read(self.ctx, mine)
                self.ctx.results[p.name] = fields["figures"]
            except Exception as e:  # noqa: BLE001
                # nothing readable: the status and the log say why
                if status == "ok":
                    fields |= {"status": "failed", "note": f"its output could not be read ({type(e).__name__}: {e})"}
            self.record(p.name, **fields)
            said = p.words(fields["figures"]) if "figures" in fields and status != "failed" else fields.get("note", "")
            say(f"    {p.name}: {fields['status']} in {seconds} s: {said[:400]}")

    def run(self, *, staged: bool, stage_note: str) -> None:
        self.record(
            "stage", status="ok" if staged else "failed", note=stage_note, seconds=round(time.monotonic() - self.t0, 1)
        )
        env = part_env(None if self.args.no_stage else Path(self.args.stage))
        # env always runs: seconds, and the later parts read the bench's method list from it
        only = {"env", *filter(None, self.args.only.split(","))} if self.args.only else None
        skip = set(filter(None, self.args.skip.split(",")))
        runnable = []
        for p in self.parts:
            if (only is not None and p.name not in only) or p.name in skip:
                self.record(p.name, status="skipped", note="not asked for (--only/--skip)")
            elif p.needs_model and not staged:
                self.record(p.name, status="skipped", note="the stage failed (see stage)")
            else:
                runnable.append(p)
        i = 0
        # side parts next to each other run together
        while i < len(runnable):
            group = [runnable[i]]
            while runnable[i].side and i + 1 < len(runnable) and runnable[i + 1].side:
                i += 1
                group.append(runnable[i])
            self.run_group(group, env)
            i += 1
        self.data["finished"] = True
        self.record("stage")
        say("\n" + self.markdown())


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
        return probe(args.probe, args.device)
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
    check = Check(args, ctx, list(gpu_parts.PARTS))
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
