"""A class on one server: what 30 students at once get from it (``server_check --class 30``).

    python -m medusa_lib.pipeline.server_check --class 30             # starts python app.py, plays one class
    python -m medusa_lib.pipeline.server_check --class 30 --rounds 7  # ~200 requests: the server's memory after each
    python -m medusa_lib.pipeline.server_check --class 30 --url http://127.0.0.1:7860/  # a server already running

The sessions all start within ``--within`` seconds (2), from this one address, each a browser session of its own
(a gradio_client, its own session hash) pressing the page's Run (its ``/run`` event, whose frames it reads as a
page does): two thirds click one of the page's examples at the page's starting values, the others send a prompt of
their own (the bench prompts). Per group it reports served, refused, errors, the wait until the first token shows
(p50 / p95 / max) and until the answer is complete, and how many answers were recorded, joined or run; then it runs
every prompt alone on the page (Run live, one at a time) and checks each answer against it: greedy float32 must
give the same text in every column. With ``--rounds`` it plays the class again with new prompts of their own and
prints the server's resident memory after each round (a server it started). The server it starts has this machine's
defaults (``MEDUSA_*`` variables apply) and records the examples in the background; the class starts once the
server says they are recorded.
"""

from __future__ import annotations

import html
import json
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from .jsonl import load_jsonl
from .live_server import machine, rss_mb, start_server, wait_until_up

ROOT = Path(__file__).resolve().parents[2]
INSPECT = "Medusa greedy / exact sampling"
COLUMNS = ("plain", "medusa-greedy", "medusa-typical")
# a token's span in a column (ui/render.py): its id in the title, its text (newlines included) inside
TOKEN = re.compile(r'<span class="tok[^"]*" title="[^"]*\(id (\d+)\)">(.*?)</span>', re.S)


def column_tokens(col_html: str) -> tuple[tuple[int, ...], str]:
    """What a method column shows: the ids of its tokens that have text, and that text, unescaped."""
    found = TOKEN.findall(str(col_html))
    return tuple(int(i) for i, _ in found), "".join(html.unescape(t) for _, t in found)


@dataclass
class Student:
    """One session: what it sent, when, and what it got."""

    group: str
    prompt: str
    sent: float = 0.0
    first_token: float | None = None
    done: float | None = None
    # per column: its token ids and text
    texts: tuple = ()
    how: str = "ran"
    failure: str = ""
    refused: bool = False
    errors: list = field(default_factory=list)


def page_inputs(defaults: dict, prompt: str) -> list:
    """The page's Run inputs (ui.handlers.PAGE_INPUTS) at its starting values, which are /compare's defaults."""
    d = defaults
    return [
        prompt,
        d["max_new_tokens"],
        d["temperature"],
        d["epsilon"],
        d["delta"],
        d["tree"],
        d["custom_tree"],
        d["chat_template"],
        d["lookup_branch"],
        d["seed"],
        d["numerics"],
        INSPECT,
        "greedy",
        d["drafter"],
        False,
    ]


def compare_defaults(client) -> dict:
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/compare"]["parameters"]
    return {p["parameter_name"]: p.get("parameter_default") for p in api}


def attend(student: Student, client, defaults: dict, t0: float) -> None:
    """Press Run and read the page's frames: the first one with a token, and the last one."""
    student.sent = time.perf_counter() - t0
    try:
        job = client.submit(*page_inputs(defaults, student.prompt), api_name="/run")
        last = None
        for frame in job:
            last = frame
            if student.first_token is None and any('class="tok' in str(c) for c in frame[1:4]):
                student.first_token = time.perf_counter() - t0 - student.sent
        final = job.result()
        student.done = time.perf_counter() - t0 - student.sent
        last = final if final is not None else last
        status = str(last[0])
        if not status.startswith("Done"):
            student.failure = status[:200]
            return
        student.how = "recorded" if "Computed " in status else "joined" if "Joined " in status else "ran"
        student.texts = tuple(column_tokens(c) for c in last[1:4])
    except Exception as e:
        text = str(e)
        student.refused = "busy" in text.lower() or "queue is full" in text.lower()
        student.failure = text[:200] or type(e).__name__


def play(url: str, prompts: list[tuple[str, str]], *, within: float) -> list[Student]:
    """Every (group, prompt) a session of its own, started evenly within ``within`` seconds; all answers."""
    from gradio_client import Client

    clients = [Client(url, verbose=False) for _ in tqdm(prompts, desc="opening sessions", unit="session")]
    defaults = compare_defaults(clients[0])
    students = [Student(group, prompt) for group, prompt in prompts]
    t0 = time.perf_counter()
    threads = []
    for i, (s, c) in enumerate(zip(students, clients)):
        time.sleep(max(0.0, t0 + i * within / max(len(students) - 1, 1) - time.perf_counter()))
        threads.append(threading.Thread(target=attend, args=(s, c, defaults, t0), daemon=True))
        threads[-1].start()
    for t in tqdm(threads, desc="answers", unit="session"):
        t.join()
    return students


def alone(url: str, prompts: list[str]) -> dict[str, tuple[tuple, float]]:
    """Each prompt run alone and afresh (Run live) on the page, one after another, as a student would see it: its
    three columns' tokens and texts, and the comparison's time until its last frame."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    defaults = compare_defaults(client)
    out = {}
    for prompt in tqdm(prompts, desc="each prompt alone", unit="run"):
        inputs = page_inputs(defaults, prompt)
        inputs[-1] = True
        t = time.perf_counter()
        final = client.submit(*inputs, api_name="/run").result()
        out[prompt] = (tuple(column_tokens(c) for c in final[1:4]), time.perf_counter() - t)
    return out


def watched(url: str, prompt: str, *, watchers: int, repeats: int = 3) -> None:
    """Is a shared run's timing still a solo measurement? The decode tokens/s of one prompt run afresh alone, and
    run afresh while ``watchers`` page sessions join it and render its frames, alternating, median of ``repeats``."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    sessions = [Client(url, verbose=False) for _ in range(watchers)]
    defaults = compare_defaults(client)
    got = {"alone": [], "watched": []}
    for _ in tqdm(range(repeats), desc=f"one run alone and with {watchers} watching", unit="pair"):
        out = client.predict(prompt, run_live=True, api_name="/compare")
        got["alone"].append([out["methods"][m]["tokens_per_second"] for m in COLUMNS[:2]])
        job = client.submit(prompt, run_live=True, api_name="/compare")
        time.sleep(0.3)
        joins = [c.submit(*page_inputs(defaults, prompt), api_name="/run") for c in sessions]
        out = job.result()
        shared = [str(j.result()[0]) for j in joins]
        got["watched"].append([out["methods"][m]["tokens_per_second"] for m in COLUMNS[:2]])
        joined = sum("Joined " in s for s in shared)
    alone = [statistics.median(r[i] for r in got["alone"]) for i in range(2)]
    seen = [statistics.median(r[i] for r in got["watched"]) for i in range(2)]
    print(
        f"\none run's decode tok/s, plain / Medusa greedy, median of {repeats}: alone {alone[0]:.1f} / {alone[1]:.1f}; "
        f"with {watchers} page sessions watching it ({joined} of them joined in the last pair) {seen[0]:.1f} / "
        f"{seen[1]:.1f} ({seen[0] / alone[0]:.3f} / {seen[1] / alone[1]:.3f} of alone)"
    )


def quantiles(xs: list[float]) -> str:
    if not xs:
        return f"{'-':>7} {'-':>7} {'-':>7}"
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, max(0, round(0.95 * len(xs)) - 1))]
    return f"{statistics.median(xs):7.2f} {p95:7.2f} {xs[-1]:7.2f}"


def report(students: list[Student]) -> None:
    print(
        f"\n{'group':10} {'sessions':>8} {'served':>6} {'refused':>7} {'errors':>6}  "
        f"{'first token (s): p50     p95     max':>36}  {'complete (s): p50     p95     max':>33}  "
        f"{'recorded':>8} {'joined':>6} {'ran':>4}"
    )
    for group in ("example", "own", "all"):
        rows = [s for s in students if group in ("all", s.group)]
        served = [s for s in rows if s.texts]
        print(
            f"{group:10} {len(rows):8d} {len(served):6d} {sum(s.refused for s in rows):7d} "
            f"{sum(bool(s.failure) and not s.refused for s in rows):6d}  {'':15}"
            f"{quantiles([s.first_token for s in served if s.first_token is not None])}  {'':12}"
            f"{quantiles([s.done for s in served])}  {sum(s.how == 'recorded' for s in served):8d} "
            f"{sum(s.how == 'joined' for s in served):6d} {sum(s.how == 'ran' for s in served):4d}"
        )
    for s in students:
        if s.failure:
            print(f"  {s.group} session sent at {s.sent:.2f} s: {s.failure}")


def run_class(args, url: str, server_pid: int | None, examples: list[str], bench: list[str]) -> None:
    size, n_examples = args.class_size, round(args.class_size * 2 / 3)
    rss, solo_times, mismatches, checked = [], [], [], 0
    own_used = 0
    for r in range(args.rounds):
        own = []
        for _ in range(size - n_examples):
            base = bench[own_used % len(bench)]
            own.append(base if own_used < len(bench) else f"(student {own_used}) {base}")
            own_used += 1
        # examples and own prompts interleaved, as a class clicks
        prompts, e = [], 0
        for i in range(size):
            if own and (i % 3 == 2 or e >= n_examples):
                prompts.append(("own", own.pop(0)))
            else:
                prompts.append(("example", examples[e % len(examples)]))
                e += 1
        t = time.perf_counter()
        students = play(url, prompts, within=args.within)
        print(f"\nround {r + 1} of {args.rounds}: {size} sessions in {time.perf_counter() - t:.1f} s")
        report(students)
        if r == 0 or args.check_all:
            solo = alone(url, sorted({s.prompt for s in students if s.texts}))
            solo_times += [secs for _, secs in solo.values()]
            for s in students:
                if s.texts:
                    checked += 1
                    if s.texts != solo[s.prompt][0]:
                        mismatches.append(s)
            last_own = max((s.sent + s.done for s in students if s.group == "own" and s.done), default=None)
            one = statistics.median(secs for _, secs in solo.values())
            if last_own is not None:
                print(
                    f"the last own prompt was complete {last_own:.1f} s after the first session started; one "
                    f"comparison alone on the page takes {one:.1f} s (median over these prompts), so the bound "
                    f"10 x {one:.1f} + 30 = {10 * one + 30:.1f} s is {'met' if last_own <= 10 * one + 30 else 'MISSED'}"
                )
        if server_pid is not None:
            rss.append(((r + 1) * size, rss_mb(server_pid)))
    if args.watchers:
        watched(url, examples[0], watchers=args.watchers)
    print(f"\nmachine: {machine()}")
    print(
        f"answers identical to the same prompt alone (every column's token ids and text, the page's numerics): "
        f"{checked - len(mismatches)}/{checked}"
    )
    for s in mismatches:
        print(f"  DIFFERS: {s.group} {s.prompt[:60]!r}")
    if rss:
        print("server memory (RSS): " + ", ".join(f"{mb:.0f} MB after {n} requests" for n, mb in rss if mb))
        if len(rss) > 1 and rss[0][1] and rss[-1][1]:
            print(f"growth from the first round to the last: {100 * (rss[-1][1] / rss[0][1] - 1):+.1f}%")


def main(args) -> None:
    """The class check (server_check's ``--class``): start a server (or use ``--url``), wait for its examples to
    be recorded, play the class ``--rounds`` times."""
    import os
    import signal

    examples = [e["prompt"] for e in json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))]
    bench = [p["prompt"] for p in load_jsonl(ROOT / "assets" / "data" / "bench_prompts.jsonl")]
    server = None
    url = args.url or f"http://127.0.0.1:{args.port}/"
    try:
        if args.url is None:
            server, recorded = start_server(args.port)
            t0 = time.perf_counter()
            wait_until_up(url, server, 600)
            print(f"server up in {time.perf_counter() - t0:.1f} s; waiting for its examples to be recorded ...")
            if not recorded.wait(900):
                sys.exit("error: the server did not say its examples were recorded within 900 s.")
            print(f"examples recorded {time.perf_counter() - t0:.1f} s after the start")
        run_class(args, url, server.pid if server else None, examples, bench)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
