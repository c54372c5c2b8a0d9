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
  Request``) sent back to that side, and the session goes on.
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
import sys
from collections.abc import Callable
from typing import Any

from ._session import BOUNDARY_TOOLS, OutcomeUnknown, ToolSession
from ._stdio import MAX_LINE, StdioUpstream, UpstreamGone
from ._wire import (
    INVALID_REQUEST,
    PARSE_ERROR,
    batch_refusal,
    cancelled_key,
    classify,
    encode,
    error,
    key,
    usable_id,
)

__all__ = ["ClientChannel", "McpProxy", "stdio_client_channel"]

log = logging.getLogger("agent_saga.mcp")

#: How long after the client's stdin closed the proxy waits to learn whether the client
#: process died (a crash closes its pipes a moment before it is reaped).
PARENT_EXIT_WAIT = 0.25


class ClientChannel:
    """The client side: lines in, lines out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False

    async def send(self, line: bytes) -> None:
        """Write one line to the client; a client that is gone is noted, never raised."""
        if self.writer is None or self.closed:
            return
        try:
            self.writer.write(line if line.endswith(b"\n") else line + b"\n")
            await self.writer.drain()
        except (ConnectionError, RuntimeError):
            self.closed = True  # the client is gone; what it would have read is in the WAL


async def stdio_client_channel() -> ClientChannel:
    """The proxy's own stdin and stdout as the client channel."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout.buffer)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return ClientChannel(reader, writer)


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
        await self.upstream.start()
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
            try:
                line = await reader.readline()
            except ValueError:
                await self._to_client(error(None, PARSE_ERROR, f"message over {MAX_LINE} bytes"))
                continue
            if not line:
                return
            if line.strip():
                await self._from_client(line)

    async def _from_client(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError as exc:
            await self._to_client(error(None, PARSE_ERROR, f"Parse error: the line is not JSON ({exc})"))
            return
        if isinstance(msg, list):
            await self._client_batch(msg, line)
            return
        kind, why = classify(msg)
        if kind == "invalid":
            await self._to_client(error(usable_id(msg), INVALID_REQUEST, f"Invalid Request: {why}"))
            return
        if kind == "request":
            method = msg["method"]
            if method == "tools/call" and self.session is not None:
                k = key(msg["id"])
                self._tasks[k] = asyncio.ensure_future(self._call(k, msg))
                return
            if method == "tools/call" and self._on_call is not None:
                params = msg.get("params")
                if isinstance(params, dict) and isinstance(params.get("name"), str):
                    self._on_call(params["name"])
            if method == "tools/list":
                self._lists.add(key(msg["id"]))
        elif kind == "notification" and msg["method"] == "notifications/cancelled":
            self._client_cancelled(msg)
        await self._to_upstream(line, msg)

    async def _client_batch(self, batch: list[Any], line: bytes) -> None:
        refusal = batch_refusal(batch) if batch else [error(None, INVALID_REQUEST, "Invalid Request: an empty batch")]
        if refusal is None:
            await self._to_upstream(line, None)
        elif self._client is not None:
            await self._client.send(encode(refusal[0] if not batch else refusal))

    def _client_cancelled(self, msg: dict[str, Any]) -> None:
        k = cancelled_key(msg)
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
                from ._wire import UPSTREAM_UNAVAILABLE

                await self._to_client(error(msg["id"], UPSTREAM_UNAVAILABLE, f"the upstream server is gone: {exc}"))

    async def _to_client(self, msg: Any) -> None:
        if self._client is not None:
            await self._client.send(encode(msg))

    # ------------------------------------------------------------------ upstream -> client
    async def _upstream_loop(self) -> None:
        try:
            await self.upstream.read_loop(self._from_upstream)
        finally:
            gone = self.upstream.gone or "the upstream server exited"
            for fut in self._calls.values():
                if not fut.done():
                    fut.set_exception(OutcomeUnknown(f"{gone} during the call"))

    async def _from_upstream(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError as exc:
            log.error("agent-saga mcp: the upstream printed a line that is not JSON (%s): %.200r", exc, line)
            with contextlib.suppress(UpstreamGone):
                await self.upstream.send(encode(error(None, PARSE_ERROR, f"Parse error: the line is not JSON ({exc})")))
            return
        if isinstance(msg, list):
            if self._client is not None:
                await self._client.send(line)
            return
        kind, why = classify(msg)
        if kind == "invalid":
            log.error("agent-saga mcp: the upstream sent an invalid message (%s): %.200r", why, line)
            with contextlib.suppress(UpstreamGone):
                await self.upstream.send(encode(error(usable_id(msg), INVALID_REQUEST, f"Invalid Request: {why}")))
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
            if k in self._lists:
                self._lists.discard(k)
                line = self._tools_listed(msg, line)
        if self._client is not None:
            await self._client.send(line)

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
