"""Does the server decode as fast as the code? ``/compare`` on a live ``python app.py`` against
``Playground.compare`` in this process, on the same prompts, one after the other, same model and settings.

    python -m medusa_lib.pipeline.server_check                          # 6 prompts x 3 repeats, 64 new tokens, greedy
    python -m medusa_lib.pipeline.server_check --prompts 8 --repeats 5 --max-new-tokens 96

Prints, per path, the median decode tokens/s of plain greedy and Medusa greedy and the median speed-up,
then the median per-prompt ratio server / in-process (1.00 = the same speed). The two paths never run at
once (the server idles while this process decodes); their order alternates between repeats. Both must
write the same tokens (float32, greedy): a difference is reported, not averaged. Run it on a quiet
machine: a figure taken beside other work is worthless. The server is started with this machine's
defaults (``MEDUSA_*`` variables apply to both) and stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("plain", "medusa-greedy")


def machine() -> str:
    """The CPU, the flags that decide bfloat16's speed, and torch's threads: every figure names its machine."""
    import torch

    name, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text()
        name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), name)
        flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    except OSError:
        pass
    have = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return (
        f"{name}, {os.cpu_count()} cores, flags: {' '.join(have) or 'unknown'}, torch threads {torch.get_num_threads()}"
    )


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


def rates(out: dict) -> dict:
    """The decode rates of one comparison, and what must be the same on both paths: tokens, tree, drafter."""
    return {m: out["methods"][m]["tokens_per_second"] for m in METHODS} | {
        "same": (
            [out["methods"][m]["token_ids"] for m in METHODS],
            [out["methods"][m]["steps"] for m in METHODS],
            out["tree"],
            out["drafter"],
            out["numerics"],
        )
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="The server's decode speed against the same code in-process.")
    ap.add_argument("--prompts", type=int, default=6, help="how many bench prompts (one per category first)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each prompt on each path (default 3)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=7871)
    args = ap.parse_args(argv)
    for name in ("prompts", "repeats", "max_new_tokens"):
        if getattr(args, name) < 1:
            sys.exit(f"error: --{name.replace('_', '-')} must be a whole number from 1 up (got {getattr(args, name)}).")
    from gradio_client import Client

    from ..present import Playground
    from .page_check import page_prompts

    prompts = [p for _, p in page_prompts(per_category=1, examples=None)][: args.prompts]
    url = f"http://127.0.0.1:{args.port}/"
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--port", str(args.port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        pg = Playground.load(progress=lambda *a: None)
        wait_until_up(url, server, 600)
        client = Client(url, verbose=False)
        # /compare's defaults, by name
        settings = pg.settings_of({"max_new_tokens": args.max_new_tokens})
        paths = {
            "server (/compare)": lambda p: client.predict(p, args.max_new_tokens, api_name="/compare"),
            "in-process (Playground.compare)": lambda p: pg.compare(p, settings),
        }
        # warm both: first runs pay for one-time work
        for call in paths.values():
            call(prompts[0])
        got: dict[str, list[dict]] = {name: [] for name in paths}
        order = list(paths)
        with tqdm(total=args.repeats * len(prompts) * 2, desc="comparing", unit="run") as bar:
            for r in range(args.repeats):
                for i, prompt in enumerate(prompts):
                    for name in order if (r + i) % 2 == 0 else order[::-1]:
                        got[name].append({"prompt": i} | rates(paths[name](prompt)))
                        bar.update()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    print(f"\nmachine: {machine()}")
    print(f"{len(prompts)} prompts x {args.repeats} repeats, {args.max_new_tokens} new tokens, greedy, page defaults\n")
    print(f"{'path':34} {'plain tok/s':>12} {'Medusa tok/s':>13} {'speed-up':>9}")
    for name, rows in got.items():
        plain = statistics.median(r["plain"] for r in rows)
        medusa = statistics.median(r["medusa-greedy"] for r in rows)
        up = statistics.median(r["medusa-greedy"] / r["plain"] for r in rows)
        print(f"{name:34} {plain:12.2f} {medusa:13.2f} {up:8.2f}x")
    server_rows, local_rows = got.values()
    for m in METHODS:
        ratio = statistics.median(
            statistics.median(s[m] for s in server_rows if s["prompt"] == i)
            / statistics.median(x[m] for x in local_rows if x["prompt"] == i)
            for i in range(len(prompts))
        )
        print(f"server / in-process, {m}: {ratio:.3f} (median over prompts of the median over repeats)")
    differ = {s["prompt"] for s, x in zip(server_rows, local_rows) if s["same"] != x["same"]}
    _, _, tree, drafter, numerics = server_rows[0]["same"]
    print(f"tree {tree}, drafter {drafter}, numerics {numerics}")
    print(
        "tokens, steps, tree, drafter and numerics: the same on both paths"
        if not differ
        else f"the two paths DIFFER (tokens, steps, tree, drafter or numerics) on prompts {sorted(differ)}"
    )


if __name__ == "__main__":
    main()
