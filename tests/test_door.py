"""The queue's door reads every event's declared parameters (ui/door.py): a value outside a choice, a number of
another type or out of its range, a missing or extra value, a NaN anywhere: HTTP 400 with the project's one
sentence, what the client sent escaped, no place in the queue, and gradio's own words never reach the client."""

import math

import pytest
from conftest import free_port, tiny_playground
from test_queue import post

from ui.door import refusal

MARKUP = "<script>alert(1)</script><img src=x onerror=alert(1)>"
GRADIO_WORDS = ("is not in the list of choices", "Value:", "greater than maximum", "less than minimum", "Traceback")


@pytest.fixture(scope="module")
def served():
    from ui import build_demo, serve

    pg = tiny_playground()
    demo = build_demo(pg, max_new_tokens=16)
    port = free_port()
    serve(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield demo, f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


def good_values(fn) -> list:
    """Values each input of ``fn`` takes (its current value; a State's null)."""
    return [getattr(c, "value", None) for c in fn.inputs]


def with_markup_in_every_choice(fn) -> list[tuple[int, list]] | None:
    """For each input of ``fn`` that offers choices, the event's values with the hostile text in that one."""
    out = []
    for i, c in enumerate(fn.inputs):
        if isinstance(c.api_info().get("enum"), list) and not getattr(c, "allow_custom_value", False):
            data = good_values(fn)
            data[i] = MARKUP
            out.append((i, data))
    return out


def page_events(demo):
    return [fn for fn in demo.fns.values() if fn.inputs and type(fn.inputs[0]).__name__ != "Api"]


def test_every_choice_of_every_page_event_refuses_an_outside_value_in_one_escaped_sentence(served):
    demo, url = served
    tried = 0
    for index, fn in demo.fns.items():
        for i, data in with_markup_in_every_choice(fn) or []:
            why = refusal(fn, data)
            label = fn.inputs[i].label
            assert why.startswith(f"{label} must be one of ") and "&lt;script&gt;" in why, (fn.name, why)
            assert "<script>" not in why
            status, answer = post(
                url, "gradio_api/queue/join", {"data": data, "fn_index": index, "session_hash": "door"}
            )
            assert status == 400 and answer["detail"] == why, (fn.name, status, answer)
            assert not any(w in answer["detail"] for w in GRADIO_WORDS)
            tried += 1
    # the page's run, the Tree lab's measurements, the inspector, the drafter choice, the replay speed...
    assert tried >= 10


def test_wrong_types_missing_values_and_nan_on_every_page_event(served):
    demo, url = served
    for index, fn in demo.fns.items():
        if fn not in page_events(demo):
            continue
        # one value fewer than the event takes
        short = good_values(fn)[:-1]
        status, answer = post(url, "gradio_api/queue/join", {"data": short, "fn_index": index, "session_hash": "door"})
        assert status == 400 and answer["detail"].startswith(f"This event takes {len(fn.inputs)} values ("), fn.name
        assert answer["detail"].endswith(f"the call sent {len(short)} values.")
        for i, c in enumerate(fn.inputs):
            kind = c.api_info().get("type")
            if kind not in ("number", "integer", "boolean", "string") or type(c).__name__ == "State":
                continue
            data = good_values(fn)
            data[i] = [MARKUP]  # a list where a number, a switch or a text goes
            why = refusal(fn, data)
            assert why is not None and "<script>" not in why and "&lt;script&gt;" in why, (fn.name, c.label, why)
            status, answer = post(url, "gradio_api/queue/join", {"data": data, "fn_index": index, "session_hash": "d"})
            assert (status, answer["detail"]) == (400, why)
            if kind in ("number", "integer"):
                data[i] = math.inf
                assert refusal(fn, data).endswith("(got Infinity)."), (fn.name, c.label)


def test_a_slider_out_of_its_range_gets_the_projects_sentence_not_gradios(served):
    demo, url = served
    fn = next(f for f in demo.fns.values() if f.name == "run_event")
    data = good_values(fn)
    at = next(i for i, c in enumerate(fn.inputs) if c.label == "Max new tokens")
    data[at] = 10**6
    why = refusal(fn, data)
    assert why == "Max new tokens must be a whole number from 1 to 512 (got 1000000)."


def test_a_choice_an_event_gave_this_session_is_taken(served):
    """The Tree lab's leaf list changes with the tree: the door reads the session's choices, as gradio does."""
    from gradio_client import Client

    demo, url = served
    client = Client(url, verbose=False)
    fn_index, fn = next((i, f) for i, f in demo.fns.items() if f.name == "remove")
    leaf = next(c for c in fn.inputs if c.label == "Leaf to remove")
    session = client.session_hash
    # the session's leaf list after an edit of the tree: a value only it offers
    from ui.door import session_blocks

    state = demo.state_holder[session]
    updated = leaf.__class__(choices=["[0, 0, 7]"], label=leaf.label)
    updated._id = leaf._id
    state.blocks_config.blocks[leaf._id] = updated
    current = session_blocks(demo, session)
    data = good_values(fn)
    data[fn.inputs.index(leaf)] = "[0, 0, 7]"
    assert refusal(fn, data, current=current) is None
    assert refusal(fn, data) is not None  # the page as built offers no such leaf
