"""JSONL files (one JSON object per line) and files written whole, shared by the pipeline's tools."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path


def load_jsonl(path: str | Path) -> list[dict]:
    """Read a .jsonl or .jsonl.gz file: one JSON object per non-empty line."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def replace_file(path: str | Path, text: str) -> None:
    """Write ``text`` through a temporary file renamed over ``path``: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    """One JSON object per line, written whole (``replace_file``)."""
    replace_file(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
