"""JSONL files (one JSON object per line), shared by the pipeline's tools."""

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


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Write through a temporary file, so a crash never leaves half a file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
