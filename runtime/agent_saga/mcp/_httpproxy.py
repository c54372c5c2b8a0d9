"""The proxy for Streamable HTTP servers: ``--listen ADDR --upstream URL``.

    agent (MCP client) ──HTTP──▶ HttpProxy (ADDR) ──HTTP──▶ upstream server (URL)

The client's connection is kept alive between requests (HTTP/1.1), and each upstream
request goes out on a kept-alive connection of the proxy's pool (``_http.Pool``).
Each HTTP request is relayed to the upstream with its headers (``Mcp-Session-Id``,
``MCP-Protocol-Version``, ``Authorization``...) and the upstream's response is relayed
back, streamed as it arrives — except the three interpreted methods: a ``tools/call``
becomes a step of the session's saga (``ToolSession``; the answer is an SSE stream when
the client accepts one: the upstream's progress events are relayed as they come, then
the response), and a ``tools/list`` response is read (``--observe``) and, with
``--boundary explicit``, given ``saga_commit`` / ``saga_rollback``.

A session is the upstream's ``Mcp-Session-Id``. It ends **cleanly** with the client's
``DELETE`` (committed); it **drops** when for ``--session-idle`` seconds no request
arrives, no call is in flight and no event stream (``GET``) is open, or when the proxy is
stopped (SIGTERM / SIGINT): rolled back, each inverse called on a fresh session of the
upstream.

Invariants:
- A request is answered only when its ``Host`` is a loopback name or one the proxy was
  told to serve (``--allow-host``; ``agent_saga.hosts``, the debugger UI's rule) — else
  421 — and its ``Origin``, if any, names such a host — else 403: a web page cannot
  drive tool calls through DNS rebinding. A POST whose body is not ``application/json``
  is 415, one over the size limit 413.
- A body that is not JSON, or not JSON-RPC, or that the proxy refuses to read
  (``_wire.parse``), is answered 400 with a JSON-RPC error; the session goes on. A
  request whose id is still in flight in its session is refused the same way.
- An answer of the server's the proxy refuses to read fails the call it answers
  (OUTCOME_UNKNOWN): never relayed, never waited for.
- With credentials in custody (``_custody``): every request upstream carries them (the
  client's own headers of those names are dropped); a credential that cannot be resolved
  refuses the request (-32001), nothing sent; everything the upstream sends back is
  masked before the proxy reads or relays it, and every answer of the proxy's own on
  its way out.
- A call whose response never arrives (the upstream dropped the connection, the client
  cancelled) is STEP_UNKNOWN, answered ``OUTCOME_UNKNOWN``. A call runs in the task of its
  client's connection; a cancellation cancels that task only before the call is sent
  (no response) or while it waits for the upstream's answer (``OUTCOME_UNKNOWN``), never
  once the answer is in. A client that stops reading
  has not cancelled (MCP): the call goes on and is recorded with its answer. A ``tools/call`` is
  written upstream once: a pooled connection found closed is dropped before anything is
  written to it; one that breaks after is never retried.
- What the upstream said reaches the client as its bytes: a call's answer (its event id
  kept, for a client resuming the stream; a JSON body the data of one event when the
  client reads a stream), a ``tools/list`` response unless boundary tools were added,
  an HTTP error status and body (a 4xx: the call was not accepted, STEP_FAILED). A
  ``tools/call`` reaches the upstream as the proxy read it (encoded anew).
- Every answer to the client is framed (a length, or chunks), so the connection can carry
  the next request; an answer cut short closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from .. import hosts
from . import _http as http
from ._custody import CredentialUnavailable, Custody, masked
from ._httpanswer import CallAnswer
from ._loop import loop_name
from ._session import BOUNDARY_TOOLS, OutcomeUnknown, ToolSession
from ._stdio import UpstreamGone
from ._wire import (
    INVALID_REQUEST,
    REFUSED,
    UPSTREAM_UNAVAILABLE,
    Unreadable,
    batch_refusal,
    cancelled_key,
    classify,
    encode,
    error,
    excerpt,
    key,
    parse,
    usable_id,
)

__all__ = ["HttpProxy"]

log = logging.getLogger("agent_saga.mcp")

_JSON = [("Content-Type", "application/json")]


@dataclass
class _Session:
    tools: ToolSession
    last: float = field(default_factory=time.monotonic)
    busy: int = 0
    tasks: dict[str, asyncio.Future[None]] = field(default_factory=dict)  # calls in flight: done when over
    callers: dict[str, asyncio.Task[Any]] = field(default_factory=dict)  # the task each runs in
    sent: set[str] = field(default_factory=set)
    withdrawn: set[str] = field(default_factory=set)  # cancelled before they were sent (no response)
    exchanging: dict[str, asyncio.Task[Any]] = field(default_factory=dict)  # waiting for the upstream's answer
    aborted: set[str] = field(default_factory=set)  # cancelled after they were sent (OUTCOME_UNKNOWN)
    cancelled: set[str] = field(default_factory=set)
    relayed: set[str] = field(default_factory=set)  # requests relayed, not answered yet


class HttpProxy:
    """Streamable HTTP sessions in front of one upstream URL (see the module doc).
    ``new_session`` None: ``--observe`` (nothing gated)."""

    def __init__(self, upstream: str, *, new_session: Callable[[], ToolSession] | None,
                 inject_boundary_tools: bool = False, session_idle: float = 300.0,
                 on_tools: Callable[[list[Any]], None] | None = None,
                 on_call: Callable[[str], None] | None = None, allowed_hosts: Collection[str] = (),
                 max_message: int = http.MAX_BODY, custody: Custody | None = None) -> None:
        self.upstream = upstream
        self.custody = custody if custody else None
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self.max_message = max_message
        self._new = new_session
        self._inject = inject_boundary_tools
        self._idle = session_idle
        self._on_tools = on_tools
        self._on_call = on_call
        self.sessions: dict[str, _Session] = {}
        self.pool = http.Pool(upstream)
        self.port = 0
        self._stop = asyncio.Event()
        self._why = ""

    # ------------------------------------------------------------------ running
    async def serve(self, host: str, port: int, ready: Callable[[int], None] | None = None) -> int:
        """Serve until SIGTERM / SIGINT (or ``stop``); open sessions are then dropped."""
        if host not in ("0.0.0.0", "::", ""):  # the address it listens on is a name it serves
            self.allowed_hosts |= {hosts.host_name(host if ":" not in host else f"[{host}]").lower()}
        server = await asyncio.start_server(self._connection, host, port, limit=http.MAX_HEAD * 4)
        self.port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop, f"the proxy received {signal.Signals(sig).name}")
        log.info("agent-saga mcp: listening on %s:%d, upstream %s, event loop %s", host, self.port, self.upstream,
                 loop_name(loop))
        if ready is not None:
            ready(self.port)
        reaper = asyncio.ensure_future(self._reap())
        try:
            await self._stop.wait()
        finally:
            self._stop.set()
            server.close()
            await asyncio.gather(reaper, return_exceptions=True)  # a rollback it runs is finished first
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
            for sid in list(self.sessions):
                await self._end(sid, False, self._why or "the proxy stopped")
            self.pool.close()
        return 0

    def stop(self, why: str = "the proxy stopped") -> None:
        """Stop serving; every open session is dropped (rolled back)."""
        self._why = why
        self._stop.set()

    async def _reap(self) -> None:
        """End idle sessions until the proxy stops; a rollback under way is finished, never
        cancelled by the stop."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), min(1.0, self._idle / 4))
            if self._stop.is_set():
                return
            now = time.monotonic()
            for sid, s in list(self.sessions.items()):
                if s.busy == 0 and now - s.last > self._idle:
                    await self._end(sid, False, f"no request for {self._idle:g}s: the session was abandoned")

    async def _end(self, sid: str, clean: bool, why: str = "") -> None:
        s = self.sessions.pop(sid, None)
        if s is None:
            return
        for k in list(s.tasks):
            if k in s.sent:
                _abort(s, k)
            else:
                _withdraw(s, k)
        await asyncio.gather(*s.tasks.values(), return_exceptions=True)
        outcome = await s.tools.end(clean, why)
        if not clean:
            log.warning("agent-saga mcp: session %s dropped (%s)", sid or "-", why)
        if outcome:
            log.info("agent-saga mcp: %s", outcome)

    def _session(self, sid: str) -> _Session | None:
        if self._new is None:
            return None
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = _Session(self._new())
        s.last = time.monotonic()
        return s

    # ------------------------------------------------------------------ one request
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; what it would have read is in the WAL
        except asyncio.CancelledError:
            pass  # the proxy is shutting down: the open stream (a GET) ends here
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read and answer one request; whether the connection can carry another."""
        try:
            req = await http.read_request(reader, self.max_message)
        except http.TooLarge as exc:
            await self._reply(writer, 413, error(None, INVALID_REQUEST, f"Invalid Request: {exc}, which the agent-saga "
                                            "proxy refuses"))
            return False
        except (http.HttpError, ValueError) as exc:
            await self._reply(writer, 400, error(None, INVALID_REQUEST, f"not an HTTP request the proxy reads: {exc}"))
            return False
        if req is None:
            return False
        refused = http.refused(req, self.allowed_hosts)
        if refused is not None:
            log.warning("agent-saga mcp: refused an HTTP %s: %s", req.method, refused[1])
            await self._reply(writer, refused[0], error(None, INVALID_REQUEST, refused[1]), req.keep)
            return req.keep
        sid = http.header(req.headers, "mcp-session-id") or ""
        if req.method == "POST":
            return await self._post(req, sid, writer) and req.keep
        if req.method == "GET":  # the server's event stream: the session is in use while it is open
            s = self.sessions.get(sid)
            if s is not None:
                s.busy += 1
            try:
                await self._relay(req, writer, client=reader)
            finally:
                if s is not None:
                    s.busy -= 1
                    s.last = time.monotonic()
            return False  # watching for the client's close may have read into its next request
        if req.method == "DELETE":
            status = await self._relay(req, writer)
            if 200 <= status < 300:
                await self._end(sid, True)
            return req.keep
        await self._reply(writer, 405, error(None, INVALID_REQUEST, f"{req.method} is not part of MCP's HTTP "
                                        "transport (POST, GET, DELETE)"), req.keep)
        return req.keep

    async def _post(self, req: http.HttpRequest, sid: str, writer: asyncio.StreamWriter) -> bool:
        """Answer a POST; whether its answer was whole (the connection can go on)."""
        try:
            msg = parse(req.body)
        except Unreadable as exc:
            log.warning("agent-saga mcp: refused a message from the client (%s): %s", exc.message, excerpt(req.body))
            await self._reply(writer, 400, error(exc.id, exc.code, exc.message), req.keep)
            return True
        s = self.sessions.get(sid)
        if isinstance(msg, list):
            refusal = batch_refusal(msg)
            if refusal is None and s is not None and {key(m["id"]) for m in msg if "id" in m} & (set(s.tasks)
                                                                                               | s.relayed):
                refusal = [error(None, INVALID_REQUEST, "Invalid Request: a request id of the batch is still in flight")]
            if refusal is not None:
                log.warning("agent-saga mcp: refused a batch from the client (%s)", refusal[0]["error"]["message"])
                await self._reply(writer, 400, refusal, req.keep)
                return True
            await self._relay(req, writer)
            return True
        kind, why = classify(msg)
        if kind == "invalid":
            if msg.get("method") == "tools/call":
                log.warning("agent-saga mcp: refused a tools/call without an id (never forwarded)")
            await self._reply(writer, 400, error(usable_id(msg), INVALID_REQUEST, f"Invalid Request: {why}"), req.keep)
            return True
        if s is not None:
            s.last = time.monotonic()
            if kind == "request" and (key(msg["id"]) in s.tasks or key(msg["id"]) in s.relayed):
                log.warning("agent-saga mcp: refused a %s whose id is still in flight", msg["method"])
                await self._reply(writer, 400, error(msg["id"], INVALID_REQUEST, (
                    f"Invalid Request: a request with the id {key(msg['id'])} is still in flight; give each request an "
                    f"id of its own (this {msg['method']} was not sent)")), req.keep)
                return True
        if kind == "request" and msg["method"] == "tools/call":
            session = self._session(sid)
            if session is not None:
                return await self._tools_call(req, msg, session, writer)
            params = msg.get("params")
            if self._on_call is not None and isinstance(params, dict) and isinstance(params.get("name"), str):
                self._on_call(params["name"])
        if kind == "notification" and msg["method"] == "notifications/cancelled" and s is not None:
            self._cancelled(s, msg)
        relayed = key(msg["id"]) if kind == "request" and s is not None else None
        if relayed is not None and s is not None:
            s.relayed.add(relayed)
        try:
            return await self._relay(req, writer, rewrite=msg["id"] if kind == "request" and msg["method"] == "tools/list"
                              else None, id_=msg.get("id")) > 0  # a status: the answer was whole
        finally:
            if relayed is not None and s is not None:
                s.relayed.discard(relayed)

    def _cancelled(self, s: _Session, msg: dict[str, Any]) -> None:
        k = cancelled_key(msg)
        if k is None or k not in s.tasks:
            return
        s.cancelled.add(k)
        if k in s.sent:
            _abort(s, k)
        else:
            _withdraw(s, k)  # still at the gate: never sent

    async def _tools_call(self, req: http.HttpRequest, msg: dict[str, Any], s: _Session,
                          writer: asyncio.StreamWriter) -> bool:
        k = key(msg["id"])
        out = CallAnswer(writer, "text/event-stream" in (http.header(req.headers, "accept") or ""),
                         http.header(req.headers, "mcp-session-id"), self.custody, req.keep)
        s.busy += 1

        async def forward(m: dict[str, Any]) -> dict[str, Any]:
            return await self._forward(req, m, s, k, out)

        # The call runs in this connection's task (it carries nothing else until the call
        # is answered); a cancellation before it is sent (``_withdraw``) cancels it there.
        task = asyncio.current_task()
        assert task is not None
        s.tasks[k] = asyncio.get_running_loop().create_future()
        s.callers[k] = task
        try:
            reply = await s.tools.call(msg, forward=forward)
        except asyncio.CancelledError:
            if k in s.withdrawn:
                s.withdrawn.discard(k)
                if task.uncancel() == 0:  # nothing else cancels this connection
                    return await out.unanswered()  # cancelled by the client before it was sent: no response
            raise
        finally:
            s.busy -= 1
            s.last = time.monotonic()
            s.tasks.pop(k).set_result(None)
            del s.callers[k]
            s.sent.discard(k)
            s.aborted.discard(k)
            if k in s.withdrawn:  # the call ended before its cancellation arrived
                s.withdrawn.discard(k)
                task.uncancel()
        if k in s.cancelled:
            s.cancelled.discard(k)
            return await out.unanswered()  # a cancelled request gets no response
        return await out.finish(reply)

    async def _forward(self, req: http.HttpRequest, m: dict[str, Any], s: _Session, k: str,
                       out: CallAnswer) -> dict[str, Any]:
        """Send the call upstream; its response. Events before it are relayed to the client
        (``out``) while it reads them; a client that went away does not end the call (MCP:
        a disconnection is not a cancellation), it is answered and recorded all the same.
        ``out`` keeps the upstream's answer as it arrived (masked)."""
        custody = self.custody
        held = custody.headers() if custody is not None else None  # CredentialUnavailable: refused, nothing sent
        try:
            reader, up = await self.pool.connect()
        except (OSError, http.HttpError) as exc:
            raise UpstreamGone(f"the upstream {self.upstream} cannot be reached ({exc})") from None
        s.sent.add(k)  # from here on the call may have happened: never sent again
        # = the client's headers with the credentials in custody in place of its own
        # (``_upstream_headers``), in one pass
        # The call as the proxy read it (and the gate judged it), encoded anew: a number the
        # proxy rounded reaches the upstream as the proxy read it, never as the client wrote it.
        data = http.request_bytes(self.pool, "POST", req.headers, encode(m),
                                  custody.names() if custody is not None else (), held)
        # The exchange runs in this task; a cancellation (``_abort``) cancels it while it
        # waits for the upstream, and only then (no task or race per call).
        task = asyncio.current_task()
        assert task is not None
        s.exchanging[k] = task
        try:
            resp = await http.send(reader, up, data, self.pool)
            try:
                return await self._answer(resp, m["id"], out)
            finally:
                resp.close()  # back to the pool only when read to its end
        except asyncio.CancelledError:
            up.close()
            if k in s.aborted and task.uncancel() == 0:
                raise OutcomeUnknown("the call was cancelled after it was sent") from None
            raise
        except (OSError, http.HttpError, asyncio.IncompleteReadError, ValueError) as exc:
            up.close()
            raise OutcomeUnknown(f"the connection to the upstream broke during the call ({exc})") from None
        except BaseException:
            up.close()
            raise
        finally:
            del s.exchanging[k]

    async def _answer(self, resp: http.HttpResponse, id_: Any, out: CallAnswer) -> dict[str, Any]:
        """The upstream's response to the call ``id_``: its progress events relayed to the
        client (``out``) as they come; ``out`` keeps the answer's own bytes, or the
        upstream's HTTP refusal as it came."""
        if resp.content_type == "text/event-stream" and 200 <= resp.status < 300:
            await out.open()
            async for raw, doc in http.sse_events(masked(resp.chunks(), self.custody), self.max_message):
                if isinstance(doc, Unreadable):
                    log.error("agent-saga mcp: refused an event from the upstream (%s): %s", doc.message,
                              excerpt(raw))
                    if doc.id == id_:
                        raise OutcomeUnknown(f"the server's answer was refused by the agent-saga proxy: "
                                             f"{doc.message}")
                    continue  # never relayed
                if isinstance(doc, dict) and "method" not in doc and doc.get("id") == id_:
                    out.upstream = (doc, raw, None)
                    return doc
                await out.open(raw)
            raise OutcomeUnknown("the upstream closed its event stream before answering the call")
        data = await resp.body(self.max_message)
        if self.custody is not None:
            data = self.custody.redact(data)
        if not 200 <= resp.status < 300:  # relayed as it came (a session the server no longer knows: 404)
            out.refused = (resp.status, self.custody.redact_headers(resp.headers) if self.custody else resp.headers,
                           data)
        try:
            doc = parse(data)
        except Unreadable as exc:
            log.error("agent-saga mcp: refused a message from the upstream (%s): %s", exc.message, excerpt(data))
            raise OutcomeUnknown(f"the upstream answered HTTP {resp.status} with a message the agent-saga proxy "
                                 f"refuses: {exc.message}") from None
        if isinstance(doc, dict) and doc.get("id") == id_:
            out.upstream = (doc, data, resp.status)
            return doc
        if 400 <= resp.status < 500:  # MCP: the server could not accept the message; it did not run
            why: dict[str, Any] = doc["error"] if isinstance(doc, dict) and isinstance(doc.get("error"), dict) \
                else {}
            code = why.get("code")
            return error(id_, code if isinstance(code, int) else INVALID_REQUEST,
                         f"the upstream refused the call with HTTP {resp.status}: {why.get('message', '')}")
        raise OutcomeUnknown(f"the upstream answered HTTP {resp.status} without this call's response")

    async def _relay(self, req: http.HttpRequest, writer: asyncio.StreamWriter, rewrite: Any = None,
                     client: asyncio.StreamReader | None = None, id_: Any = None) -> int:
        """Send ``req`` upstream and stream the answer back; the status. With ``client``,
        the stream also ends when the client closes its connection."""
        try:
            headers = self._upstream_headers(req)
        except CredentialUnavailable as exc:
            log.error("agent-saga mcp: refused an HTTP %s: %s", req.method, exc.message)
            await self._reply(writer, 200 if req.method == "POST" else 403, error(
                id_, REFUSED, f"agent-saga refused the request: {exc.message}. Nothing was executed."), req.keep)
            return 403
        try:
            resp = await http.request(self.upstream, req.method, headers, req.body, self.pool)
        except (OSError, http.HttpError, asyncio.IncompleteReadError) as exc:
            await self._reply(writer, 502, error(None, UPSTREAM_UNAVAILABLE, f"the upstream {self.upstream} cannot be "
                                            f"reached: {exc}"), req.keep)
            return 502
        try:
            head = self.custody.redact_headers(resp.headers) if self.custody else resp.headers
            if rewrite is not None and resp.status == 200:
                body = await resp.body(self.max_message)
                if self.custody is not None:
                    body = self.custody.redact(body)
                if resp.content_type == "text/event-stream":
                    buf = bytearray()
                    async for raw, doc in http.sse_events(_once(body), self.max_message):
                        if isinstance(doc, dict) and doc.get("id") == rewrite and "result" in doc \
                                and self._tools_listed(doc):
                            raw = http.sse_event(doc)
                        buf += raw
                    body = bytes(buf)
                elif resp.content_type == "application/json":
                    with contextlib.suppress(Unreadable):
                        doc = parse(body)
                        if isinstance(doc, dict) and "result" in doc and self._tools_listed(doc):
                            body = encode(doc)
                http.write_head(writer, resp.status, head, len(body), req.keep).write(body)
                await http.drain(writer)
                return resp.status
            length = http.header(resp.headers, "content-length")
            sized = length is not None and "chunked" not in (http.header(resp.headers, "transfer-encoding") or "")
            # masking keeps lengths: a sized answer is relayed with its length
            out = http.write_head(writer, resp.status, head, int(length) if sized and length else None,
                                  req.keep and client is None)
            if client is not None:
                await out.drain()  # an event stream opens at once

            async def copy() -> None:
                async for chunk in masked(resp.chunks(), self.custody):
                    out.write(chunk)
                    await out.drain()
                out.end()

            if client is None:
                await copy()
                if sized and not resp.complete:  # the client was promised a length: it cannot read on
                    raise ConnectionError("the upstream's answer was cut short")
                return resp.status
            copier = asyncio.ensure_future(copy())
            gone = asyncio.ensure_future(client.read(1))  # the client sends nothing more: b"" is its close
            waiting: set[asyncio.Future[Any]] = {copier, gone}
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in waiting:
                    t.cancel()
                await asyncio.gather(*waiting, return_exceptions=True)
            return resp.status
        finally:
            resp.close()

    async def _reply(self, writer: asyncio.StreamWriter, status: int, doc: Any, keep: bool = False) -> None:
        await _reply(writer, status, doc, self.custody, keep)

    def _upstream_headers(self, req: http.HttpRequest) -> http.Headers:
        """The client's headers with the credentials in custody in place of its own
        (``CredentialUnavailable``)."""
        if self.custody is None:
            return req.headers
        names = self.custody.names()
        return [(k, v) for k, v in req.headers if k.lower() not in names] + self.custody.headers()

    def _tools_listed(self, msg: dict[str, Any]) -> bool:
        """Read a ``tools/list`` response; True if the boundary tools were added to it
        (else the upstream's bytes are relayed as they are)."""
        result = msg.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return False
        if self._on_tools is not None:
            self._on_tools(result["tools"])
        if not self._inject or result.get("nextCursor"):
            return False
        names = {t.get("name") for t in result["tools"] if isinstance(t, dict)}
        result["tools"] = [*result["tools"], *(t for t in BOUNDARY_TOOLS if t["name"] not in names)]
        return True


def _abort(s: _Session, k: str) -> None:
    """End the sent call ``k`` as OUTCOME_UNKNOWN if it still waits for the upstream's
    answer (once); an answer already in is kept."""
    task = s.exchanging.get(k)
    if task is not None and k not in s.aborted:
        s.aborted.add(k)
        task.cancel()


def _withdraw(s: _Session, k: str) -> None:
    """Cancel the call ``k``, not sent yet (once)."""
    if k not in s.withdrawn:
        s.withdrawn.add(k)
        s.callers[k].cancel()


async def _once(body: bytes) -> Any:
    yield body


async def _reply(writer: asyncio.StreamWriter, status: int, doc: Any, custody: Custody | None = None,
                 keep: bool = False) -> None:
    body = encode(doc) if custody is None else custody.redact(encode(doc))
    http.write_head(writer, status, _JSON, len(body), keep).write(body)
    await http.drain(writer)
