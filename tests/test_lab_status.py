"""The Tree lab's status lines are Markdown: what the user typed (a tree, a preset name) and quoted back in a
refusal shows as typed, never as formatting, as on the comparison's status line."""

from __future__ import annotations

import html
import re

import pytest
from conftest import status_text, tiny_playground
from markdown_it import MarkdownIt

TYPED = "*bold* _it_ `code` [a](http://x) # <b>"


@pytest.fixture(scope="module")
def pg():
    return tiny_playground(oracle=False)


def shown(status: str) -> str:
    return MarkdownIt("commonmark").enable("strikethrough").render(status)  # what the page's Markdown makes of it


def assert_as_typed(status: str, prefix: str) -> None:
    page = shown(status)
    assert page.count("<strong>") == 1 and not any(t in page for t in ("<em>", "<code>", "<a ", "<b>", "<h1")), page
    assert status_text(status).startswith(prefix) and TYPED in status_text(status), status
    assert TYPED in html.unescape(re.sub(r"<[^>]+>", "", page))


def test_a_refused_preset_or_tree_in_the_lab_shows_what_was_typed(pg):
    from ui.lab import EDIT_OUTPUTS, LabHandlers

    h = LabHandlers(pg)
    out = dict(zip(EDIT_OUTPUTS, h.preset(None, TYPED, True)))
    assert_as_typed(out["lab_status"], "**Cannot use this tree:** Unknown tree preset")
    out = dict(zip(EDIT_OUTPUTS, h.edit(None, f'[[0], ["{TYPED}"]]', True)))
    assert_as_typed(out["lab_status"], "**Cannot use this tree:** ")
    _, status = h.use(f'[[0], ["{TYPED}"]]')
    assert_as_typed(status, "**Cannot use this tree:** ")
