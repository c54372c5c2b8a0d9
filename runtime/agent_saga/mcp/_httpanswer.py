"""The client's side of one ``tools/call`` over Streamable HTTP (``_httpproxy``): an event
stream when the client accepts one, else one JSON body.

Invariants:
- The head goes out when the upstream's stream opens, or with the answer: an upstream's
  own refusal (an HTTP error status: a session it no longer knows) reaches the client as
  it came, status and body.
- The answer is the upstream's own bytes when the proxy answers what the upstream said
  (an event keeps its id: a client resumes the stream by it; a JSON body becomes the
  data of one event), else the proxy's message.
- A client that stopped reading is noted (``gone``), never raised while the call runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from . import _http as http
from ._custody import Custody
from ._wire import encode

__all__ = ["CallAnswer"]

_JSON = [("Content-Type", "application/json")]


class CallAnswer:
    """The client's side of one ``tools/call`` (see the module doc). ``keep``: the
    client's connection carries the next request after this answer (every answer is
    framed: a length, or chunks)."""

    def __init__(self, writer: asyncio.StreamWriter, stream: bool, sid: str | None, custody: Custody | None,
                 keep: bool = False) -> None:
        self.writer = writer
        self.stream = stream
        self.custody = custody
        self.keep = keep
        self.head: http.Headers = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")]
        if sid:
            self.head.append(("Mcp-Session-Id", sid))
        self.out: http.Out | None = None  # the event stream, once opened
        self.gone = False
        self.upstream: tuple[dict[str, Any], bytes, int | None] | None = None  # doc, bytes, status (None: an event)
        self.refused: tuple[int, http.Headers, bytes] | None = None  # the upstream's HTTP error, as it came

    @property
    def started(self) -> bool:
        return self.out is not None

    def _stream(self) -> http.Out:
        if self.out is None:
            self.out = http.write_head(self.writer, 200, self.head, keep=self.keep)
        return self.out

    async def open(self, raw: bytes = b"") -> None:
        """Open the client's event stream (once), then relay ``raw``, an event of the
        upstream's, while the client reads (never raises)."""
        if not self.stream or self.gone:
            return
        try:
            out = self._stream()
            out.write(raw)
            await out.drain()
        except (ConnectionError, RuntimeError):
            self.gone = True  # the client stopped reading; the call goes on

    async def unanswered(self) -> bool:
        """End a call that gets no answer (cancelled): an event stream ends empty and the
        connection goes on; without a stream the client waits for nothing, so the
        connection closes. True if it goes on."""
        if not self.stream:
            return False
        out = self._stream()
        out.end()
        await out.drain()
        return True

    async def finish(self, reply: dict[str, Any]) -> bool:
        """Send the answer to the call; True (the connection goes on)."""
        if self.refused is not None and not self.started:
            status, headers, body = self.refused
            http.write_head(self.writer, status, headers, len(body), self.keep).write(body)
            await http.drain(self.writer)
            return True
        own = self.upstream is not None and self.upstream[0] == reply
        if self.stream:
            if own and self.upstream is not None and self.upstream[2] is None:
                event = self.upstream[1]
            elif own and self.upstream is not None:  # a JSON body: its bytes as the event's data
                event = http.sse_data(self.upstream[1]) or http.sse_event(reply)
            else:
                event = http.sse_event(reply)
            if self.custody is not None:
                event = self.custody.redact(event)
            out = self._stream()
            out.write(event, last=True)
            await out.drain()
            return True
        if own and self.upstream is not None and self.upstream[2] is not None:
            body = self.upstream[1]
        else:
            body = encode(reply) if self.custody is None else self.custody.redact(encode(reply))
        http.write_head(self.writer, 200, _JSON, len(body), self.keep).write(body)
        await http.drain(self.writer)
        return True
