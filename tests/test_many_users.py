"""Several users at once with different drafters, numerics and modes: every call gets exactly the tokens it gets
alone (nothing mixed between runs that share one model, heads and device), and the server keeps serving."""

from __future__ import annotations

import threading

import pytest
from conftest import PROMPT, api_args, serving, two_numerics_playground

USERS = [  # (prompt, overrides): eight users, no two alike
    (PROMPT, {"drafter": "medusa", "numerics": "float32"}),
    (PROMPT, {"drafter": "lookup", "numerics": "float32"}),
    (PROMPT, {"drafter": "medusa", "numerics": "bfloat16"}),
    ("w20 w21 w22 w20 w21", {"drafter": "lookup", "numerics": "bfloat16"}),
    (PROMPT, {"drafter": "medusa", "sample": True, "temperature": 0.9, "seed": 3}),
    ("w7 w8 w9", {"drafter": "lookup", "sample": True, "temperature": 0.5, "seed": 11}),
    ("w30 w31", {"drafter": "medusa", "numerics": "bfloat16", "sample": True, "temperature": 1.2, "seed": 5}),
    ("w40 w41 w42", {"drafter": "medusa", "custom_tree": "[[0], [1], [0, 0]]", "lookup_branch": False}),
]


@pytest.fixture(scope="module")
def served_two():
    yield from serving(two_numerics_playground())


def tokens(out: dict) -> dict:
    return {m: r["token_ids"] for m, r in out["methods"].items()} | {"drafter": out["drafter"], "num": out["numerics"]}


@pytest.mark.slow
def test_eight_users_with_different_drafters_and_numerics_get_their_solo_tokens(served_two):
    from gradio_client import Client

    pg, url, client = served_two
    # Run live: each runs afresh, together, rather than being answered from the solo run's record
    args = [api_args(prompt, {"max_new_tokens": 12, **over}, live=True) for prompt, over in USERS]
    solo = [tokens(client.predict(*a, api_name="/compare")) for a in args]
    together: dict[int, dict] = {}
    errors: list[BaseException] = []

    def user(i):
        try:
            together[i] = tokens(Client(url, verbose=False).predict(*args[i], api_name="/compare"))
        except BaseException as e:  # reported below, with the user
            errors.append(e)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(len(USERS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and len(together) == len(USERS), errors
    assert [together[i] for i in range(len(USERS))] == solo
    assert len({str(s) for s in solo}) == len(USERS)  # eight different outputs: a mix-up would show
