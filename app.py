"""Medusa Playground: plain vs Medusa greedy vs Medusa typical decoding, side by side.

    python app.py                       # http://127.0.0.1:7860, SmolLM2-135M-Instruct + the embedded heads
    python app.py --device cuda --heads path/to/heads --host 0.0.0.0

The server offers only the model and heads it was started with: neither the page nor the API can
load another. Model code from the Hub runs only with --trust-remote-code.

Every flag has an environment override (a Hugging Face Space sets them in its settings); a bad flag or
override gets one sentence naming it, before the model loads where it can be checked without it.
Paper: Cai et al., "Medusa", ICML 2024, arXiv 2401.10774.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def env_number(
    name: str,
    default: str,
    *,
    low: float,
    high: float | None = None,
    whole: bool = True,
    also: tuple[str, ...] = ("auto",),
):
    """An environment override read as a number (or one of ``also``), or exit with one sentence naming the variable."""
    raw = os.environ.get(name, default).strip()
    if raw in also:
        return raw
    try:
        value = int(raw) if whole else float(raw)
        # inf: no bound at all
        if not (math.isfinite(value) and low <= value and (high is None or value <= high)):
            raise ValueError
    except ValueError:
        rule = (
            f"a whole number from {low:g}" + (f" to {high:g}" if high is not None else " up")
            if whole
            else f"a finite number of at least {low:g}" + (f" and at most {high:g}" if high is not None else "")
        )
        sys.exit(
            f"error: {name}={raw!r} is not {rule}{' (or ' + ' or '.join(also) + ')' if also else ''}; "
            "fix it or unset it."
        )
    return value


def env_switch(name: str, default: str = "0") -> bool:
    """An on/off override: 1 or 0 (unset: ``default``, off), or exit with one sentence naming the variable."""
    raw = os.environ.get(name, default).strip()
    if raw not in ("0", "1", ""):
        sys.exit(f"error: {name}={raw!r} must be 1 (on) or 0 (off); fix it or unset it.")
    return raw == "1"


# Spaces sets GRADIO_SERVER_NAME=0.0.0.0
HOST = os.environ.get("MEDUSA_HOST", os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
# named in the sentence of a bad port
PORT_ENV = "MEDUSA_PORT" if "MEDUSA_PORT" in os.environ else "GRADIO_SERVER_PORT"
PORT = env_number(PORT_ENV, "7860", low=1, high=65535, also=())
# "default" = SmolLM2-135M-Instruct, offline; or a folder / Hub id
MODEL = os.environ.get("MEDUSA_MODEL", "default")
# auto = the embedded heads (assets/heads/smollm2-135m-instruct) for the default model, untrained heads for another
HEADS = os.environ.get("MEDUSA_HEADS", "auto")
# auto = cuda if present, else cpu
DEVICE = os.environ.get("MEDUSA_DEVICE", "auto")
# auto = the fastest that works: bf16 on GPUs and on CPUs with native bf16, else float32
DTYPE = os.environ.get("MEDUSA_DTYPE", "auto")
# auto = static on a GPU, dynamic on a CPU (medusa_lib.core.kv.default_engine)
CACHE = os.environ.get("MEDUSA_CACHE", "auto")
CACHE_CHOICES = ("auto", "dynamic", "static")
# auto = CUDA graphs with the static cache on a GPU, none on a CPU
CAPTURE = os.environ.get("MEDUSA_CAPTURE", "auto")
CAPTURE_CHOICES = ("auto", "none", "compile", "cuda-graph")
# auto = choose the tree, lookup length and EAGLE node budget from this machine's measured costs at the first start,
# cached per machine; again = measure anew; off = the shipped calibrations' choices (medusa_lib.present.fit)
MACHINE_FIT = os.environ.get("MEDUSA_MACHINE_FIT", "auto")
MACHINE_FIT_CHOICES = ("auto", "again", "off")
SHARE = env_switch("MEDUSA_SHARE")
# Run a Hub model's own Python code: the operator's call, never the page's.
TRUST_REMOTE_CODE = env_switch("MEDUSA_TRUST_REMOTE_CODE")
# The defaults below are medusa_lib.present.settings' (a test checks they agree; spelled out so --help
# needs neither gradio nor the page's modules; the drafters' flags come from the core's registry).
# Longer prompts are refused before tokenising.
MAX_PROMPT_CHARS = env_number("MEDUSA_MAX_PROMPT_CHARS", "32000", low=1, also=())
# auto = a fixed figure per kind of device: 2,048 on a CPU, the context on a GPU
MAX_PROMPT_TOKENS = env_number("MEDUSA_MAX_PROMPT_TOKENS", "auto", low=1)
# The slider's starting value and /compare's default.
MAX_NEW_TOKENS = env_number("MEDUSA_MAX_NEW_TOKENS", "96", low=1, also=())
# The slider's and the API's maximum.
MAX_NEW_TOKENS_LIMIT = env_number("MEDUSA_MAX_NEW_TOKENS_LIMIT", "512", low=1, also=())
# Wall time one API call may take: ends a run whose client left unseen.
MAX_RUN_SECONDS = env_number("MEDUSA_MAX_RUN_SECONDS", "180", low=1, whole=False, also=())
# Calls that may wait for the device at once, of them from one user (a browser session) and from one network
# address (a class behind one school network): past any, "busy, try again".
MAX_QUEUE = env_number("MEDUSA_MAX_QUEUE", "64", low=1, also=())
MAX_QUEUE_PER_CLIENT = env_number("MEDUSA_MAX_QUEUE_PER_CLIENT", "4", low=1, also=())
MAX_QUEUE_PER_ADDRESS = env_number("MEDUSA_MAX_QUEUE_PER_ADDRESS", "40", low=1, also=())
# Identical requests are computed once: finished runs kept to answer them (the least recently used goes first when
# either bound is reached), and whether the page's examples are recorded in the background after start-up.
SHARED_RESULTS = env_number("MEDUSA_SHARED_RESULTS", "64", low=0, also=())
SHARED_MB = env_number("MEDUSA_SHARED_MB", "256", low=0, whole=False, also=())
RECORD_EXAMPLES = env_switch("MEDUSA_RECORD_EXAMPLES", "1")
# The proxies in front of the server (a Space's, a school's), comma-separated addresses or networks: only the entry
# such a proxy appends to X-Forwarded-For names a caller's address. Empty: the header is ignored.
TRUSTED_PROXIES = os.environ.get("MEDUSA_TRUSTED_PROXIES", "")
EXAMPLES = ROOT / "assets" / "examples.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Medusa Playground: plain vs Medusa decoding, side by side, in the browser."
    )
    ap.add_argument(
        "--host", default=HOST, help=f"interface to listen on (default {HOST}; 0.0.0.0 to serve the network)"
    )
    ap.add_argument("--port", type=int, default=PORT, help=f"port (default {PORT})")
    ap.add_argument(
        "--model", default=MODEL, help="'default' (SmolLM2-135M-Instruct, offline), a local folder or a Hub id"
    )
    ap.add_argument(
        "--heads",
        default=HEADS,
        help="Medusa heads folder or Hub id (default auto: the embedded heads for the default model, untrained "
        "heads for another or if the embedded ones are missing)",
    )
    from medusa_lib.core.drafters import REGISTRY

    # a drafter the operator may point somewhere (its folder, "auto" or "none"): --<name>, MEDUSA_<NAME>
    for name, drafter in REGISTRY.items():
        if drafter.option:
            ap.add_argument(f"--{name}", default=os.environ.get(f"MEDUSA_{name.upper()}", "auto"), help=drafter.option)
    ap.add_argument("--device", default=DEVICE, help="auto, cpu, cuda, cuda:1 ... (default auto)")
    ap.add_argument("--dtype", default=DTYPE, help="auto, float32, bfloat16 or float16 (default auto)")
    ap.add_argument(
        "--no-float32-copy",
        dest="float32_copy",
        action="store_false",
        help="with a 16-bit --dtype, do not also load a float32 copy for the page's exact Numerics choice (on when "
        "memory allows)",
    )
    ap.add_argument(
        "--cache",
        default=CACHE,
        choices=CACHE_CHOICES,
        help="KV cache of every run: static = fixed-shape steps over a StaticCache (default auto: static on a GPU, "
        "dynamic on a CPU)",
    )
    ap.add_argument(
        "--capture",
        default=CAPTURE,
        choices=CAPTURE_CHOICES,
        help="with --cache static, capture the fixed-shape steps at load (default auto: compile on a GPU, each step "
        "compiled by Inductor and recorded as one CUDA graph; cuda-graph records the eager kernels; none on a CPU)",
    )
    ap.add_argument(
        "--machine-fit",
        default=MACHINE_FIT,
        choices=MACHINE_FIT_CHOICES,
        help="auto (default): at the first start on a machine, time each shipped tree and EAGLE node budget here "
        "(seconds) and run the fastest; later starts read the choice from the user cache; again: time anew; off: "
        "the shipped calibrations' choices",
    )
    ap.add_argument(
        "--share", action="store_true", default=SHARE, help="also open a public gradio.live link (off by default)"
    )
    ap.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=TRUST_REMOTE_CODE,
        help="let a Hub model run its own Python code (off by default; only for models you trust)",
    )
    return ap.parse_args(argv)


def flag(name: str, env: str, argv: list[str] | None) -> str:
    """How the operator set a value: the flag when it is on the command line, else its environment variable."""
    given = sys.argv[1:] if argv is None else argv
    return name if any(a == name or a.startswith(name + "=") for a in given) else env


def check_serving(args: argparse.Namespace, argv: list[str] | None) -> None:
    """Refuse, before the model loads, what would fail only once it has: a port out of range, a host
    that is not this machine's, a port in use, a capture the device cannot run. One sentence each."""
    import errno
    import socket

    port, host = (
        flag("--port", PORT_ENV, argv),
        flag("--host", "MEDUSA_HOST" if "MEDUSA_HOST" in os.environ else "GRADIO_SERVER_NAME", argv),
    )
    if not 1 <= args.port <= 65535:
        sys.exit(f"error: {port} must be a port from 1 to 65535 (got {args.port}).")
    try:
        family = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError):
        sys.exit(
            f"error: {host} {args.host!r} is not a name or address this machine can resolve; use 127.0.0.1, "
            "or 0.0.0.0 to serve the network."
        )
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # as the server will: a port in TIME_WAIT is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((args.host, args.port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                sys.exit(
                    f"error: {port} {args.port} is in use on {args.host}; stop what serves there or pick another "
                    f"{port}."
                )
            if e.errno == errno.EADDRNOTAVAIL:
                sys.exit(
                    f"error: {host} {args.host!r} is not an address of this machine; use 127.0.0.1, "
                    "or 0.0.0.0 to serve the network."
                )
            if e.errno == errno.EACCES:
                sys.exit(
                    f"error: {port} {args.port} needs administrator rights on this machine; pick a port above 1023."
                )
            sys.exit(
                f"error: cannot serve on {args.host}:{args.port} ({e.strerror or type(e).__name__}); "
                f"pick another {port} or {host}."
            )
    for name, choices in (("cache", CACHE_CHOICES), ("capture", CAPTURE_CHOICES), ("machine_fit", MACHINE_FIT_CHOICES)):
        value, option = getattr(args, name), "--" + name.replace("_", "-")
        # argparse checks the flag's value, not its environment override's
        if value not in choices:
            sys.exit(
                f"error: {flag(option, 'MEDUSA_' + name.upper(), argv)}={value!r} must be one of "
                f"{', '.join(choices)}; fix it or unset it."
            )
    from medusa_lib.core.device import resolve_device, resolve_dtype
    from medusa_lib.core.engine import resolve_engine

    # a value from the environment: say which variable
    def named(e: ValueError, name: str) -> str:
        who = flag("--" + name, "MEDUSA_" + name.upper(), argv)
        return f"error: {e}" if who.startswith("--") else f"error: {who}={getattr(args, name)!r}: {e}"

    try:
        device = resolve_device(args.device)
    except ValueError as e:
        # ModelError
        sys.exit(named(e, "device"))
    try:
        resolve_dtype(args.dtype, device)
    except ValueError as e:
        sys.exit(named(e, "dtype"))
    try:
        resolve_engine(device, cache=args.cache, capture=args.capture)
    except ValueError as e:
        # EngineError (--cache/--capture)
        sys.exit(f"error: {e}")
    from medusa_lib.present.drafter_files import check_options
    from medusa_lib.present.startup import heads_folder

    try:
        # a named drafter folder that holds no drafter: before the model loads
        check_options(drafter_options(args), folder=heads_folder(args.heads, model=args.model))
    except ValueError as e:
        sys.exit(f"error: {as_set(e, argv)}")


def drafter_options(args: argparse.Namespace) -> dict:
    """What the operator named for each drafter that takes an option (its ``--<name>`` flag)."""
    from medusa_lib.core.drafters import REGISTRY

    return {name: getattr(args, name) for name, drafter in REGISTRY.items() if drafter.option}


def as_set(error: Exception, argv: list[str] | None) -> str:
    """An error's sentence naming a drafter's flag as the operator set it (the flag or its variable)."""
    from medusa_lib.core.drafters import REGISTRY

    text = str(error)
    for name, drafter in REGISTRY.items():
        if drafter.option:
            text = text.replace(f"--{name}", flag(f"--{name}", f"MEDUSA_{name.upper()}", argv), 1)
    return text


def proxies() -> tuple[str, ...]:
    """MEDUSA_TRUSTED_PROXIES as a list, or exit with one sentence naming the variable."""
    from ui.serve import trusted_proxies

    try:
        return trusted_proxies(TRUSTED_PROXIES)
    except ValueError as e:
        sys.exit(
            f"error: MEDUSA_TRUSTED_PROXIES lists {e}; list the addresses of the proxies in front of this server, "
            "comma-separated, or unset it."
        )


def load_playground(args: argparse.Namespace, argv: list[str] | None = None):
    """The Playground the server offers: ``Playground.load`` with the operator's flags and overrides (its
    defaults are theirs), or exit with one sentence."""
    from medusa_lib.present import Playground

    try:
        return Playground.load(
            model=args.model,
            heads=args.heads,
            device=args.device,
            dtype=args.dtype,
            options=drafter_options(args),
            trust_remote_code=args.trust_remote_code,
            progress=print,
            numerics_copy=args.float32_copy,
            cache=args.cache,
            capture=args.capture,
            machine_fit=args.machine_fit,
            # a GPU's compiled steps (or --capture compile) are built between runs: the page serves at once
            compile_in_background=True,
            max_new_tokens_limit=MAX_NEW_TOKENS_LIMIT,
            max_prompt_chars=MAX_PROMPT_CHARS,
            max_prompt_tokens=MAX_PROMPT_TOKENS,
        )
    except ValueError as e:
        # ModelError / HeadsError / EagleError: one sentence, no traceback
        sys.exit(f"error: {as_set(e, argv)}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    trusted = proxies()
    check_serving(args, argv)
    from medusa_lib.present import load_examples

    # imported here: --help needs no gradio
    from ui import DeviceTurn, build_demo, serve

    pg = load_playground(args, argv)
    examples = load_examples(EXAMPLES)
    if not examples:
        print(f"note: no example prompts ({EXAMPLES} is missing or empty)")
    # every run, whatever its route, on this thread: the one that loaded the model
    device = DeviceTurn()
    demo = build_demo(
        pg,
        examples=examples,
        model_name=args.model,
        max_new_tokens=MAX_NEW_TOKENS,
        max_run_seconds=MAX_RUN_SECONDS,
        device=device,
        shared_results=SHARED_RESULTS,
        shared_megabytes=SHARED_MB,
    )
    try:
        try:
            serve(
                demo,
                server_name=args.host,
                server_port=args.port,
                share=args.share,
                queue_size=MAX_QUEUE,
                per_client=MAX_QUEUE_PER_CLIENT,
                per_address=MAX_QUEUE_PER_ADDRESS,
                proxies=trusted,
                record_examples=RECORD_EXAMPLES,
                prevent_thread_lock=True,
            )
        except OSError as e:
            # the port was taken while the model loaded ...
            sys.exit(
                f"error: cannot serve on {args.host}:{args.port} "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); pick another --port or --host."
            )
        # the server runs on its own threads; the runs run here
        device.serve_forever()
    except KeyboardInterrupt:
        # Ctrl-C, also while the server starts
        print("Keyboard interruption in main thread... closing server.")
        try:
            demo.close()
        except KeyboardInterrupt:
            # a second Ctrl-C while it closes: stop at once, without a traceback
            pass


if __name__ == "__main__":
    main()
