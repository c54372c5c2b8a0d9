"""What a human is shown: the action, rendered from the request's canonical arguments.

A request carries ``arguments``: the exact policy arguments the digest covers. Every
reader that shows a request to a human (the CLI, the operator's ``Approval``, the UI)
renders it from them, never from free text the agent wrote, and first checks that they
hash to the request's ``argumentsDigest`` (``ApprovalRequest.action_view``): a request
whose text does not match its digest is never presented as approvable.

    view = request.action_view()            # ValueError if the digest does not match
    view.lines(show_all=False)              # at most FIELDS_SHOWN fields of VALUE_SHOWN chars
    view.digest                             # what a signed decision covers (``actionDigest``)

Invariants:
- Text is escaped before anyone sees it (``escape_text``): control characters (C0, DEL,
  C1: the terminal escapes that move a cursor or clear a line) become ``\\xNN``; line and
  paragraph separators, bidi controls (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F,
  U+061C) and zero-width characters become a visible ``<U+XXXX>``; a backslash is doubled,
  so an escape can never be forged by the text itself.
- The rendering is complete: every field, every character. A view that shows less says
  so, field by field ("N more fields"; "value cut at ..."), and ``truncated`` is true:
  the CLI refuses to approve it unless the complete action was shown (``--show-all``).
- ``digest`` is SHA-256 over the canonical JSON of the complete rendering (tool and
  fields): a decision signed over it proves the signer rendered exactly this action.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...records import canonical_json

__all__ = ["ActionView", "FIELDS_SHOWN", "VALUE_SHOWN", "escape_text", "render_action"]

#: Fields a default view shows; the rest are announced, never silently dropped.
FIELDS_SHOWN = 32
#: Characters of one value a default view shows; a longer value says where it was cut.
VALUE_SHOWN = 1024

# Invisible or reordering characters a human cannot see on screen: shown as <U+XXXX>.
_MARKED = frozenset([0x034F, 0x061C, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180E, 0x2800, 0x3164, 0xFFA0, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x2060, 0x2061,
                     0x2062, 0x2063, 0x2064, 0xFEFF, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])


def escape_text(text: str) -> str:
    """``text`` made safe to show on a terminal or a page (see the module doc)."""
    if text.isprintable() and "\\" not in text and not any(ord(c) in _MARKED for c in text):
        return text
    out = []
    for c in text:
        o = ord(c)
        if c == "\\":
            out.append("\\\\")
        elif o in _MARKED:
            out.append(f"<U+{o:04X}>")
        elif o < 0x20 or 0x7F <= o < 0xA0:
            out.append(f"\\x{o:02x}")
        elif not c.isprintable():  # U+00A0 and up: spaces, soft hyphen, format characters
            out.append(f"<U+{o:04X}>")
        else:
            out.append(c)
    return "".join(out)


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                                   default=str)


@dataclass(frozen=True, slots=True)
class ActionView:
    """The complete, escaped rendering of one action: ``tool`` and ``fields`` (key,
    value), sorted by key."""

    tool: str
    fields: tuple[tuple[str, str], ...]

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` over the complete rendering (what a signed decision covers)."""
        text = canonical_json({"tool": self.tool, "fields": [list(f) for f in self.fields]})
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    @property
    def truncated(self) -> bool:
        """Would the default view (``lines()``) leave anything out?"""
        return len(self.fields) > FIELDS_SHOWN or any(len(v) > VALUE_SHOWN for _, v in self.fields)

    def lines(self, *, show_all: bool = False, request_id: str = "") -> list[str]:
        """``key: value`` lines; unless ``show_all``, at most ``FIELDS_SHOWN`` fields of
        ``VALUE_SHOWN`` characters, and a line saying what was left out and how to see it."""
        shown = self.fields if show_all else self.fields[:FIELDS_SHOWN]
        out = []
        for k, v in shown:
            if not show_all and len(v) > VALUE_SHOWN:
                v = f"{v[:VALUE_SHOWN]}... [value cut at {VALUE_SHOWN} of {len(v)} characters]"
            out.append(f"{k}: {v}")
        hidden = len(self.fields) - len(shown)
        if not show_all and self.truncated:
            more = f"{hidden} more field{'s' if hidden != 1 else ''}" if hidden else "values cut"
            out.append(f"[{more}: this is not the whole action; see it with agent-saga approvals show "
                       f"{request_id[:8] or 'ID'} --show-all, and approve with --show-all]")
        return out


def render_action(tool: str, arguments: Mapping[str, Any]) -> ActionView:
    """The complete, escaped rendering of ``tool`` called with ``arguments``."""
    fields = sorted((escape_text(str(k)), escape_text(_value(v))) for k, v in arguments.items())
    return ActionView(escape_text(tool), tuple(fields))
