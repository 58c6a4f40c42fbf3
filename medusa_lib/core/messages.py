"""One-sentence errors: the base class of every bad-input error, and how a bad value is echoed.

A message quotes what the user sent so they can find it, but never at full length: a 1e308
number, a 5,000-character preset name or a tree nested 900 deep is shown cut short, in the
words of the JSON it came in (true, null, 1.0000001, [true], {"a": 1}; text on its own as 'text'),
and a value of the wrong type says so.
"""

from __future__ import annotations

import json
import math
import reprlib

# at most this many characters of a bad value are quoted back
ECHO_CHARS = 40

# nested values are cut at depth 3 and 6 items (Python 3.11's Repr takes no arguments)
_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxtuple, _repr.maxlist, _repr.maxdict = 3, 6, 6, 4
_repr.maxstring = _repr.maxlong = _repr.maxother = ECHO_CHARS


class InputError(ValueError):
    """A setting or input that cannot be used. ``str(e)`` is one sentence that says what to change."""


class ModelError(InputError):
    """A model that cannot be loaded or run with tree attention. One sentence that says what to change.
    (``model.py``'s error; here so that ``device.py``, which ``model.py`` imports, raises it too.)"""


class HeadsError(InputError):
    """Heads that cannot be loaded or do not fit the model. One sentence that says what to change.
    (``heads.py``'s error; here so that ``vllm_format.py``, which ``heads.py`` imports, raises it too.)"""


def cause(e: BaseException, limit: int = 160) -> str:
    """An exception inside a one-sentence message: its type and the first line of its text (at most
    ``limit`` characters, no closing full stop), or its type alone when it has no text."""
    first = (str(e).strip().splitlines() or [""])[0][:limit].rstrip(".")
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def shown(value) -> str:
    """A bad value as a message quotes it: short, and spelled as the JSON it came in spells it
    (true, null, 1.0000001, [true], {"a": 1}; text on its own in single quotes, 'text')."""
    text = _repr.repr(value) if isinstance(value, str) else _json(value, depth=0)
    return text if len(text) <= ECHO_CHARS + 10 else text[:ECHO_CHARS] + "..."


def _json(value, *, depth: int) -> str:
    """JSON's spelling, cut at depth 3 and 6 items; a float as Python reads it back (repr: 1.0000001, 1e+308),
    and the numbers JSON cannot write as Python's json module writes them (Infinity, NaN)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else {math.inf: "Infinity", -math.inf: "-Infinity"}.get(value, "NaN")
    # str() refuses ints of over 4,300 digits: a huge one is shown by its size
    if isinstance(value, int):
        return (
            str(value)
            if value.bit_length() < 10_000
            else f"about {'-' if value < 0 else ''}1e+{int(value.bit_length() * math.log10(2))}"
        )
    if isinstance(value, str):
        return json.dumps(value if len(value) <= ECHO_CHARS else value[:ECHO_CHARS] + "...", ensure_ascii=False)
    if isinstance(value, (list, tuple, dict)):
        is_dict = isinstance(value, dict)
        if depth >= _repr.maxlevel:
            return "{...}" if is_dict else "[...]"
        limit = _repr.maxdict if is_dict else _repr.maxlist
        items = list(value.items())[:limit] if is_dict else list(value[:limit])
        parts = (
            [f"{_json(str(k), depth=depth + 1)}: {_json(v, depth=depth + 1)}" for k, v in items]
            if is_dict
            else [_json(v, depth=depth + 1) for v in items]
        )
        parts += ["..."] if len(value) > limit else []
        return ("{%s}" if is_dict else "[%s]") % ", ".join(parts)
    return _repr.repr(value)


def kind(value) -> str:
    """What a value of the wrong type is, in the words of JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, str):
        return "text"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (int, float)):
        return "a number"
    return type(value).__name__


def is_number(value) -> bool:
    """A real, finite number (true/false are not numbers here, although Python says they are)."""
    if isinstance(value, float):
        return math.isfinite(value)
    # ints are finite (and may be too big for a float)
    return isinstance(value, int) and not isinstance(value, bool)


def must_be(label: str, rule: str, value) -> str:
    """'<label> must be <rule> (got <value>).', or, for a value that is not a number at all, a
    sentence that says so ('(got 8)' for the text "8" would read as if the value were fine)."""
    # A number, a wrong value (NaN and infinity included).
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{label} must be {rule} (got {shown(value)})."
    return f"{label} must be {rule}: send a number, not {kind(value)} (got {shown(value)})."


def must_be_switch(label: str, value) -> str:
    """A yes/no setting sent as anything but true or false (the text "false" is not false)."""
    return f"{label} must be true or false, not {kind(value)} (got {shown(value)})."
