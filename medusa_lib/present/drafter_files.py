"""What the drafters load, read and checked before the model loads: the Medusa heads (trained, or untrained
stand-ins where the default heads are absent) and every registered drafter's files and option, then each
drafter's state for each copy of the model.

A damaged file is said in one sentence within seconds of the start (``check_files``), not after the model has
loaded; a file the operator named must load, one found beside the heads is left out with the sentence that says
why. ``Playground.load`` (``startup.py``) reads through these; the Drafter choice among what loaded is
``drafter.py``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..core.drafters import REGISTRY
from ..core.drafters.eagle_head import find_eagle
from ..core.file_checks import safetensors_problem
from ..core.heads import HeadsConfig, HeadsError, MedusaHeads, hidden_size_of
from ..core.heads_load import load_heads
from ..core.messages import cause, shown
from .settings import PlaygroundError

SHIPPED_HEADS = Path(__file__).resolve().parents[2] / "assets" / "heads" / "smollm2-135m-instruct"


# ---------------------------------------------------------------------- the Medusa heads
def untrained_heads(model, num_heads: int = 4) -> MedusaHeads:
    """Identity ResBlocks on the shared lm_head: every head proposes the base model's next token."""
    hidden = hidden_size_of(model.config)
    vocab = model.get_output_embeddings().weight.shape[0]
    p = model.get_output_embeddings().weight
    return (
        MedusaHeads(HeadsConfig(hidden_size=int(hidden), vocab_size=int(vocab), num_heads=num_heads))
        .to(device=p.device, dtype=p.dtype)
        .eval()
    )


def load_medusa(
    path: Path | None, model, *, default_heads: str | Path | None = None, shown: str = ""
) -> tuple[MedusaHeads, str]:
    """(the Medusa heads for ``model``, the line that says which). A missing *default* heads folder
    falls back to untrained heads (with a note); heads the user named must load (HeadsError)."""
    shown = shown or (str(path) if path else "")
    if path is not None and (path.exists() or path != Path(default_heads or "")):
        h = read_medusa(path, model=model, shown=shown)
        note = f"trained heads from {shown}" + (
            " (path-conditioned: each head also reads the tree's root and the tokens of its own branch)"
            if h.path_conditioned
            else " (root-conditioned: they also read the tree's root token)"
            if h.root_conditioned
            else ""
        )
        return h, note
    found = f" at {shown}" if path else ""
    return untrained_heads(model), (
        f"untrained heads (identity ResBlocks on the shared lm_head; trained heads not found{found})"
    )


# heads up to this size are read whole before the model loads (their shapes checked); bigger ones are read once
READ_AHEAD_BYTES = 256 * 2**20
HEADS_FILE = "medusa_lm_head.safetensors"


def read_medusa(path: Path, *, model=None, shown: str = "") -> MedusaHeads:
    """``load_heads`` with every failure in one sentence (HeadsError); without ``model`` it reads and checks the
    files alone (config, tensors, their shapes), before any model loads."""
    try:
        return load_heads(path, model=model)
    except HeadsError:
        raise
    except (ValueError, OSError, RuntimeError) as e:
        # a damaged config.json or safetensors file: one sentence, no traceback
        raise HeadsError(
            f"Could not read the Medusa heads at {shown or path} ({cause(e, 200)}); check the files or train new heads."
        ) from None


def check_files(
    folder: Path | None,
    options: Mapping[str, Any],
    *,
    default_heads: str | Path | None = None,
    shown: str = "",
    sizes: tuple[int, int] | None = None,
) -> dict[str, str]:
    """Before any model loads: the Medusa heads' files (read and checked whole, ``read_medusa``; heads the operator
    named, or the default ones where they are) and every drafter's (``Drafter.check_files``). A damaged file the
    operator named raises its sentence; a drafter beside the heads whose files are damaged is left out: returns
    {drafter: the sentence that says so}. ``sizes``: the model's (hidden size, vocabulary) by its config where it
    can be read before the weights load (``file_checks.model_sizes``), which heads and drafters must fit."""
    if folder is not None and folder.is_dir():
        # a small checkpoint (all shipped heads) is read whole and its shapes checked against its config; a big one
        # is read once, with the model, and only its weights' header and size are checked now (a cut copy)
        if sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) <= READ_AHEAD_BYTES:
            heads = read_medusa(folder, shown=shown)
            if sizes is not None:
                heads.check_sizes(*sizes)
        elif (weights := folder / HEADS_FILE).exists() and (problem := safetensors_problem(weights)):
            raise HeadsError(
                f"The heads file {weights} is not a readable safetensors file ({problem}); "
                "copy the heads again or train new ones."
            )
    left = {}
    for name, cls in REGISTRY.items():
        why = cls.check_files(options.get(name), folder=folder, sizes=sizes)
        if why:
            left[name] = why
    return left


# ---------------------------------------------------------------------- loading
def check_options(options: Mapping[str, Any], *, folder) -> None:
    """Refuse, before any model loads, what the operator named for a drafter that cannot be one
    (``Drafter.check_option``): one sentence."""
    for name, option in options.items():
        if name not in REGISTRY:
            raise PlaygroundError(f"Unknown drafter {shown(name)}; the drafters are: {', '.join(REGISTRY)}.")
        takes = [n for n, cls in REGISTRY.items() if cls.option]
        if not REGISTRY[name].option and option not in (None, "", "auto"):
            raise PlaygroundError(
                f"The {REGISTRY[name].label} drafter takes no option (got {shown(option)}); "
                f"only {', '.join(takes) or 'none'} take{'s' if len(takes) == 1 else ''} one."
            )
        REGISTRY[name].check_option(option, folder=folder)


def load_drafters(
    copies: Mapping[str, tuple],
    *,
    folder,
    options: Mapping[str, Any] | None = None,
    say=None,
    left_out: Mapping[str, str] | None = None,
) -> tuple[dict, dict]:
    """What every registered drafter loads for each copy of the model: ``copies`` numerics -> (model,
    heads), the first the loaded copy. Returns ({name: {numerics: state}} of the drafters offered
    (one that loads nothing for the first copy is not offered), {name: the line saying why not}). ``left_out``:
    drafters not loaded at all, with the sentence that says why (``check_files``)."""
    loaded, notes = {}, dict(left_out or {})
    for name, cls in REGISTRY.items():
        if name in notes:
            continue
        option = (options or {}).get(name)
        states = {}
        for numerics, (model, heads) in copies.items():
            got = cls.load(model, heads=heads, folder=folder, option=option)
            if got.state is None:
                if not states:
                    notes[name] = got.note
                    break
                # offered for the first copy only: runs in this numerics say so (Drafters.state)
                if say:
                    say(f"note: {cls.label} in {numerics}: {got.note}")
                continue
            states[numerics] = got.state
            if say and len(states) == 1 and got.note:
                say(f"{cls.label}: {got.note}")
        if states:
            loaded[name] = states
        elif say and notes.get(name):
            say(f"note: {notes[name]}")
    return loaded, notes


__all__ = [
    "SHIPPED_HEADS",
    "check_files",
    "check_options",
    "find_eagle",
    "load_drafters",
    "load_medusa",
    "read_medusa",
    "untrained_heads",
]
