"""A decoder from its parts: the verifier (``decoding.Decoder``) with a drafter made from what a caller has.

The verifier meets a drafter only through ``draft.py``'s contract, and no drafter knows the verifier
(``tests/test_layout.py``); this module sits above both and joins them. ``make_decoder`` takes a
``drafters.Drafter``, or, as a convenience, an EAGLE head (``eagle``) or Medusa ``heads`` on a
``tree``, and puts a lookup chain of ``config.lookup`` tokens beside a drafter that takes one
(``drafters.make_drafter``). A drafter that cannot run with these settings is refused as the
decoder's own error (``DecodeError``), one sentence.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .config import METHODS, DecodeConfig, DecodeError
from .decoding import Decoder
from .drafters import Drafter, DrafterError, make_drafter
from .kv import StaticKV
from .steps import RunResult


def make_decoder(
    model: nn.Module,
    *,
    method: str = "plain",
    heads=None,
    tree=None,
    config: DecodeConfig = DecodeConfig(),
    static_kv: StaticKV | None = None,
    eagle=None,
    drafter: Drafter | None = None,
) -> Decoder:
    """The ``Decoder`` of ``method`` on ``model``, drafting with ``drafter``, else the EAGLE head ``eagle``,
    else the Medusa ``heads`` on ``tree`` (Medusa methods), with the lookup chain ``config.lookup`` asks for."""
    if method not in METHODS:
        raise DecodeError(f"Unknown method {method!r}; choose one of {', '.join(METHODS)}.")
    config.check()
    try:
        made = None
        if method != "plain":
            made = make_drafter(heads=heads, tree=tree, eagle=eagle, drafter=drafter, lookup=config.lookup)
        return Decoder(model, method=method, config=config, static_kv=static_kv, drafter=made)
    except DrafterError as e:
        raise DecodeError(str(e)) from None


def run_method(model, prompt_ids: Sequence[int] | torch.Tensor, *, method: str, **parts) -> RunResult:
    """Convenience: ``make_decoder(model, method=method, **parts)`` and its whole run on ``prompt_ids``."""
    return make_decoder(model, method=method, **parts).run(prompt_ids)


__all__ = ["make_decoder", "run_method"]
