"""Checks of a drafter's files that need no model: a start-up runs them before the model loads, so a damaged file
ends in one sentence within a second instead of after the model's load.

A safetensors file is an 8-byte header length, a JSON header that lists every tensor's dtype, shape and byte
range, then the bytes. A file cut short (a copy that stopped), padded, empty or with a broken header is told
apart here by reading the header alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .messages import cause

# bytes per element of safetensors' dtypes
ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
    "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip
# a header longer than this is not a drafter's (safetensors itself refuses headers over 100 MB)
MOST_HEADER = 100_000_000


def safetensors_problem(path: str | Path) -> str | None:
    """Why the safetensors file at ``path`` cannot be read whole (a clause: "it is empty", "it is cut short: ...")
    or None when its header and size agree."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0:
                return "it is empty" if size == 0 else f"it is cut short ({size} bytes, not even a header)"
            if n > MOST_HEADER or 8 + n > size:
                return f"its header is cut short or damaged ({size:,} bytes, a header of {n:,} announced)"
            header = json.loads(f.read(n))
    except OSError as e:
        return f"it cannot be read ({e.strerror or type(e).__name__})"
    except (ValueError, UnicodeDecodeError):
        return "its header is not valid JSON"
    if not isinstance(header, dict):
        return "its header is not a table of tensors"
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(x) for x in t["data_offsets"])
            need = math.prod(int(d) for d in t["shape"]) * ITEMSIZE[t["dtype"]]
        except (KeyError, TypeError, ValueError):
            return f"its header's entry for {name[:60]!r} is damaged"
        if stop - start != need:
            return f"its header's {name[:60]!r} holds {stop - start:,} bytes where its shape needs {need:,}"
        end = max(end, stop)
    if 8 + n + end != size:
        how = "cut short" if 8 + n + end > size else "longer than its tensors"
        return f"it is {how}: {size:,} bytes where its header lists {8 + n + end:,}"
    return None


class Unreadable(ValueError):
    """A file that cannot be read as JSON; its text is why, as a clause ("it is nested too deeply")."""


def read_json(path: str | Path):
    """The JSON value of the file at ``path``; a file that cannot be read or parsed raises ``Unreadable`` with the
    reason, for the caller's own sentence."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as e:
        # RecursionError: JSON nested past Python's stack
        raise Unreadable("it is nested too deeply" if isinstance(e, RecursionError) else cause(e, 120)) from None


def json_problem(path: str | Path) -> str | None:
    """Why the JSON object at ``path`` cannot be read (a clause), or None."""
    try:
        value = json.loads(Path(path).read_text())
    except OSError as e:
        return f"it cannot be read ({e.strerror or type(e).__name__})"
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "it is not valid JSON"
    return None if isinstance(value, dict) else "it is not a JSON object"


def folder_problem(folder: str | Path, files: tuple[str, ...]) -> str | None:
    """The first of ``files`` in ``folder`` that is missing or damaged, as "<path>: <why>", else None."""
    for name in files:
        path = Path(folder) / name
        if not path.is_file():
            return f"{path} is missing"
        why = safetensors_problem(path) if name.endswith(".safetensors") else json_problem(path)
        if why:
            return f"{path}: {why}"
    return None


def model_sizes(config_path: str | Path | None) -> tuple[int, int] | None:
    """(hidden size, vocabulary) of a model by its config.json (a text model's, or a multimodal one's text part),
    read before its weights load; None when there is no such file or it names neither."""
    if config_path is None or not Path(config_path).is_file():
        return None
    try:
        config = json.loads(Path(config_path).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(config, dict):
        # the model's loader says what is wrong with it
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    hidden = text.get("hidden_size") or text.get("n_embd") or text.get("d_model")
    vocab = text.get("vocab_size")
    if isinstance(hidden, int) and isinstance(vocab, int) and not isinstance(hidden, bool):
        return hidden, vocab
    return None


__all__ = ["folder_problem", "json_problem", "model_sizes", "safetensors_problem"]
