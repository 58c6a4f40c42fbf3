"""Does the first page wait for compiles? A live ``python app.py`` whose engine compiles its steps, started twice.

    python -m medusa_lib.pipeline.compile_check                       # a CPU: --cache static --capture compile
    python -m medusa_lib.pipeline.compile_check --app-args "--dtype bfloat16"   # a GPU: its default engine

Per start it prints: seconds until the page answers, until the first ``/compare`` (sent the moment the page
answers) comes back and how much of that the run itself took, until the compiled engine is swapped in, and the
second ``/compare``'s tokens against the first's (the same greedy request, run live both times). The second
start reads Inductor's cache on disk, so it shows what a restart costs. The machine is named.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
import urllib.request

from .live_server import machine, start_server, wait_until_up

PROMPT = "Explain in three sentences why the sky is blue."
# what app.py prints once the compiled engine runs (ui/background.py)
SWAPPED = "swapped in between runs"
COMPILING = "Compiling the "


def compare(url: str, *, max_new_tokens: int, timeout: float = 900) -> tuple[dict, float]:
    """One greedy /compare, run live (never answered from a recorded run); (its JSON, wall seconds)."""
    # prompt, max_new_tokens, temperature, epsilon, delta, tree, custom_tree, chat_template, lookup_branch,
    # sample, seed, numerics, drafter, run_live
    data = [PROMPT, max_new_tokens, 0.7, 0.09, 0.3, "", "", True, None, False, 0, "", "", True]
    t0 = time.perf_counter()
    req = urllib.request.Request(
        f"{url}gradio_api/call/compare",
        data=json.dumps({"data": data}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        event_id = json.load(resp)["event_id"]
    with urllib.request.urlopen(f"{url}gradio_api/call/compare/{event_id}", timeout=timeout) as resp:
        stream = resp.read().decode()
    out = None
    for line in stream.splitlines():
        if line.startswith("data: "):
            out = json.loads(line[6:])
    if not isinstance(out, list) or not isinstance(out[0], dict) or "methods" not in out[0]:
        raise SystemExit(f"error: /compare answered {str(out)[:300]}")
    return out[0], time.perf_counter() - t0


def own_seconds(answer: dict) -> float:
    """The seconds the run's columns took by their own records (prefill + decode of each)."""
    total = 0.0
    for m in answer["methods"].values():
        total += float(m.get("prefill_seconds") or 0) + float(m.get("decode_seconds") or 0)
    return total


def one_start(args, label: str) -> dict:
    heard: list[tuple[float, str]] = []
    server, _ = start_server(
        args.port, tuple(shlex.split(args.app_args)), heard=lambda t, line: heard.append((t, line))
    )
    url = f"http://127.0.0.1:{args.port}/"
    t0 = time.perf_counter()
    try:
        wait_until_up(url, server, args.timeout)
        page = time.perf_counter() - t0
        first, first_wall = compare(url, max_new_tokens=args.max_new_tokens)
        compiling_at_answer = not any(SWAPPED in line for _, line in heard)
        while not any(SWAPPED in line for _, line in heard):
            if server.poll() is not None or time.perf_counter() - t0 > args.timeout:
                raise SystemExit("error: the compiled engine was not swapped in; see the server's output.")
            time.sleep(0.5)
        swapped = next(t for t, line in heard if SWAPPED in line)
        second, _ = compare(url, max_new_tokens=args.max_new_tokens)
    finally:
        server.terminate()
        server.wait(timeout=30)
    ids = lambda a: {m: r["token_ids"] for m, r in a["methods"].items()}  # noqa: E731
    row = {
        "start": label,
        "page_s": round(page, 1),
        "first_run_wall_s": round(first_wall, 1),
        "first_run_own_s": round(own_seconds(first), 1),
        "compiling_when_answered": compiling_at_answer,
        "programs": sum(COMPILING in line for _, line in heard),
        "swapped_s": round(swapped, 1),
        "tokens_unchanged": ids(first) == ids(second),
        "greedy_match": bool(first["greedy_match"]["equal"] and second["greedy_match"]["equal"]),
    }
    for t, line in heard:
        if line.startswith(("Engine:", COMPILING, "  the ")):
            print(f"  {t:7.1f} s  {line.strip()}")
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app-args", default="--cache static --capture compile --dtype float32 --no-float32-copy")
    ap.add_argument("--port", type=int, default=7870)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    print(f"Machine: {machine()}; python app.py {args.app_args}")
    rows = [one_start(args, "first"), one_start(args, "second (Inductor's cache on disk)")]
    cols = list(rows[0])
    print("\n" + " | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))


if __name__ == "__main__":
    main()
