"""A server under load: outputs, memory, the last of a full queue, and a device freed by a cancel or a disconnect.

    python -m medusa_lib.pipeline.load_check                  # starts python app.py (this machine's defaults)
    python -m medusa_lib.pipeline.load_check --runs 30,100,300 --users 6 --queue 40

Every call is a raw ``/compare`` (greedy, float32, run live: never answered from another run's records), each
user a session of its own, from this one address. It measures:

1. **Concurrent outputs.** For every drafter the server offers, ``--users`` prompts run alone, one after
   another, then all at once: each user's token ids, column by column, against its solo run.
2. **Memory.** The server's resident memory after ``--runs`` runs (short ones, prompts in turn), and its growth
   from the first mark to the last.
3. **The last of a full queue.** ``--queue`` sessions send at once (40: the most one address may have waiting by
   default): how long the last one waited for its answer, and how many were refused.
4. **A device freed.** A long run whose caller disconnects (its socket closed), or cancels (gradio_client's
   ``job.cancel()``), with a short run queued behind it: the seconds until the short one is answered, against
   the same short run alone.

The machine is named with the figures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import threading
import time
import urllib.parse
from pathlib import Path

from tqdm import tqdm

from .jsonl import load_jsonl
from .live_server import machine, rss_mb, start_server, wait_until_up

BENCH = Path(__file__).resolve().parents[2] / "assets" / "data" / "bench_prompts.jsonl"


def compare_data(prompt: str, *, drafter: str = "", max_new_tokens: int = 16) -> list:
    # prompt, max_new_tokens, temperature, epsilon, delta, tree, custom_tree, chat_template, lookup_branch,
    # sample, seed, numerics, drafter, run_live
    return [prompt, max_new_tokens, 0.7, 0.09, 0.3, "", "", True, None, False, 0, "float32", drafter, True]


def call(url: str, data: list, session: str, *, timeout: float = 900) -> tuple[int, dict | str, float]:
    """One /compare call in ``session``: (HTTP status of the post, the answer's JSON or the refusal, seconds)."""
    t0 = time.perf_counter()
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    body = json.dumps({"data": data, "session_hash": session})
    conn.request("POST", "/gradio_api/call/compare", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode()
    if resp.status != 200:
        return resp.status, text, time.perf_counter() - t0
    event_id = json.loads(text)["event_id"]
    conn.request("GET", f"/gradio_api/call/compare/{event_id}")
    stream = conn.getresponse().read().decode()
    conn.close()
    out = None
    for line in stream.splitlines():
        if line.startswith("data: "):
            out = json.loads(line[6:])
    answer = out[0] if isinstance(out, list) and out and isinstance(out[0], dict) else str(out)
    return 200, answer, time.perf_counter() - t0


def ids(answer) -> dict | None:
    return {m: r["token_ids"] for m, r in answer["methods"].items()} if isinstance(answer, dict) else None


def at_once(url: str, datas: list[list], tag: str) -> list[tuple[int, dict | str, float]]:
    """Every call of ``datas`` sent at once, each in a session of its own."""
    out: list = [None] * len(datas)

    def one(i: int) -> None:
        out[i] = call(url, datas[i], f"{tag}-{i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(datas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def concurrent_outputs(url: str, drafters: list[str], prompts: list[str]) -> None:
    print(f"\n1. {len(prompts)} users at once against their solo runs (greedy, float32, every column's token ids)")
    for drafter in drafters:
        datas = [compare_data(p, drafter=drafter) for p in prompts]
        solo = [call(url, d, f"solo-{drafter}-{i}") for i, d in enumerate(datas)]
        together = at_once(url, datas, f"together-{drafter}")
        same = sum(ids(a[1]) is not None and ids(a[1]) == ids(b[1]) for a, b in zip(solo, together))
        errors = [b[1] for b in together if ids(b[1]) is None]
        print(
            f"   {drafter:<8} {same}/{len(prompts)} identical to solo; solo {sum(s[2] for s in solo):.1f} s one after "
            f"another, together {max(t[2] for t in together):.1f} s" + (f"; errors: {errors[:2]}" if errors else "")
        )


def memory(url: str, pid: int, marks: list[int], prompts: list[str]) -> None:
    print(f"\n2. Resident memory after {', '.join(map(str, marks))} runs (16 new tokens each, prompts in turn)")
    seen = {}
    for n in tqdm(range(1, max(marks) + 1), desc="runs"):
        call(url, compare_data(prompts[n % len(prompts)] + f" ({n})"), "memory")
        if n in marks:
            seen[n] = rss_mb(pid)
    for n, mb in seen.items():
        print(f"   after {n:>4} runs: {mb:,.0f} MB")
    first, last = seen[min(seen)], seen[max(seen)]
    print(f"   growth from {min(seen)} to {max(seen)} runs: {100 * (last / first - 1):+.1f}%")


def full_queue(url: str, n: int, prompts: list[str]) -> None:
    print(f"\n3. {n} sessions at once (the most one address may have waiting)")
    datas = [compare_data(prompts[i % len(prompts)] + f" [{i}]", max_new_tokens=16) for i in range(n)]
    out = at_once(url, datas, "queue")
    served = sorted(o[2] for o in out if o[0] == 200 and isinstance(o[1], dict))
    refused = [o for o in out if o[0] != 200]
    print(
        f"   served {len(served)}, refused {len(refused)}; waits p50 {statistics.median(served):.1f} s, "
        f"the last {served[-1]:.1f} s; one run alone took {served[0]:.1f} s"
    )
    if refused:
        print(f"   a refusal: {refused[0][1][:200]}")


def freed(url: str, prompts: list[str]) -> None:
    print("\n4. A long run left by its caller, a short run queued behind it")
    short = compare_data(prompts[0], max_new_tokens=8)
    alone = statistics.median(call(url, short, "short-alone")[2] for _ in range(3))
    long = compare_data(prompts[1], max_new_tokens=512)
    # a disconnect: the long call's stream opened, then its socket shut (a browser tab closed)
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request(
        "POST",
        "/gradio_api/call/compare",
        json.dumps({"data": long, "session_hash": "leaver"}),
        {"Content-Type": "application/json"},
    )
    event_id = json.loads(conn.getresponse().read().decode())["event_id"]
    conn.close()
    stream = socket.create_connection((u.hostname, u.port))
    stream.sendall(f"GET /gradio_api/call/compare/{event_id} HTTP/1.1\r\nHost: {u.hostname}\r\n\r\n".encode())
    time.sleep(2.0)
    queued: list = []
    t = threading.Thread(target=lambda: queued.append(call(url, short, "behind-leaver")))
    t.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    stream.shutdown(socket.SHUT_RDWR)
    stream.close()
    t.join()
    print(
        f"   disconnect: the short run answered {time.perf_counter() - t0:.1f} s after the socket closed "
        f"(alone: {alone:.1f} s)"
    )
    # a cancel
    from gradio_client import Client

    client = Client(url, verbose=False)
    job = client.submit(*long, api_name="/compare")
    time.sleep(2.0)
    queued.clear()
    t = threading.Thread(target=lambda: queued.append(call(url, short, "behind-canceller")))
    t.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    job.cancel()
    t.join()
    print(
        f"   cancel: the short run answered {time.perf_counter() - t0:.1f} s after job.cancel() (alone: {alone:.1f} s)"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=7875)
    ap.add_argument("--users", type=int, default=6)
    ap.add_argument("--runs", default="30,100,300", help="the memory marks, in runs")
    ap.add_argument("--queue", type=int, default=40)
    ap.add_argument("--drafters", default="medusa,eagle,lookup,rest")
    ap.add_argument("--parts", default="outputs,memory,queue,freed")
    args = ap.parse_args(argv)
    prompts = [r["prompt"] for r in load_jsonl(BENCH)][:12]
    server, _ = start_server(args.port, ("--machine-fit", "off"))
    url = f"http://127.0.0.1:{args.port}/"
    try:
        wait_until_up(url, server, 300)
        print(f"Machine: {machine()}; python app.py (this machine's defaults, --machine-fit off)")
        parts = args.parts.split(",")
        if "outputs" in parts:
            concurrent_outputs(url, args.drafters.split(","), prompts[: args.users])
        if "memory" in parts:
            memory(url, server.pid, [int(x) for x in args.runs.split(",")], prompts)
        if "queue" in parts:
            full_queue(url, args.queue, prompts)
        if "freed" in parts:
            freed(url, prompts)
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
