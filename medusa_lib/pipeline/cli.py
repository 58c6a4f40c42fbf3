"""What every pipeline command line shares."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from ..core.config import CACHES, CAPTURES
from ..core.messages import cause, shown
from .jsonl import load_jsonl


def add_engine_arguments(ap: argparse.ArgumentParser, *, cache_help: str, capture_help: str) -> None:
    """--cache and --capture, with the choices core/kv.py takes ("auto": this device's, resolved there)."""
    ap.add_argument("--cache", default="auto", choices=["auto", *CACHES], help=cache_help)
    ap.add_argument("--capture", default="auto", choices=["auto", *CAPTURES], help=capture_help)


def add_float_draft(ap: argparse.ArgumentParser, drafters: str = "the drafters'") -> None:
    """--float-draft: keep the drafters' matrices float (by default they run int8 on a float32 CPU model)."""
    ap.add_argument(
        "--float-draft",
        action="store_true",
        help=f"keep {drafters} matrices float (default: int8 on a float32 CPU model, core/packing.py)",
    )


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """--model, --dtype and --device, with the same defaults in every CLI (core.model.load_model takes them)."""
    ap.add_argument(
        "--model", default="default", help="'default' (SmolLM2-135M-Instruct, offline), a local folder or a Hub id"
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="auto, float32, bfloat16 or float16 (auto: bfloat16 where the device runs it natively)",
    )
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1 ...")


def fail(message) -> NoReturn:
    """End a command line with one sentence: ``error: <message>``, exit code 1, no traceback."""
    raise SystemExit(f"error: {message}")


def whole_number(low: int, high: int | None = None):
    """An argparse type: a whole number from ``low`` (to ``high``); argparse names the flag in its refusal."""
    rule = f"a whole number from {low} to {high}" if high is not None else f"a whole number of at least {low}"

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {rule} (got {text!r})") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {rule} (got {value})")
        return value

    return whole


def read_prompts(path: str | Path, *, flag: str = "--prompts", key: str = "prompt") -> list[dict]:
    """The prompts file's rows (JSONL: one {"id", "category", "prompt"} object a line), or one sentence
    naming the flag: a missing, empty or unreadable file, or a line without a prompt (``key``: the text each
    row must have, "id" for an answers file)."""
    path = Path(path).expanduser()
    if not path.is_file():
        fail(f'{flag} {str(path)!r} is not a file; give a JSONL file with one {{"{key}": ...}} object a line.')
    try:
        rows = load_jsonl(path)
    # unreadable, not JSON, not gzip, nested past Python's stack
    except (OSError, ValueError, EOFError, RecursionError) as e:
        why = "a line is nested too deeply" if isinstance(e, RecursionError) else cause(e, 120)
        fail(f"{flag} {str(path)!r} cannot be read as JSONL ({why}); give one JSON object a line.")
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not isinstance(row.get(key), str):
            fail(f'{flag} {str(path)!r}: its entry {n} is not an object with a "{key}" text ({shown(row)}).')
    if not rows:
        fail(f'{flag} {str(path)!r} holds no prompts; give a JSONL file with one {{"{key}": ...}} object a line.')
    return rows


def check_writable(path: str | Path, *, flag: str) -> None:
    """Refuse, before any work, an output path that cannot be written: under a file, or in a folder that
    takes no files (a read-only disk, /proc). Creates nothing."""
    import tempfile

    path = Path(path).expanduser().absolute()
    above = path.parent
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        fail(f"{flag} {str(path)!r} is under {str(above)!r}, which is a file, not a folder; give another path.")
    try:
        with tempfile.TemporaryFile(dir=above):
            pass
    except OSError as e:
        fail(
            f"{flag} {str(path)!r} cannot be written: {str(above)!r} takes no files "
            f"({e.strerror or type(e).__name__}); give another path."
        )


def check_heads_path(value: str, *, flag: str = "--heads") -> None:
    """Refuse a heads path that names no folder (a Hub id, owner/name, is fetched later)."""
    path = Path(value).expanduser()
    if not path.exists() and (value.startswith((".", "/", "~")) or value.count("/") != 1):
        fail(f"{flag} {value!r} does not exist; give the folder of trained heads (medusa_lm_head.* and config.json).")


def check_model_arguments(args: argparse.Namespace) -> None:
    """--device and --dtype, checked before the model loads (one sentence each)."""
    from ..core.device import resolve_device, resolve_dtype

    try:
        resolve_dtype(args.dtype, resolve_device(args.device))
    except ValueError as e:
        fail(e)


def check_tree_name(name: str | None, *, heads: str, flag: str = "--tree") -> None:
    """Refuse, before the model loads, a tree that is neither a preset nor in the heads folder's trees.json."""
    import json

    from ..core.heads import TREES_FILE
    from ..core.tree.presets import preset_names

    if name is None:
        return
    trees = Path(heads).expanduser() / TREES_FILE
    try:
        known = list(json.loads(trees.read_text())) if trees.is_file() else []
    except (OSError, ValueError, TypeError):
        # loading the heads says what is wrong with it
        known = []
    names = list(dict.fromkeys([*known, *preset_names()]))
    if name not in names:
        fail(f"{flag} {name!r} is not a tree preset; choose one of: {', '.join(names)}.")
