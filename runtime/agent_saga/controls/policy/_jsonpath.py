"""A small JSONPath subset: where a policy takes a value from a call or a forward result.

    $              the whole value
    $.id           a field
    $.charge.id    nested fields
    $.items[0].id  a list element (0-based)

That is the whole grammar (no wildcards, filters, slices or recursive descent): a
reviewed policy names exactly one value, so a path that could match several, or none
silently, is refused. Field names are ``[A-Za-z_][A-Za-z0-9_-]*`` — the same pattern the
SagaPolicy CRD enforces (``JSON_PATH_PATTERN``), so the API server and this parser accept
the same paths.

Invariants:
- ``compile_path`` refuses anything outside the grammar with ``JsonPathError`` naming the
  path, the character where it stops making sense, and a valid example.
- ``JsonPath.read`` never guesses: a missing field, an index past the end, or a step into
  a value that is not an object or a list raises ``JsonPathMissing`` naming the step and
  what was there instead (the fields present, the list's length).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ...errors import ConfigurationError

__all__ = ["JSON_PATH_PATTERN", "JsonPath", "JsonPathError", "JsonPathMissing", "compile_path"]

#: The grammar as one regular expression (RE2- and Python-compatible); the CRD uses it.
JSON_PATH_PATTERN = r"^\$(\.[A-Za-z_][A-Za-z0-9_-]*|\[[0-9]+\])*$"
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_INDEX = re.compile(r"\[([0-9]+)\]")
MAX_LENGTH = 128
# The types a call's arguments and a result arrive as (an exact type test is far cheaper
# than an ABC isinstance on the hot path; other Mappings and Sequences still work).
_MAPS = (dict, MappingProxyType)
_LISTS = (list, tuple)
_EXAMPLE = "'$.id', '$.charge.id' or '$.items[0].id'"


class JsonPathError(ConfigurationError):
    """A path outside the supported subset (the message names where and why)."""


class JsonPathMissing(LookupError):
    """A valid path that does not lead to a value in this document."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.why = message


@dataclass(frozen=True, slots=True)
class JsonPath:
    """A compiled path: ``steps`` are field names (str) and list indexes (int)."""

    text: str
    steps: tuple[str | int, ...]

    def read(self, doc: Any) -> Any:
        """The value at this path in ``doc``. Raises ``JsonPathMissing``."""
        cur = doc
        for step in self.steps:  # the hot path: plain dicts and lists, no message built
            if isinstance(step, str):
                if type(cur) in _MAPS or isinstance(cur, Mapping):
                    if step in cur:
                        cur = cur[step]
                        continue
                return self._missing(doc)
            if type(cur) in _LISTS or (isinstance(cur, Sequence) and not isinstance(cur, str | bytes)):
                if step < len(cur):
                    cur = cur[step]
                    continue
            return self._missing(doc)
        return cur

    def _missing(self, doc: Any) -> Any:
        """Walk again, saying where and why the path stops (raises ``JsonPathMissing``)."""
        cur = doc
        where = "$"
        for step in self.steps:
            if isinstance(step, str):
                if not isinstance(cur, Mapping):
                    raise JsonPathMissing(self.text, f"{where} is {kind_of(cur)}, not an object with field {step!r}")
                if step not in cur:
                    present = ", ".join(sorted(map(str, cur))[:12]) or "none"
                    raise JsonPathMissing(self.text, f"{where} has no field {step!r} (fields: {present})")
                cur = cur[step]
                where = f"{where}.{step}"
            else:
                if not isinstance(cur, Sequence) or isinstance(cur, str | bytes):
                    raise JsonPathMissing(self.text, f"{where} is {kind_of(cur)}, not a list to take [{step}] from")
                if step >= len(cur):
                    raise JsonPathMissing(self.text, f"{where} has {len(cur)} element(s); [{step}] is past the end")
                cur = cur[step]
                where = f"{where}[{step}]"
        raise AssertionError(f"{self.text}: the path reads {cur!r}")  # pragma: no cover - read() said missing

    def __str__(self) -> str:
        return self.text


def kind_of(value: Any) -> str:
    """How an error names a JSON value's type: 'a string', 'an object', 'null'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, Sequence):
        return "a list"
    return type(value).__name__


def compile_path(text: object, *, field: str = "path") -> JsonPath:
    """Parse ``text`` (``$.charge.id``). Raises ``JsonPathError`` naming ``field``."""
    if not isinstance(text, str):
        raise JsonPathError(f"{field}: a path must be a string like {_EXAMPLE}, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise JsonPathError(f"{field}: path is {len(text)} characters; at most {MAX_LENGTH}")
    if not text.startswith("$"):
        raise JsonPathError(f"{field}: path {text!r} must start with '$' (the value itself), e.g. {_EXAMPLE}")
    steps: list[str | int] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == ".":
            m = _FIELD.match(text, i + 1)
            if m is None:
                raise JsonPathError(
                    f"{field}: path {text!r}: expected a field name ([A-Za-z_][A-Za-z0-9_-]*) after '.' at "
                    f"character {i + 1}; supported: $, .field, [index], e.g. {_EXAMPLE}")
            steps.append(m.group())
            i = m.end()
        elif ch == "[":
            m = _INDEX.match(text, i)
            if m is None:
                raise JsonPathError(
                    f"{field}: path {text!r}: expected a list index like [0] at character {i + 1} "
                    f"(quoted keys, wildcards, slices and filters are not supported); e.g. {_EXAMPLE}")
            steps.append(int(m.group(1)))
            i = m.end()
        else:
            raise JsonPathError(
                f"{field}: path {text!r}: unexpected {ch!r} at character {i + 1}; a path is '$' followed by "
                f".field and [index] steps, e.g. {_EXAMPLE}")
    return JsonPath(text, tuple(steps))
