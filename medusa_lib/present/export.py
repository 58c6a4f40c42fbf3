"""What the page says about serving the loaded heads elsewhere: whether they export to vLLM, and how.

The rule (which heads vLLM's Medusa can run) and the command are the core's (``core/vllm_format.py``);
``python -m medusa_lib.pipeline.export`` does the export. docs/serving.md, "Serving your heads".
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.heads import MedusaHeads
from ..core.vllm_format import TRAIN_PLAIN, eagle_vllm_refusal, export_command, vllm_refusal

DOCS = "docs/serving.md#serving-your-heads"


def shown_folder(heads: MedusaHeads) -> str | None:
    """The heads' folder as a command line in the repository root names it (relative when inside it)."""
    # set by load_heads; untrained heads have none
    folder = getattr(heads, "folder", None)
    why = vllm_refusal(heads)
    if why:
        return f"**Serving in vLLM:** {why}"
    if folder is None:
        return None
    try:
        return os.path.relpath(Path(folder).resolve(), Path.cwd())
    except ValueError:
        # another drive (Windows)
        return str(folder)


def export_hint(heads: MedusaHeads) -> str:
    """One or two sentences (Markdown): can these heads be served in vLLM, and with which command."""
    folder = shown_folder(heads)
    if heads.path_conditioned or heads.root_conditioned:
        kind = "path-conditioned" if heads.path_conditioned else "root-conditioned"
        return (
            f"**Serving in vLLM:** these {kind} heads cannot be exported (vLLM's Medusa reads the hidden state only); "
            f"plain heads can: train them without path conditioning (`{TRAIN_PLAIN}`), "
            f"then `{export_command('DIR')}` ({DOCS})."
        )
    why = vllm_refusal(heads)
    if why:
        return f"**Serving in vLLM:** {why}"
    if folder is None:
        return (
            f"**Serving in vLLM:** untrained heads; train plain heads (`{TRAIN_PLAIN}`), "
            f"then `{export_command('DIR')}` ({DOCS})."
        )
    return (
        "**Serving in vLLM:** these plain heads export to vLLM's Medusa drafter (a top-1 chain, no tree): "
        f"`{export_command(folder)}` ({DOCS})."
    )


def eagle_export_hint(head) -> str:
    """One or two sentences (Markdown): can this EAGLE head (an ``EagleHead``) be served in vLLM, and how."""
    why = eagle_vllm_refusal(head.config)
    if why:
        return f"**Serving in vLLM:** {why}"
    # set by load_eagle
    folder = getattr(head, "folder", None)
    shown = os.path.relpath(Path(folder).resolve(), Path.cwd()) if folder is not None else "DIR"
    return (
        "**Serving in vLLM:** this EAGLE head exports to vLLM's EAGLE drafter (a top-1 chain, drafting over the "
        f"whole vocabulary there): `{export_command(shown)}` ({DOCS})."
    )
