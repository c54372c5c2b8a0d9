"""Candidate classifications for a skeleton's comments: what a tool's name and annotations suggest.

A skeleton declares every tool IRREVERSIBLE (``_skeleton``). Beside a tool, it may add a
comment a reviewer can check and copy by hand; the declaration itself never changes:

- ``readOnlyHint: true``, or a reading verb first in the name (``get_``, ``list_``,
  ``git_status``): the candidate is REVERSIBLE;
- a sibling tool whose name swaps the verb for its opposite (``create_issue`` and
  ``delete_issue``, ``git_add`` and ``git_reset``): the candidate is COMPENSABLE with the
  sibling as its inverse; each argument the sibling requires comes from the call
  (``callArgs``) when the tool takes one of that name, else from the result (``args``);
- a move or rename whose arguments come in a pair (``source`` / ``destination``): the
  candidate is the same tool with the pair swapped;
- ``destructiveHint: true`` with no candidate: a warning that the server says the tool
  may destroy data.

Invariants:
- Pure and total: any name, any schema, any annotations (or none) give a list of comment
  lines, possibly empty; nothing here reads a value a call carried.
- Hints are evidence from names, never a classification: the text says to verify.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["hints"]

_WORDS = re.compile(r"[A-Za-z][a-z0-9]*|[0-9]+")
_READS = frozenset({"get", "list", "read", "search", "show", "describe", "status", "diff", "log", "find", "fetch",
                    "view", "inspect", "count", "lookup", "query"})
_OPPOSITES: Mapping[str, tuple[str, ...]] = {
    "create": ("delete", "remove", "destroy"), "add": ("remove", "delete", "reset", "unstage"),
    "insert": ("delete", "remove"), "open": ("close",), "start": ("stop",), "enable": ("disable",),
    "disable": ("enable",), "lock": ("unlock",), "attach": ("detach",), "subscribe": ("unsubscribe",),
    "stage": ("unstage",), "assign": ("unassign",), "follow": ("unfollow",), "star": ("unstar",),
    "archive": ("unarchive",), "pin": ("unpin",), "block": ("unblock",), "mute": ("unmute",),
    "install": ("uninstall",), "mount": ("unmount",), "link": ("unlink",), "tag": ("untag",),
}
_VERBS = _READS | frozenset(_OPPOSITES) | frozenset({"move", "rename", "write", "update", "set", "edit", "delete",
                                                     "remove", "send", "commit", "checkout", "reset", "push"})
_PAIRS = (("source", "destination"), ("src", "dst"), ("from", "to"), ("old_path", "new_path"),
          ("oldPath", "newPath"), ("old_name", "new_name"), ("oldName", "newName"))


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORDS.findall(name)]


def _verb(words: Sequence[str]) -> int | None:
    """The index of the first known verb of a tool name's words."""
    return next((i for i, w in enumerate(words) if w in _VERBS), None)


def _properties(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return dict(props) if isinstance(props, Mapping) else {}


def _required(schema: Mapping[str, Any] | None) -> list[str]:
    req = schema.get("required") if isinstance(schema, Mapping) else None
    if isinstance(req, list) and all(isinstance(r, str) for r in req):
        return list(req)
    return sorted(_properties(schema))


def _map(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"


def _candidate(tool: str, inverse: str, why: str, compensate: str) -> list[str]:
    return [f"candidate ({why}; verify that {inverse} undoes exactly what {tool} did before you use it):",
            "  semantics: COMPENSABLE", f"  compensate: {compensate}"]


def _inverse(tool: str, inverse: str, args: Sequence[str], own: Mapping[str, Any], why: str) -> list[str]:
    call = [(a, f"$.{a}") for a in args if a in own]
    result = [(a, f"$.{a}") for a in args if a not in own]
    fields = [f"tool: {inverse}"]
    if call:
        fields.append(f"callArgs: {_map(call)}")
    if result:
        fields.append(f"args: {_map(result)}")
    out = _candidate(tool, inverse, why, "{" + ", ".join(fields) + "}")
    if result:
        out.append(f"  ({', '.join(a for a, _ in result)}: not an argument of {tool}; check that its answer has it)")
    return out


def hints(tool: str, schema: Mapping[str, Any] | None, annotations: Mapping[str, Any] | None,
          tools: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """Comment lines (without ``#``) suggesting how ``tool`` might be classified.
    ``tools``: every tool of the surface -> its input schema (for siblings)."""
    notes = annotations if isinstance(annotations, Mapping) else {}
    words = _words(tool)
    at = _verb(words)
    verb = words[at] if at is not None else ""
    if notes.get("readOnlyHint") is True or (verb in _READS and notes.get("readOnlyHint") is not False):
        why = "readOnlyHint: true" if notes.get("readOnlyHint") is True else f"its name reads ({verb})"
        return [f"candidate ({why}): semantics: REVERSIBLE, if calling it changes nothing anyone can see"]
    own = _properties(schema)
    if at is not None and verb in ("move", "rename"):
        for a, b in _PAIRS:
            if a in own and b in own:
                return _candidate(tool, tool, f"a move with {a} and {b} in the call",
                                  f"{{tool: {tool}, callArgs: {{{a}: $.{b}, {b}: $.{a}}}}}")
    if at is not None:
        by_words = {tuple(_words(name)): name for name in tools if name != tool}
        for opposite in _OPPOSITES.get(verb, ()):
            sibling = by_words.get((*words[:at], opposite, *words[at + 1:]))
            if sibling is not None:
                return _inverse(tool, sibling, _required(tools.get(sibling)), own,
                                f"its name and {sibling}'s suggest it")
    if notes.get("destructiveHint") is True:
        return ["destructiveHint: true: the server says it may destroy data; keep it IRREVERSIBLE unless an "
                "inverse restores what it destroys"]
    return []
