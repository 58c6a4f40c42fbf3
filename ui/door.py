"""What the queue's door refuses before gradio reads a call: the values gradio's own preprocessing would answer in
its own words (a value outside a choice, a slider's number out of range or of the wrong type), a NaN or an
infinity anywhere, and a call with more or fewer values than its event takes.

Each event's parameters are read as it declares them: for the page's events, each input's JSON schema
(``api_info``: its type and its choices) and label; for an API function (``/compare``), the names of the
function's own parameters, whose values its handler reads and checks itself (``Handlers.read_request``). One
sentence each, quoting what was sent cut short and HTML-escaped, HTTP 400, no place in the queue.
"""

from __future__ import annotations

import html
import inspect
import math

from medusa_lib.core.messages import kind, must_be, must_be_switch, shown

# the most values listed in a sentence about a choice
MOST_CHOICES = 8
# the JSON schema types of a number input
NUMBERS = ("number", "integer")


def quoted(value) -> str:
    """What the client sent, as a sentence quotes it: cut short (``shown``) and HTML-escaped."""
    return html.escape(shown(value), quote=False)


def rule_of(component) -> str:
    """What a number input takes, as the sentence for a bad value says it."""
    low, high = getattr(component, "minimum", None), getattr(component, "maximum", None)
    whole = getattr(component, "precision", None) == 0 or getattr(component, "step", None) == 1
    if low is not None and high is not None:
        return f"a whole number from {low:g} to {high:g}" if whole else f"between {low:g} and {high:g}"
    if low is not None:
        return f"a whole number of at least {low:g}" if whole else f"a number of at least {low:g}"
    return "a whole number" if whole else "a finite number"


def is_api(fn) -> bool:
    """An API function (``gr.api``): its inputs are its own parameters, untyped for gradio."""
    return bool(fn.inputs) and all(type(c).__name__ == "Api" for c in fn.inputs)


def parameter_names(fn) -> list[str]:
    """What each value of a call is called in a sentence: an API function's parameter names, else each input's
    label (its elem_id, else its position, where it has none)."""
    if is_api(fn):
        try:
            return list(inspect.signature(fn.fn).parameters)
        except (TypeError, ValueError):
            pass
    return [
        getattr(c, "label", None) or getattr(c, "elem_id", None) or f"Input {i + 1}" for i, c in enumerate(fn.inputs)
    ]


def non_finite(value):
    """The first NaN or infinity in a value (nested lists and objects too), else None."""
    if isinstance(value, float):
        return value if not math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return next((v for v in map(non_finite, value) if v is not None), None)
    if isinstance(value, dict):
        return next((v for v in map(non_finite, value.values()) if v is not None), None)
    return None


def not_a_number(fn, data) -> str | None:
    """The sentence for a NaN or an infinity anywhere in a call (JSON's NaN and Infinity literals, or 1e400):
    gradio's own check lets NaN through and answers an infinity in words that name no input, or not at all."""
    for component, name, value in zip(getattr(fn, "inputs", None) or [], parameter_names(fn), data or []):
        bad = non_finite(value)
        if bad is not None:
            number = component.api_info().get("type") in NUMBERS if not is_api(fn) else False
            return must_be(name, rule_of(component) if number else "a finite number", bad)
    return None


def choices_of(schema: dict) -> list | None:
    enum = schema.get("enum")
    return list(enum) if isinstance(enum, list) else None


def value_refusal(component, name: str, value) -> str | None:
    """The sentence for a value of one page input that gradio would refuse in its own words, or that is of
    another type than the input declares; None when it may go on (the handler checks the rest)."""
    schema = component.api_info()
    kind_of = schema.get("type")
    if value is None or not isinstance(kind_of, str):
        # gradio and the handlers take null for every input (the default, or the handler's own sentence)
        return None
    choices = choices_of(schema)
    if choices is not None and not getattr(component, "allow_custom_value", False):
        if isinstance(value, (list, dict)) or value not in choices:
            listed = ", ".join(quoted(c) for c in choices[:MOST_CHOICES]) + (
                ", ..." if len(choices) > MOST_CHOICES else ""
            )
            return f"{name} must be one of {listed} (got {quoted(value)})."
        return None
    if kind_of in NUMBERS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return html.escape(must_be(name, rule_of(component), value), quote=False)
        low, high = getattr(component, "minimum", None), getattr(component, "maximum", None)
        if (low is not None and value < low) or (high is not None and value > high):
            return must_be(name, rule_of(component), value)
        return None
    if kind_of == "boolean" and not isinstance(value, bool):
        return html.escape(must_be_switch(name, value), quote=False)
    if kind_of == "string" and not isinstance(value, str):
        return f"{name} must be text, not {kind(value)} (got {quoted(value)})."
    return None


def session_blocks(demo, session_hash):
    """``current(component)``: the component as this session has it (its choices updated by an event, as gradio
    preprocesses the call), else as the page was built."""
    holder = getattr(demo, "state_holder", None)
    state = holder[session_hash] if holder is not None and session_hash and session_hash in holder else None
    blocks = state.blocks_config.blocks if state is not None else {}
    return lambda component: blocks.get(component._id, component)


def refusal(fn, data, *, read=None, current=None) -> str | None:
    """One sentence for a call the door refuses (HTTP 400, no place in the queue), else None. ``read(fn, data)``:
    the sentence the event's own handler has for the call (``Sharing.sentence``), which names a NaN or an
    infinity in the project's words where it reads that value. ``current``: the session's components
    (``session_blocks``)."""
    if fn is None:
        return None
    why = not_a_number(fn, data if isinstance(data, list) else [])
    if why is not None:
        # an API caller reads the project's words for its parameters; a page's input is named by its label
        return (read(fn, data) if read is not None and is_api(fn) else None) or why
    if is_api(fn):
        # an API function's handler reads its other values itself, each with its sentence
        return None
    inputs, names = fn.inputs, parameter_names(fn)
    if not isinstance(data, list) or len(data) != len(inputs):
        sent = f"{len(data)} values" if isinstance(data, list) else kind(data)
        listed = ", ".join(names)
        return f"This event takes {len(inputs)} values ({listed}) as a JSON list; the call sent {sent}."
    for component, name, value in zip(inputs, names, data):
        if type(component).__name__ == "State":
            continue
        why = value_refusal(current(component) if current is not None else component, name, value)
        if why is not None:
            return why
    return None


__all__ = ["not_a_number", "parameter_names", "quoted", "refusal", "rule_of", "session_blocks"]
