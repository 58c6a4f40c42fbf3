"""Does the server decode as fast as the code? ``/compare`` on a live ``python app.py`` against
``Playground.compare`` in this process, on the same prompts, one after the other, same model and settings.

    python -m medusa_lib.pipeline.server_check                          # 6 prompts x 3 repeats, 64 new tokens, greedy
    python -m medusa_lib.pipeline.server_check --prompts 8 --repeats 5 --max-new-tokens 96
    python -m medusa_lib.pipeline.server_check --class 30          # a class at once instead: class_check.py

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
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from tqdm import tqdm

from .live_server import machine, wait_until_up

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("plain", "medusa-greedy")


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
    ap.add_argument(
        "--class",
        dest="class_size",
        type=int,
        default=0,
        help="play a class of this many sessions at once instead (class_check.py): 2/3 click the page's examples",
    )
    ap.add_argument("--rounds", type=int, default=1, help="with --class: play it this many times (new own prompts)")
    ap.add_argument("--within", type=float, default=2.0, help="with --class: seconds in which all sessions start")
    ap.add_argument("--check-all", action="store_true", help="with --class: check every round against solo runs")
    ap.add_argument("--url", default=None, help="with --class: a server already running (else one is started)")
    ap.add_argument(
        "--watchers",
        type=int,
        default=0,
        help="with --class: also time one run alone against the same run with this many page sessions watching it",
    )
    args = ap.parse_args(argv)
    if args.class_size:
        if args.class_size < 2 or args.rounds < 1 or args.within < 0:
            sys.exit("error: --class must be at least 2, --rounds at least 1 and --within at least 0.")
        from .class_check import main as class_main

        class_main(args)
        return
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
