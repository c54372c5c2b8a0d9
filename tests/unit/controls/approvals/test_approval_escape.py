"""What an approver reads hides nothing: every character a screen would not show, or
would show as something else, is escaped (``escape_text``)."""

from __future__ import annotations

import pytest
from agent_saga.controls.approvals._render import escape_text, render_action


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b[2K\x1b[1A\r", "\\x1b[2K\\x1b[1A\\x0d"),  # a terminal redraw
    ("\x85", "\\x85"),  # C1
    ("acct\u202eLIVE", "acct<U+202E>LIVE"),  # bidi override
    ("a\u200bb", "a<U+200B>b"),  # zero width
    ("a\xadb", "a<U+00AD>b"),  # soft hyphen: invisible, Latin-1
    ("80\xa0000", "80<U+00A0>000"),  # no-break space: looks like a space
    ("a\u3164b", "a<U+3164>b"),  # Hangul filler: printable, blank
    ("a\u034fb", "a<U+034F>b"),  # combining grapheme joiner: printable, invisible
    ("c:\\x1b", "c:\\\\x1b"),  # a backslash cannot forge an escape
    ("acct_9 amount 80", "acct_9 amount 80"),  # plain text is unchanged
])
def test_invisible_and_control_characters_are_shown_escaped(raw: str, shown: str) -> None:
    assert escape_text(raw) == shown


def test_a_rendered_action_escapes_names_and_values() -> None:
    view = render_action("wire.send", {"to\xad": "acct\xa0EVIL"})
    assert view.fields == (("to<U+00AD>", "acct<U+00A0>EVIL"),)
