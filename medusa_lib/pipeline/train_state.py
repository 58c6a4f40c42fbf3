"""A training's saved state, read back as tensors, numbers and text only (``torch.load(weights_only=True)``).

Both trainings save their state at each evaluation and resume from it (``medusa_trainer.py``'s heads,
``eagle_trainer.py``'s EAGLE head); a planted file that would run code on unpickling is refused in one
sentence, and the code never runs (tests/test_train_state.py).
"""

from __future__ import annotations

from pathlib import Path

import torch


def read_train_state(path: Path, *, fresh: str) -> dict:
    """A saved training state, read as tensors, numbers and text only (``weights_only``): a planted file cannot
    run code when a training resumes. One sentence (SystemExit) for one that holds anything else or is damaged;
    ``fresh`` says how to start again."""
    import pickle

    try:
        state = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        raise SystemExit(
            f"error: {path} is not a plain training state (tensors and numbers) and is not loaded, for safety "
            f"({type(e).__name__}); {fresh}."
        ) from None
    if not isinstance(state, dict):
        raise SystemExit(f"error: {path} holds {type(state).__name__}, not a training state; {fresh}.")
    return state
