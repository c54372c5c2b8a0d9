"""The proxy: one client session in front of one upstream MCP server, JSON-RPC routed by hand.

    client (agent) ──stdin/stdout──▶ McpProxy ──stdin/stdout──▶ upstream server (child)

Only three methods are interpreted. ``tools/call`` requests become saga steps
(``ToolSession``); ``tools/list`` responses are read (the tool surface in ``--observe``)
and, with ``--boundary explicit``, get ``saga_commit`` / ``saga_rollback`` appended;
``initialize`` is forwarded and noted. Everything else — notifications (progress,
``list_changed``, cancellation), requests either way (sampling, elicitation, roots, ping,
resources, prompts, methods not invented yet), their responses, batches — is forwarded
as the very line that arrived. A batch holding an interpreted request cannot be split
without changing what the sender sees, so it is answered with one ``Invalid Request``
per request (MCP itself no longer sends batches).

How the session ends decides the saga (``--boundary session`` / ``explicit``): the client
closes stdin with no call in flight and its process still alive — clean, committed;
the client process died (the proxy's parent is gone), a call was still in flight,
the proxy got SIGTERM / SIGINT first, or the upstream exited — dropped, rolled back
(the compensating tools are called on the upstream; on a fresh one if it died).

Invariants:
- Malformed input from either side gets a JSON-RPC error (``Parse error``, ``Invalid
  Request``) sent back to that side, and the session goes on. What the proxy refuses to
  read (``_wire.parse``: duplicate keys, too deep, too large, lone surrogates) is never
  forwarded; an answer of the server's it refuses fails the call it answers (a
  ``tools/call``: OUTCOME_UNKNOWN, it may have happened), so no call waits forever.
- A client request whose id is still in flight (a call, a forwarded request, the
  proxy's own) or could be the proxy's own (``agent-saga:...``) is refused: two answers
  with one id would cross.
- A batch from the server is taken apart: each answer reaches the call it answers.
- A client's ``notifications/cancelled`` for a call already sent is forwarded, and the
  step is STEP_UNKNOWN; for a call still at the gate, the call is dropped unsent.
- Responses to the proxy's own requests (ids ``agent-saga:<n>``) never reach the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import stat
import sys
from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError
from ._custody import CredentialUnavailable
from ._session import BOUNDARY_TOOLS, OutcomeUnknown, ToolSession
from ._stdio import MAX_LINE, StdioUpstream, UpstreamGone, read_line
from ._wire import (
    INTERNAL_ERROR,
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
    top_id,
    usable_id,
)

__all__ = ["ClientChannel", "McpProxy", "stdio_client_channel"]

log = logging.getLogger("agent_saga.mcp")

#: How long after the client's stdin closed the proxy waits to learn whether the client
#: process died (a crash closes its pipes a moment before it is reaped).
PARENT_EXIT_WAIT = 0.25


class ClientChannel:
    """The client side: lines in, lines out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None,
                 limit: int = MAX_LINE) -> None:
        self.reader = reader
        self.writer = writer
        self.limit = limit  # the reader's limit: the largest message read
        self.closed = False
        self.mask: Callable[[bytes], bytes] | None = None  # credentials in custody, masked on the way out

    async def send(self, line: bytes) -> None:
        """Write one line to the client; a client that is gone is noted, never raised."""
        if self.writer is None or self.closed:
            return
        if self.mask is not None:
            line = self.mask(line)
        try:
            self.writer.write(line if line.endswith(b"\n") else line + b"\n")
            await self.writer.drain()
        except (ConnectionError, RuntimeError):
            self.closed = True  # the client is gone; what it would have read is in the WAL


async def stdio_client_channel(limit: int = MAX_LINE) -> ClientChannel:
    """The proxy's own stdin and stdout as the client channel (messages up to ``limit`` bytes)."""
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)):
        if stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            raise ConfigurationError(
                f"{name} is a regular file here, but the proxy speaks MCP on its stdin and stdout, which an "
                f"MCP client connects as pipes: pipe it instead (e.g. `... | tee proxy.out`), or let the "
                f"MCP client start the proxy")
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout.buffer)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return ClientChannel(reader, writer, limit)


class McpProxy:
    """One session (see the module doc). ``session`` None: ``--observe`` (nothing gated)."""

    def __init__(self, upstream: StdioUpstream, *, inject_boundary_tools: bool = False,
                 on_tools: Callable[[list[Any]], None] | None = None,
                 on_call: Callable[[str], None] | None = None) -> None:
        self.upstream = upstream
        self.session: ToolSession | None = None
        self._inject = inject_boundary_tools
        self._on_tools = on_tools
        self._on_call = on_call
        self._client: ClientChannel | None = None
        self._calls: dict[str, asyncio.Future[dict[str, Any]]] = {}   # sent, waiting for the upstream
        self._tasks: dict[str, asyncio.Task[None]] = {}               # every tools/call being handled
        self._cancelled: set[str] = set()
        self._pending: set[str] = set()                               # client requests forwarded, unanswered
        self._lists: set[str] = set()
        self._stop = asyncio.Event()
        self._stop_why = ""
        self.outcome = ""

    # ------------------------------------------------------------------ running
    async def serve(self, client: ClientChannel) -> int:
        """Run the session to its end; 0 when it ended cleanly, 1 otherwise."""
        self._client = client
        ppid = os.getppid()
        pidfd = _pidfd(ppid)
        if self.upstream.custody is not None:
            client.mask = self.upstream.custody.redact
        try:
            await self.upstream.start()
        except CredentialUnavailable as exc:  # not started: every request is refused, naming the reference
            log.error("agent-saga mcp: the upstream was not started: %s", exc.message)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._signalled, sig)
        up = asyncio.ensure_future(self._upstream_loop())
        down = asyncio.ensure_future(self._client_loop())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({up, down, stop}, return_when=asyncio.FIRST_COMPLETED)
            if down.done() and not stop.done() and not up.done():
                clean, why = not self._tasks, "a call was still in flight when the client closed the session"
                if clean and await loop.run_in_executor(None, _parent_died, ppid, pidfd):
                    clean, why = False, "the client process died"
            elif up.done():
                clean, why = False, self.upstream.gone or "the upstream server exited"
            else:
                clean, why = False, self._stop_why
            if not clean:
                log.warning("agent-saga mcp: the session was dropped (%s)", why)
            await self._abandon_calls(why)
            if self.session is not None:
                self.outcome = await self.session.end(clean, why)
                if self.outcome:
                    log.info("agent-saga mcp: %s", self.outcome)
            return 0 if clean else 1
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
            if pidfd is not None:
                os.close(pidfd)
            await self.upstream.stop()
            for t in (up, down, stop):
                t.cancel()
            await asyncio.gather(up, down, stop, return_exceptions=True)

    def _signalled(self, sig: int) -> None:
        self._stop_why = f"the proxy received {signal.Signals(sig).name}"
        self._stop.set()

    async def _abandon_calls(self, why: str) -> None:
        """The session is over: calls still waiting for the upstream are unknown (it is told
        to cancel them); calls still at the gate are dropped unsent."""
        for k, fut in list(self._calls.items()):
            with contextlib.suppress(UpstreamGone):
                await self.upstream.notify("notifications/cancelled", {"requestId": json.loads(k), "reason": why})
            if not fut.done():
                fut.set_exception(OutcomeUnknown(f"the session ended while the call was running ({why})"))
        for k, task in list(self._tasks.items()):
            if k not in self._calls:
                task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    # ------------------------------------------------------------------ client -> upstream
    async def _client_loop(self) -> None:
        assert self._client is not None
        reader = self._client.reader
        while True:
            line, whole = await read_line(reader)
            if not line:
                return
            if not whole or line.strip():
                await self._from_client(line, whole)

    async def _from_client(self, line: bytes, whole: bool = True) -> None:
        try:
            if not whole:
                raise Unreadable(INVALID_REQUEST, f"Invalid Request: the message is over {self._client.limit if self._client else MAX_LINE} bytes, "
                                 f"which the agent-saga proxy refuses", top_id(line.decode("utf-8", "replace")))
            msg = parse(line)
        except Unreadable as exc:
            log.warning("agent-saga mcp: refused a message from the client (%s): %s", exc.message, excerpt(line))
            await self._to_client(error(exc.id, exc.code, exc.message))
            return
        if isinstance(msg, list):
            await self._client_batch(msg, line)
            return
        kind, why = classify(msg)
        if kind == "invalid":
            if msg.get("method") == "tools/call":
                log.warning("agent-saga mcp: refused a tools/call without an id (never forwarded): %s", excerpt(line))
            await self._to_client(error(usable_id(msg), INVALID_REQUEST, f"Invalid Request: {why}"))
            return
        if kind == "request":
            method = msg["method"]
            k = key(msg["id"])
            if self._id_taken(msg["id"]):
                log.warning("agent-saga mcp: refused a %s whose id %s is still in flight", method, k)
                await self._to_client(error(msg["id"], INVALID_REQUEST, (
                    f"Invalid Request: a request with the id {k} is still in flight; give each request an id of its "
                    f"own (this {method} was not sent)")))
                return
            if method == "tools/call" and self.session is not None:
                self._tasks[k] = asyncio.ensure_future(self._call(k, msg))
                return
            if method == "tools/call" and self._on_call is not None:
                params = msg.get("params")
                if isinstance(params, dict) and isinstance(params.get("name"), str):
                    self._on_call(params["name"])
            if method == "tools/list":
                self._lists.add(k)
            self._pending.add(k)
        elif kind == "notification" and msg["method"] == "notifications/cancelled":
            self._client_cancelled(msg)
        await self._to_upstream(line, msg)

    async def _client_batch(self, batch: list[Any], line: bytes) -> None:
        refusal = batch_refusal(batch)
        if refusal is None:
            requests = [m for m in batch if classify(m)[0] == "request"]
            ids = {key(m["id"]) for m in requests}
            if len(ids) < len(requests) or any(self._id_taken(m["id"]) for m in requests):
                refusal = [error(usable_id(m), INVALID_REQUEST, "Invalid Request: a request id of the batch is still "
                                 "in flight or repeated; give each request an id of its own") for m in requests]
            else:
                self._pending |= ids
                await self._to_upstream(line, None)
                return
        log.warning("agent-saga mcp: refused a batch from the client (%s)", refusal[0]["error"]["message"])
        if self._client is not None:
            await self._client.send(encode(refusal if batch else refusal[0]))

    def _id_taken(self, id_: Any) -> bool:
        """True if a client request may not use ``id_``: a request with it is in flight (a
        call, a forwarded request, one of the proxy's own), or it has the form of the
        proxy's own ids (``agent-saga:...``), whose answers go to the proxy, not a client."""
        k = key(id_)
        own = isinstance(id_, str) and id_.startswith("agent-saga:")
        return own or k in self._tasks or k in self._pending or self.upstream.waiting(k)

    def _client_cancelled(self, msg: dict[str, Any]) -> None:
        k = cancelled_key(msg)
        if k is not None:
            self._pending.discard(k)
        if k is None or k not in self._tasks:
            return
        self._cancelled.add(k)
        fut = self._calls.get(k)
        if fut is None:
            self._tasks[k].cancel()  # still at the gate: never sent
        elif not fut.done():
            fut.set_exception(OutcomeUnknown("the client cancelled the call after it was sent"))

    async def _call(self, k: str, msg: dict[str, Any]) -> None:
        assert self.session is not None
        try:
            reply = await self.session.call(msg)
        finally:
            self._tasks.pop(k, None)
        if k in self._cancelled:
            self._cancelled.discard(k)
            return  # a cancelled request gets no response
        await self._to_client(reply)

    async def forward_call(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send the client's ``tools/call`` upstream; the response (what the engine's
        forward returns). ``UpstreamGone``: not sent; ``OutcomeUnknown``: sent, no answer."""
        if self.upstream.refused is not None:
            raise CredentialUnavailable(self.upstream.refused)
        if not self.upstream.alive:
            raise UpstreamGone(self.upstream.gone or "the upstream server is not running")
        k = key(msg["id"])
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[k] = fut
        try:
            try:
                await self.upstream.send(encode(msg))
            except UpstreamGone as exc:
                raise OutcomeUnknown(f"the upstream stopped reading while the call was sent ({exc})") from None
            return await fut
        finally:
            self._calls.pop(k, None)

    async def _to_upstream(self, line: bytes, msg: Any) -> None:
        try:
            await self.upstream.send(line)
        except UpstreamGone as exc:
            if isinstance(msg, dict) and classify(msg)[0] == "request":
                self._pending.discard(key(msg["id"]))
                if self.upstream.refused is not None:
                    await self._to_client(error(msg["id"], REFUSED, f"agent-saga refused {msg['method']}: "
                                                f"{self.upstream.refused}. Nothing was executed."))
                    return
                await self._to_client(error(msg["id"], UPSTREAM_UNAVAILABLE, f"the upstream server is gone: {exc}"))

    async def _to_client(self, msg: Any) -> None:
        if self._client is not None:
            await self._client.send(encode(msg))

    # ------------------------------------------------------------------ upstream -> client
    async def _upstream_loop(self) -> None:
        if self.upstream.refused is not None:
            await asyncio.Event().wait()  # no server to read: the session ends from the client's side
        try:
            await self.upstream.read_loop(self._from_upstream)
        finally:
            gone = self.upstream.gone or "the upstream server exited"
            for fut in self._calls.values():
                if not fut.done():
                    fut.set_exception(OutcomeUnknown(f"{gone} during the call"))

    async def _from_upstream(self, line: bytes, whole: bool = True) -> None:
        try:
            if not whole:
                raise Unreadable(INVALID_REQUEST, f"Invalid Request: the message is over {self.upstream.limit} bytes, "
                                 f"which the agent-saga proxy refuses", top_id(line.decode("utf-8", "replace")))
            msg = parse(line)
        except Unreadable as exc:
            await self._upstream_unreadable(line, exc)
            return
        if isinstance(msg, list):  # taken apart: each answer reaches the call it answers
            for m in msg:
                await self._upstream_message(m, encode(m))
            return
        await self._upstream_message(msg, line)

    async def _upstream_message(self, msg: Any, line: bytes) -> None:
        kind, why = classify(msg)
        if kind == "invalid":
            await self._upstream_unreadable(line, Unreadable(INVALID_REQUEST, f"Invalid Request: {why}", usable_id(msg)))
            return
        if kind == "response":
            if self.upstream.take_own(msg):
                return
            k = key(msg["id"])
            fut = self._calls.get(k)
            if fut is not None:
                if not fut.done():
                    fut.set_result(msg)
                return
            self._pending.discard(k)
            if k in self._lists:
                self._lists.discard(k)
                line = self._tools_listed(msg, line)
        if self._client is not None:
            await self._client.send(line)

    async def _upstream_unreadable(self, line: bytes, exc: Unreadable) -> None:
        """A message from the server the proxy refuses: logged (an excerpt, scrubbed); the
        call, forwarded request or request of the proxy's own it answers fails; a message
        answering nothing gets the server an error."""
        log.error("agent-saga mcp: refused a message from the upstream (%s): %s", exc.message, excerpt(line))
        k = key(exc.id) if exc.id is not None else None
        why = f"the server's answer was refused by the agent-saga proxy: {exc.message}"
        if k is not None and k in self._calls:
            fut = self._calls[k]
            if not fut.done():
                fut.set_exception(OutcomeUnknown(why))
            return
        if k is not None and k in self._pending:
            self._pending.discard(k)
            self._lists.discard(k)
            await self._to_client(error(exc.id, INTERNAL_ERROR, why))
            return
        if k is not None and self.upstream.fail_own(k, why):
            return
        with contextlib.suppress(UpstreamGone):
            await self.upstream.send(encode(error(exc.id, exc.code, exc.message)))

    def _tools_listed(self, msg: dict[str, Any], line: bytes) -> bytes:
        result = msg.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return line
        if self._on_tools is not None:
            self._on_tools(result["tools"])
        if not self._inject or result.get("nextCursor"):
            return line  # the boundary tools go on the last page
        names = {t.get("name") for t in result["tools"] if isinstance(t, dict)}
        result["tools"] = [*result["tools"], *(t for t in BOUNDARY_TOOLS if t["name"] not in names)]
        return encode(msg)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _parent_died(ppid: int, pidfd: int | None) -> bool:
    """Did the client (our parent) die? Waits up to ``PARENT_EXIT_WAIT`` for its exit."""
    if pidfd is not None:
        ready, _, _ = select.select([pidfd], [], [], PARENT_EXIT_WAIT)
        return bool(ready)
    return os.getppid() != ppid
