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


def run_bench(saved: Path, out: Path, *args: str, heads: Path | None | str = "saved", new: int, repeats: int) -> None:
    """The bench on the ``saved`` setup in float32 on the CPU, ``new`` tokens a run, ``repeats`` times, with
    ``args`` (the methods and what else the test sets); its JSON written to ``out``."""
    from medusa_lib.pipeline import bench

    bench.main(
        [
            *saved_args(saved, heads),
            *args,
            *("--dtype", "float32", "--device", "cpu"),
            *("--max-new-tokens", str(new), "--repeats", str(repeats), "--json", str(out)),
        ]
    )
