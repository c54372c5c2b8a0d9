"""Just enough HTTP/1.1 for MCP's Streamable HTTP transport, on asyncio streams.

Connections are kept alive on both sides. The proxy serves requests one after another on
a client's connection (HTTP/1.1; a client that sends ``Connection: close``, or speaks
HTTP/1.0, gets its connection closed after the answer) and frames every answer, by
``Content-Length`` or chunked (``Out``). Upstream, a ``Pool`` keeps idle connections per
URL. A message body is ``Content-Length`` bytes, a chunked body, or everything until the
connection closes; a Server-Sent Events stream is read event by event (``sse_events``),
each kept as the bytes that arrived so it can be relayed as is.

Invariants:
- A request the parser cannot read is answered 400 by the caller, never guessed at.
- Header names compare case-insensitively; values are kept as sent.
- Every body and event is bounded (``limit``, ``MAX_BODY`` by default), however it is
  framed (a length, chunks, until the close, one SSE event): over it, ``TooLarge``.
- An SSE event whose data the proxy refuses to read comes with ``_wire.Unreadable`` for
  its document, never an exception that ends the stream.
- An upstream connection goes back to its pool only when its answer was read to the end
  of its framing (a length or the last chunk), the answer did not ask to close, and it is
  HTTP/1.1; otherwise it is closed. A pooled connection is handed out again only if the
  upstream has not closed it, sent nothing unasked, and it was idle under ``Pool.idle``
  seconds; else it is dropped before anything is written to it. A request is never sent
  twice: once written, a broken connection is the caller's error (``OUTCOME_UNKNOWN`` for
  a ``tools/call``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass, field
from operator import itemgetter, methodcaller
from typing import Any
from urllib.parse import urlsplit

from .. import hosts
from ._wire import Unreadable, parse

__all__ = ["HttpRequest", "HttpResponse", "drain", "header", "open_connection", "read_request", "read_response",
           "refused", "sse_data", "sse_event", "sse_events", "write_head", "Out", "Pool"]

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
Headers = list[tuple[str, str]]


class _Read(list[tuple[str, str]]):
    """Headers as read (a ``Headers``), with each name's first value by its lowercase name
    (``header`` looks them up in one step)."""

    __slots__ = ("first",)

    def __init__(self, names: list[str], values: list[str]) -> None:
        super().__init__(zip(names, values, strict=True))
        # Built from the end: the first value of a name is the one left.
        self.first: dict[str, str] = dict(zip(reversed(list(map(str.lower, names))), reversed(values), strict=True))


_PARTITION = methodcaller("partition", ":")
_NAME, _SEP, _VALUE = itemgetter(0), itemgetter(1), itemgetter(2)


#: Request headers never passed on upstream: the connection's own, and the client's
#: ``Origin`` (the proxy checked it; the upstream sees the proxy, not a page).
NOT_FORWARDED = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive", "origin"})


class HttpError(Exception):
    """A message that is not the HTTP this module reads."""


class TooLarge(HttpError):
    """A body (or one event) over the limit."""


@dataclass
class HttpRequest:
    """One request: method, target, headers, body."""

    method: str
    target: str
    headers: Headers
    body: bytes = b""
    keep: bool = True  # the connection stays open after the answer (HTTP/1.1, no ``Connection: close``)


@dataclass
class HttpResponse:
    """A response head and its body, not read yet (``body()`` or ``chunks()``)."""

    status: int
    headers: Headers
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pool: Pool | None = None
    keep: bool = False  # HTTP/1.1 without ``Connection: close``: reusable once read to its end
    complete: bool = False  # the body was read to the end of its framing
    _closed: bool = field(default=False, repr=False)

    @property
    def content_type(self) -> str:
        """The media type, lowercased, without parameters."""
        return (header(self.headers, "content-type") or "").split(";")[0].strip().lower()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        if self._bodiless():
            return
        async for c in _body(self.reader, self.headers, None, self._ended):
            yield c

    async def body(self, limit: int = MAX_BODY) -> bytes:
        """The whole body (``TooLarge`` over ``limit`` bytes)."""
        if self._bodiless():
            return b""
        return await _whole(self.reader, self.headers, limit, self._ended)

    def _bodiless(self) -> bool:
        """A 1xx, 204 or 304 answer has no body, whatever its headers say (RFC 9112 6.3)."""
        if self.status < 200 or self.status in (204, 304):
            self.complete = True
            return True
        return False

    def _ended(self) -> None:
        self.complete = True

    def close(self) -> None:
        """Done with the answer: its connection goes back to the pool if it was read to
        its end and may be kept, else it is closed."""
        if self._closed:
            return
        self._closed = True
        if self.pool is not None and self.keep and self.complete:
            self.pool.put(self.reader, self.writer)
        else:
            self.writer.close()


def header(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    """The first value of header ``name``, or None."""
    low = name.lower()
    if headers.__class__ is _Read:
        return headers.first.get(low)
    for k, v in headers:
        if k.lower() == low:
            return v
    return None


def refused(req: HttpRequest, allowed: Collection[str]) -> tuple[int, str] | None:
    """Why a server for browsers' neighbours does not answer ``req`` — a ``Host`` that is
    not a loopback name or one of ``allowed`` (421), an ``Origin`` naming another host
    (403), a POST that is not ``application/json`` (415) — or None (``agent_saga.hosts``)."""
    host = header(req.headers, "host") or ""
    if not hosts.host_allowed(host, allowed):
        return 421, (f"Host {host[:100]!r} is not a name this proxy serves (a loopback name, the address it "
                     f"listens on, or one given with --allow-host)")
    origin = header(req.headers, "origin")
    if origin is not None and not hosts.origin_allowed(origin, allowed):
        return 403, (f"Origin {origin[:100]!r} is not allowed: a web page may reach this proxy only from a host it "
                     f"serves (--allow-host)")
    if req.method == "POST":
        ctype = (header(req.headers, "content-type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return 415, f"Content-Type {ctype or 'none'!r}: a JSON-RPC message is POSTed as application/json"
    return None


async def _head(reader: asyncio.StreamReader) -> tuple[str, Headers] | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise HttpError("the connection closed inside the message head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(f"a message head over {MAX_HEAD} bytes") from None
    lines = raw.decode("latin-1").split("\r\n")
    # Each non-empty line after the first is ``name: value``, both stripped (in C: no
    # Python step per header).
    parts = list(map(_PARTITION, filter(None, lines[1:])))
    if not all(map(_SEP, parts)):
        line = next(p[0] for p in parts if not p[1])
        raise HttpError(f"a header line without ':': {line[:80]!r}")
    headers = _Read(list(map(str.strip, map(_NAME, parts))), list(map(str.strip, map(_VALUE, parts))))
    return lines[0], headers


async def read_request(reader: asyncio.StreamReader, limit: int = MAX_BODY) -> HttpRequest | None:
    """The next request on ``reader`` (None: the connection closed first); ``TooLarge``
    for a body over ``limit`` bytes."""
    head = await _head(reader)
    if head is None:
        return None
    first, headers = head
    parts = first.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(f"not an HTTP/1.x request line: {first[:80]!r}")
    body = b""
    if header(headers, "content-length") is not None or "chunked" in (header(headers, "transfer-encoding") or ""):
        body = await _whole(reader, headers, limit)
    return HttpRequest(parts[0].upper(), parts[1], headers, body, _keep(parts[2], headers))


def _keep(version: str, headers: Headers) -> bool:
    return version.startswith("HTTP/1.1") and "close" not in (header(headers, "connection") or "").lower()


async def _whole(reader: asyncio.StreamReader, headers: Headers, limit: int,
                 ended: Callable[[], None] | None = None) -> bytes:
    """The whole body, as ``_body``'s chunks joined (a body of a given length in one read)."""
    length = header(headers, "content-length")
    if length is None or "chunked" in (header(headers, "transfer-encoding") or "").lower():
        return b"".join([c async for c in _body(reader, headers, limit, ended)])
    left = int(length)
    if left > limit:
        raise TooLarge(f"a body over {limit} bytes")
    if left > 0:
        try:
            data = await reader.readexactly(left)
        except asyncio.IncompleteReadError as exc:
            return exc.partial  # the peer closed mid-body: the caller sees a short body
    else:
        data = b""
    if ended is not None:
        ended()
    return data


async def _body(reader: asyncio.StreamReader, headers: Headers, limit: int | None,
                ended: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
    """The body's chunks; ``TooLarge`` once they add up to over ``limit`` (None: no limit,
    for a stream the caller bounds itself). ``ended`` is called once the framing ended
    (a length read in full, the last chunk), never for a body cut short."""
    total = 0
    async for c in _framed(reader, headers, limit, ended):
        total += len(c)
        if limit is not None and total > limit:
            raise TooLarge(f"a body over {limit} bytes")
        yield c


async def _framed(reader: asyncio.StreamReader, headers: Headers, limit: int | None,
                  ended: Callable[[], None] | None) -> AsyncIterator[bytes]:
    length = header(headers, "content-length")
    if "chunked" in (header(headers, "transfer-encoding") or "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                return  # the peer closed mid-body: the caller sees a short body
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if limit is not None and size > limit:
                raise TooLarge(f"a body over {limit} bytes")
            if size == 0:
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                if line and ended is not None:
                    ended()
                return
            data = await reader.readexactly(size)
            await reader.readline()
            yield data
    elif length is not None:
        left = int(length)
        if limit is not None and left > limit:
            raise TooLarge(f"a body over {limit} bytes")
        while left > 0:
            data = await reader.read(min(left, 65536))
            if not data:
                return
            left -= len(data)
            yield data
        if ended is not None:
            ended()
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


def _target(url: str) -> tuple[str, int, bool, str, str]:
    """``url``'s (host, port, TLS, Host header, path)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise HttpError(f"{url}: the upstream URL must be http:// or https://")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname or "", port, parts.scheme == "https", parts.netloc, path


async def open_connection(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str, str]:
    """A connection to ``url``'s host; ``(reader, writer, host header, path)``."""
    host, port, tls, netloc, path = _target(url)
    reader, writer = await asyncio.open_connection(host, port, ssl=tls or None, limit=MAX_HEAD * 4)
    return reader, writer, netloc, path


class Pool:
    """Kept-alive connections to one upstream URL (see the module doc's invariants)."""

    def __init__(self, url: str, *, idle: float = 2.0, size: int = 16) -> None:
        self.url = url
        self.host, self.port, self.tls, self.netloc, self.path = _target(url)
        self.idle = idle  # under the usual servers' keep-alive timeouts (uvicorn: 5 s)
        self.size = size
        self._free: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """An idle connection still open, or a new one; nothing is written to it yet."""
        now = time.monotonic()
        while self._free:
            since, reader, writer = self._free.pop()
            if now - since < self.idle and not _stale(reader, writer):
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port, ssl=self.tls or None, limit=MAX_HEAD * 4)

    def put(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Keep a connection whose last answer was read to its end."""
        if len(self._free) >= self.size or _stale(reader, writer):
            writer.close()
            return
        self._free.append((time.monotonic(), reader, writer))

    def close(self) -> None:
        """Close every idle connection."""
        for _, _, writer in self._free:
            writer.close()
        self._free.clear()


async def drain(writer: asyncio.StreamWriter) -> None:
    """``writer.drain()`` unless there is nothing it could wait for or raise: the
    transport took every byte written and is open (``drain`` would return at once)."""
    transport = writer.transport
    if transport.get_write_buffer_size() or transport.is_closing():
        await writer.drain()


def _stale(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """The upstream closed the connection, broke it, or sent something nobody asked for."""
    return (writer.is_closing() or reader.at_eof() or reader.exception() is not None
            or bool(getattr(reader, "_buffer", b"")))


def _head_bytes(method: str, path: str, host: str, headers: Headers, body: bytes, keep: bool,
                drop: Collection[str] = (), extra: Headers | None = None) -> bytes:
    """The request's head and body; ``headers`` without those named in ``drop``
    (lowercase), then ``extra``, less those never forwarded."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    if not keep:
        lines.append("Connection: close")
    if drop:
        lines += [f"{k}: {v}" for k, v in headers if (low := k.lower()) not in NOT_FORWARDED and low not in drop]
    else:
        lines += [f"{k}: {v}" for k, v in headers if k.lower() not in NOT_FORWARDED]
    if extra:
        lines += [f"{k}: {v}" for k, v in extra if k.lower() not in NOT_FORWARDED]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def request(url: str, method: str, headers: Headers, body: bytes = b"", pool: Pool | None = None) -> HttpResponse:
    """Send one request to ``url``; the response, body unread. With ``pool`` (for ``url``)
    the connection is one of the pool's and goes back to it on ``close()``; without,
    ``Connection: close``."""
    if pool is None:
        reader, writer, host, path = await open_connection(url)
    else:
        reader, writer = await pool.connect()
        host, path = pool.netloc, pool.path
    return await send(reader, writer, _head_bytes(method, path, host, headers, body, pool is not None), pool)


async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes,
               pool: Pool | None = None) -> HttpResponse:
    """Write a request (``request_bytes``) and read the answer's head; on any error the
    connection is closed, never reused."""
    try:
        writer.write(data)
        await drain(writer)
        resp = await read_response(reader, writer)
    except BaseException:
        writer.close()
        raise
    resp.pool = pool
    return resp


def request_bytes(pool: Pool, method: str, headers: Headers, body: bytes, drop: Collection[str] = (),
                  extra: Headers | None = None) -> bytes:
    """A request for the pool's URL, kept alive: ``headers`` less those named in
    ``drop`` (lowercase), then ``extra``."""
    return _head_bytes(method, pool.path, pool.netloc, headers, body, True, drop, extra)


async def read_response(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> HttpResponse:
    """The response head on ``reader``."""
    head = await _head(reader)
    if head is None:
        raise HttpError("the connection closed before a response")
    first, headers = head
    parts = first.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise HttpError(f"not an HTTP/1.x status line: {first[:80]!r}")
    return HttpResponse(int(parts[1]), headers, reader, writer, keep=_keep(parts[0], headers))


class Out:
    """A response on its way to the client: its head, held until the first write (so head
    and body leave in one send), then the body, in chunks when the head named no length on
    a kept connection. ``end()`` after the last write; ``drain()`` sends the head if
    nothing else was."""

    __slots__ = ("chunked", "head", "writer")

    def __init__(self, writer: asyncio.StreamWriter, head: bytes, chunked: bool) -> None:
        self.writer = writer
        self.head = head
        self.chunked = chunked

    def write(self, data: bytes, last: bool = False) -> None:
        """Send ``data`` (``last``: and end the body)."""
        out = self.head
        self.head = b""
        if data:
            out += b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data
        if last and self.chunked:
            out += b"0\r\n\r\n"
        if out:
            self.writer.write(out)

    def flush(self) -> None:
        """Send the head now if it is still held."""
        if self.head:
            self.write(b"")

    async def drain(self) -> None:
        self.flush()
        await drain(self.writer)

    def end(self) -> None:
        self.write(b"", last=True)


_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 413: "Content Too Large", 415: "Unsupported Media Type",
            421: "Misdirected Request", 500: "Internal Server Error", 502: "Bad Gateway"}
#: Response headers the proxy sets itself (framing, the connection) or leaves out.
_NOT_RELAYED = frozenset({"content-length", "connection", "transfer-encoding", "keep-alive", "date", "server"})


def write_head(writer: asyncio.StreamWriter, status: int, headers: Headers, length: int | None = None,
               keep: bool = False) -> Out:
    """A response head, sent with the first write to the ``Out`` returned (or its
    ``drain``); where its body goes. ``keep``: the connection stays open
    (a body of no given length is then chunked); else ``Connection: close`` (no length:
    the body ends at the close)."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    if not keep:
        lines.append("Connection: close")
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in _NOT_RELAYED]
    bodiless = status < 200 or status in (204, 304)  # framed by its status alone
    if length is not None and not bodiless:
        lines.append(f"Content-Length: {length}")
    elif keep and not bodiless:
        lines.append("Transfer-Encoding: chunked")
    return Out(writer, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), keep and length is None and not bodiless)


async def sse_events(chunks: AsyncIterator[bytes], limit: int = MAX_BODY) -> AsyncIterator[tuple[bytes, Any]]:
    """Each event of a text/event-stream: its raw bytes (blank line included) and its
    ``data`` parsed (``_wire.parse``): None when it has none, an ``Unreadable`` when the
    proxy refuses it. ``TooLarge`` for an event over ``limit`` bytes."""
    buf = b""
    async for c in chunks:
        buf += c.replace(b"\r\n", b"\n")
        while b"\n\n" in buf:
            raw, buf = buf.split(b"\n\n", 1)
            data = b"\n".join(line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:"))
            doc: Any = None
            if data:
                try:
                    doc = parse(data)
                except Unreadable as exc:
                    doc = exc
            yield raw + b"\n\n", doc
        if len(buf) > limit:
            raise TooLarge(f"an event over {limit} bytes")


def sse_event(msg: Any) -> bytes:
    """One message as an SSE event."""
    return b"event: message\ndata: " + json.dumps(msg, separators=(",", ":")).encode() + b"\n\n"


def sse_data(body: bytes) -> bytes | None:
    """A JSON body (one message, as it arrived) as an SSE event, or None when it spans
    lines (an event's ``data`` is one line here: the message is then encoded anew)."""
    data = body.strip(b" \t\r\n")
    if b"\n" in data or b"\r" in data:
        return None
    return b"event: message\ndata: " + data + b"\n\n"
