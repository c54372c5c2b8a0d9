"""A payload whose canonical text its producer built ahead of the flusher.

A record's payload is normally encoded and scrubbed on the WAL's flusher (``chain.seal``):
the whole document, every time. A producer that writes the same shape of record over and
over, mostly from values it screened once, can hand the WAL the text instead
(``BaseWAL.append_prepared``): the router keeps each route's host names, models and the
verdicts built from them as canonical JSON text scrubbed once, and scrubs per record only
what is new to the record (what a host answered or raised, the caller's context and saga).

Invariants:
- ``PreparedPayload.text()`` is exactly ``canonical_json`` of what the scrubber would make of
  the payload: the same bytes on disk, the same digest, read by the same readers. The
  producer's tests pin that against the ordinary path.
- Only a backend that seals records itself (``BatchingWAL``: FileWAL, RedisWAL,
  PostgresWAL, SinkWAL) takes the text as it is. Any other ``BaseWAL`` (a wrapper that
  encrypts or stamps payloads) gets the payload decoded from the text, through its
  ordinary ``append``, so it scrubs, encrypts or stamps as it always does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring
from typing import Any

from ..records import canonical_json
from ..scrubber import scrub_payload

__all__ = ["PreparedPayload", "object_text", "screened_text", "string_text"]


class PreparedPayload:
    """A payload as canonical JSON text, scrubbed by whoever built it (see the module doc).

    ``build``: the text, or a function returning it. A function is called once, by the
    flusher as it seals the record (so building costs the caller nothing); it must only
    read values nobody changes afterwards, and raise ``TypeError``/``ValueError`` for a
    payload it cannot encode (the record is then rejected, as any unencodable one).
    """

    __slots__ = ("_build", "_text")

    def __init__(self, build: str | Callable[[], str]) -> None:
        self._text: str | None = build if isinstance(build, str) else None
        self._build = None if isinstance(build, str) else build

    def text(self) -> str:
        """The payload's canonical text (built on the first call)."""
        if self._text is None:
            assert self._build is not None
            self._text, self._build = self._build(), None
        return self._text

    def builder(self) -> Callable[[], str]:
        """What returns the text, for a writer that calls it once when it seals the
        record: the producer's function itself while the text is unbuilt (the writer's
        queue then keeps only that function alive, not this wrapper too)."""
        return self._build if self._build is not None else self.text

    @property
    def payload(self) -> dict[str, Any]:
        """The payload decoded from the text (for WALs that take a payload, not text)."""
        doc = json.loads(self.text())
        assert isinstance(doc, dict)
        return doc

    def __repr__(self) -> str:
        return "<PreparedPayload>"


def screened_text(doc: dict[str, Any], type_: str, saga: str) -> str:
    """The canonical text of ``doc`` once the scrubber has been over it: a fragment to
    keep and reuse (``type_`` and ``saga`` name the record in the scrubber's warning)."""
    return canonical_json(scrub_payload(doc, type_, saga))


def string_text(value: str | None) -> str:
    """A string (or None) as canonical JSON text."""
    return "null" if value is None else encode_basestring(value)


def object_text(members: Mapping[str, str]) -> str:
    """A JSON object from ``key -> canonical text of the value``, keys sorted as
    ``canonical_json`` sorts them."""
    return "{" + ",".join([f"{encode_basestring(k)}:{v}" for k, v in sorted(members.items())]) + "}"
