"""Running the GPU check's parts: side by side where they may, each under its own time limit, recorded as they end.

``Check`` runs the parts (gpu_parts.py) in order within the check's --budget, side parts next to
each other together, each job in its own process group, stopped whole at its limit; after each part
it rewrites check.json, check.md and raw.tar.gz (each part's log and JSON), so one failing part
never stops the others and a cut call still leaves its figures. The parts run offline, with the
carried packages and the reassembled model first (``part_env``). Standard library only, like the
check that imports it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

try:
    from . import gpu_figures, gpu_parts
except ImportError:
    # run as a file: its folder is on sys.path
    import gpu_figures
    import gpu_parts

ROOT = Path(__file__).resolve().parents[2]
# a part is not started with less time than this left
MIN_START_S = 15


def say(msg: str) -> None:
    print(msg, flush=True)


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
