"""A small JSON-over-HTTP client on the standard library, blocking and async.

``request`` sends over ``urllib.request`` (a blocking call: the tool pool runs it);
``arequest`` speaks HTTP/1.1 itself over ``asyncio.open_connection`` (TLS through ``ssl``
for https), so a connector awaiting it holds no thread: the request, the answer and the
connection all stay on the event loop. Both send the same request and give the same
answers and errors. The Stripe and Salesforce connectors use them in production and
their tests drive them against local servers, so what is tested is what runs. Neither
puts a request header (credentials) into an error message.

``arequest`` does not tunnel through an HTTP proxy: when the environment names one for
the URL (``https_proxy``, ``http_proxy``, not bypassed by ``no_proxy``) it sends through
``request`` on the tool pool, which honours it. Resolving a host name (not an IP address)
uses asyncio's resolver, which looks it up on asyncio's default executor.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

__all__ = ["HTTPFailure", "arequest", "request"]

DEFAULT_TIMEOUT = 30.0
MAX_BODY = 64 * 1024 * 1024  # an answer larger than this is refused, not buffered


class HTTPFailure(RuntimeError):
    """The server answered with an error status; ``body`` is its parsed JSON (or text)."""

    def __init__(self, method: str, url: str, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        path = urllib.parse.urlsplit(url).path
        super().__init__(f"{method} {path} answered {status}: {_short(body)}")


def _short(body: Any) -> str:
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    return text[:300]


def _prepare(
    url: str, headers: Mapping[str, str], form: Mapping[str, Any] | None, json_body: Any, query: Mapping[str, Any] | None,
) -> tuple[str, bytes | None, dict[str, str]]:
    if query:
        url = f"{url}?{urllib.parse.urlencode(query)}"
    data: bytes | None = None
    hdrs = dict(headers)
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        hdrs["Content-Type"] = "application/x-www-form-urlencoded"
    elif json_body is not None:
        data = json.dumps(json_body).encode()
        hdrs["Content-Type"] = "application/json"
    return url, data, hdrs


def _answer(method: str, url: str, status: int, raw: bytes) -> Any:
    if status >= 300:  # (urllib follows redirects; arequest does not, and never takes one for success)
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        raise HTTPFailure(method, url, status, body)
    return json.loads(raw) if raw else None


def request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    form: Mapping[str, Any] | None = None,
    json_body: Any = None,
    query: Mapping[str, Any] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Any:
    """Send one request and return the parsed JSON body (``None`` for an empty one).

    ``form`` is sent ``application/x-www-form-urlencoded``, ``json_body`` as JSON. Raises
    ``HTTPFailure`` for a status >= 400, ``OSError`` (``urllib.error.URLError``,
    ``TimeoutError``) when the server cannot be reached or does not answer in time.
    """
    url, data, hdrs = _prepare(url, headers, form, json_body, query)
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        # An opener per call (not urlopen's, built once): the proxy it takes from the environment
        # is the one ``arequest`` checks at the same moment.
        with urllib.request.build_opener().open(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return _answer(method, url, status, raw)


async def arequest(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    form: Mapping[str, Any] | None = None,
    json_body: Any = None,
    query: Mapping[str, Any] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Any:
    """``request`` on the event loop (module doc): the same request, answer and errors
    (``HTTPFailure``; ``OSError`` - ``ConnectionRefusedError``, ``TimeoutError``,
    ``ssl.SSLError``, ``ConnectionError`` for an answer cut short)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {parts.scheme}://{parts.hostname or ''}{parts.path}")
    if _proxied(parts):
        from ..executor import get_tool_executor

        kw = {"method": method, "url": url, "headers": headers, "form": form, "json_body": json_body,
              "query": query, "timeout": timeout}
        return await get_tool_executor().submit(lambda: request(**kw), {})
    url, data, hdrs = _prepare(url, headers, form, json_body, query)
    parts = urllib.parse.urlsplit(url)
    async with asyncio.timeout(timeout):
        status, raw = await _exchange(method, parts, data, hdrs)
    return _answer(method, url, status, raw)


def _proxied(parts: urllib.parse.SplitResult) -> bool:
    proxies = urllib.request.getproxies()
    return bool(proxies.get(parts.scheme)) and not urllib.request.proxy_bypass(parts.netloc)


_TLS: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    global _TLS
    if _TLS is None:
        _TLS = ssl.create_default_context()  # the system's CAs, hostname checked: what urllib uses
    return _TLS


async def _exchange(
    method: str, parts: urllib.parse.SplitResult, data: bytes | None, hdrs: Mapping[str, str]
) -> tuple[int, bytes]:
    https = parts.scheme == "https"
    host = str(parts.hostname)
    port = parts.port or (443 if https else 80)
    reader, writer = await asyncio.open_connection(host, port, ssl=_tls() if https else None)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = host if ":" not in host else f"[{host}]"
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}" + (f":{parts.port}" if parts.port else ""),
                 "Connection: close", "Accept-Encoding: identity", f"Content-Length: {len(data or b'')}",
                 *(f"{k}: {v}" for k, v in hdrs.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (data or b""))
        await writer.drain()
        try:
            return await _response(method, reader)
        except (asyncio.IncompleteReadError, ValueError) as exc:
            raise ConnectionError(f"{method} {parts.path}: the server's answer was cut short or malformed") from exc
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass  # the answer is in; a close the peer already made is no error


async def _response(method: str, reader: asyncio.StreamReader) -> tuple[int, bytes]:
    while True:
        status_line = await reader.readline()
        fields = status_line.split(None, 2)
        if len(fields) < 2 or not fields[0].startswith(b"HTTP/"):
            raise ValueError("no HTTP status line")
        status = int(fields[1])
        head: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            head[name.strip().lower()] = value.strip()
        if not 100 <= status < 200:
            break  # an interim answer (100 Continue) is followed by the real one
    if method == "HEAD" or status in (204, 304):
        return status, b""
    if "chunked" in head.get("transfer-encoding", "").lower():
        return status, await _chunks(reader)
    if "content-length" in head:
        size = int(head["content-length"])
        if size > MAX_BODY:
            raise ValueError("answer too large")
        return status, await reader.readexactly(size)
    raw = bytearray()  # no length: the body runs to the close
    while chunk := await reader.read(65536):
        raw += chunk
        if len(raw) > MAX_BODY:
            raise ValueError("answer too large")
    return status, bytes(raw)


async def _chunks(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while size := int((await reader.readline()).split(b";")[0].strip() or b"x", 16):
        if len(body) + size > MAX_BODY:
            raise ValueError("answer too large")
        body += await reader.readexactly(size)
        await reader.readexactly(2)  # the chunk's CRLF
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass  # trailers
    return bytes(body)
