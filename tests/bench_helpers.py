"""What the benchmark tests share: the prompts of the saved setup (the ``saved`` fixture of conftest.py) and its
command-line arguments."""

from __future__ import annotations

from pathlib import Path

PROMPTS = [
    {"id": "a-1", "category": "alpha", "prompt": "w10 w11 w12 w13"},
    {"id": "a-2", "category": "alpha", "prompt": "w20 w21 w22 w20 w21 w22"},
    {"id": "b-1", "category": "beta", "prompt": "w30 w31"},
]


def saved_args(saved: Path, heads: Path | None | str = "saved") -> list[str]:
    """--model, --heads (the saved heads, another folder, or None: none) and --prompts of the ``saved`` setup."""
    heads = saved / "heads" if heads == "saved" else heads
    return [
        "--model",
        str(saved / "model"),
        *(["--heads", str(heads)] if heads is not None else []),
        "--prompts",
        str(saved / "prompts.jsonl"),
    ]
