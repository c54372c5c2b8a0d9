"""The upstream MCP server as a child process speaking JSON-RPC lines on its stdin/stdout.

``StdioUpstream`` starts the server, writes lines to it and hands every line it prints to
the proxy; ``request`` sends a request of the proxy's own (ids ``agent-saga:<n>``, never
a client's) and waits for its answer. ``call_tool_once`` is the whole life of a short
session — start, ``initialize``, one ``tools/call``, stop — which is how a compensating
tool is called after a crash, when no session is left (``agent_saga.mcp.upstreams``).

Invariants:
- The server's stderr is the proxy's stderr (its logs stay visible; never parsed) — with
  credentials in custody (``_custody``), copied line by line with their values masked.
- With credentials, every line the server prints is masked before anyone reads it.
- When the server exits, every request of the proxy's own still waiting fails with
  ``UpstreamGone``: an answer that can no longer arrive is never waited for.
- Lines may be large (a tool result of megabytes), up to the reader's limit (``MAX_LINE``
  by default): a longer line is skipped to its end and handed over as its first
  ``HEAD`` bytes, flagged not whole (``read_line``), so the proxy can answer it.
- The reader never dies of a line: whatever handling one line raises is logged and the
  next line is read. Once the reader stops, the server is no longer ``alive``, and every
  request of the proxy's own still waiting fails: nothing waits for an answer nobody reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ._custody import CredentialUnavailable, Custody, env_with
from ._wire import Unreadable, classify, encode, key, parse, top_id

__all__ = ["MAX_LINE", "PROTOCOL_VERSION", "StdioUpstream", "UpstreamGone", "call_tool_once", "read_line"]

log = logging.getLogger("agent_saga.mcp")

#: The largest message the proxy reads (either side), unless told otherwise.
MAX_LINE = 64 * 1024 * 1024
#: How much of a message over the limit is kept: enough to find its id.
HEAD = 64 * 1024
#: The protocol version the proxy offers when it opens a session of its own.
PROTOCOL_VERSION = "2025-06-18"
_ids = itertools.count(1)


class UpstreamGone(Exception):
    """The upstream server exited (or was never reachable): the answer will not come."""


async def read_line(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """The next line (``b""`` at the end) and whether it is whole. A line over the
    reader's limit is read to its end and dropped, but for its first ``HEAD`` bytes."""
    try:
        return await reader.readuntil(b"\n"), True
    except asyncio.IncompleteReadError as exc:
        return exc.partial, True
    except asyncio.LimitOverrunError:
        head = await reader.read(HEAD)
    while True:
        try:
            await reader.readuntil(b"\n")
            return head, False
        except asyncio.IncompleteReadError:
            return head, False
        except asyncio.LimitOverrunError as exc:
            await reader.readexactly(exc.consumed)


class StdioUpstream:
    """One upstream server process (see the module doc)."""

    def __init__(self, command: Sequence[str], *, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, limit: int = MAX_LINE, custody: Custody | None = None) -> None:
        if not command:
            raise ValueError("the upstream command is empty")
        self.command = tuple(command)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.limit = limit
        self.custody = custody if custody else None
        self.refused: str | None = None  # why it was not started (a credential): every call is refused
        self._stderr: asyncio.Task[None] | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self._own: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.gone: str | None = None

    async def start(self) -> None:
        """Start the server process. ``CredentialUnavailable``: a credential could not be
        resolved; the server is not started and ``refused`` says why."""
        try:
            extra = env_with(self.env, self.custody)
        except CredentialUnavailable as exc:
            self.refused = exc.message
            raise
        env = None if extra is None else {**os.environ, **extra}
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, cwd=self.cwd,
            limit=self.limit, stderr=asyncio.subprocess.PIPE if self.custody else None)
        if self.custody and self.proc.stderr is not None:
            self._stderr = asyncio.ensure_future(_copy_masked(self.proc.stderr, self.custody))

    @property
    def alive(self) -> bool:
        """The server runs and its output is still being read."""
        return self.gone is None and self.proc is not None and self.proc.returncode is None

    async def send(self, line: bytes) -> None:
        """Write one line to the server. Raises ``UpstreamGone`` if it cannot be written."""
        if not self.alive or self.proc is None or self.proc.stdin is None:
            raise UpstreamGone(self.gone or "the upstream server is not running")
        try:
            self.proc.stdin.write(line if line.endswith(b"\n") else line + b"\n")
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise UpstreamGone(f"the upstream server stopped reading ({exc})") from None

    async def request(self, method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Send a request of the proxy's own; its response (``result`` or ``error``)."""
        id_ = f"agent-saga:{next(_ids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._own[key(id_)] = fut
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            msg["params"] = dict(params)
        try:
            await self.send(encode(msg))
            return await fut
        finally:
            self._own.pop(key(id_), None)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """Send a notification of the proxy's own."""
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = dict(params)
        await self.send(encode(msg))

    def waiting(self, k: str) -> bool:
        """Is a request of the proxy's own with the id ``key`` ``k`` waiting for its answer?"""
        return k in self._own

    def fail_own(self, k: str, why: str) -> bool:
        """Fail the proxy's own request ``k`` (its answer could not be read); True if one was."""
        fut = self._own.get(k)
        if fut is None:
            return False
        if not fut.done():
            fut.set_exception(UpstreamGone(why))
        return True

    def take_own(self, msg: Any) -> bool:
        """If ``msg`` answers one of the proxy's own requests, deliver it; True if it did."""
        if not isinstance(msg, dict) or "method" in msg:
            return False
        fut = self._own.get(key(msg.get("id")))
        if fut is None:
            return False
        if not fut.done():
            fut.set_result(msg)
        return True

    async def read_loop(self, on_line: Callable[[bytes, bool], Awaitable[None]]) -> None:
        """Hand every line the server prints to ``on_line(line, whole)`` until it exits
        (``read_line``; see the module doc)."""
        assert self.proc is not None and self.proc.stdout is not None
        stdout = self.proc.stdout
        eof = False
        try:
            while True:
                line, whole = await read_line(stdout)
                if not line:
                    eof = True
                    break
                if not whole or line.strip():
                    if self.custody:
                        line = self.custody.redact(line)
                    try:
                        await on_line(line, whole)
                    except Exception as exc:  # noqa: BLE001 - one line never ends the session
                        log.error("agent-saga mcp: a line from the upstream could not be handled (%s); the session "
                                  "goes on", type(exc).__name__)
        finally:
            if self.proc.returncode is None:
                self.gone = "the upstream server's output is no longer read"
                if not eof:  # a server nobody reads cannot go on: it is stopped, never waited on forever
                    with contextlib.suppress(ProcessLookupError):
                        self.proc.terminate()
            for fut in self._own.values():
                if not fut.done():
                    fut.set_exception(UpstreamGone(self.gone or "the upstream server exited"))
            code = await self.proc.wait() if self.proc.returncode is None else self.proc.returncode
            self.gone = f"the upstream server exited (code {code})"
            for fut in self._own.values():
                if not fut.done():
                    fut.set_exception(UpstreamGone(self.gone))

    async def stop(self, *, grace: float = 5.0) -> int | None:
        """Close the server's stdin (MCP's shutdown), then terminate, then kill."""
        proc = self.proc
        if proc is None:
            return None
        if self._stderr is not None:
            self._stderr.cancel()
        if proc.stdin is not None and not proc.stdin.is_closing():
            with contextlib.suppress(Exception):
                proc.stdin.close()
        for step in (proc.terminate, proc.kill):
            try:
                return await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    step()
        return await proc.wait()


async def _copy_masked(stream: asyncio.StreamReader, custody: Custody) -> None:
    """The server's stderr to ours, line by line, credentials masked."""
    out = sys.stderr.buffer
    with contextlib.suppress(Exception):
        while True:
            line, _ = await read_line(stream)
            if not line:
                return
            out.write(custody.redact(line))
            out.flush()


async def _own_session_loop(up: StdioUpstream) -> None:
    async def on_line(line: bytes, whole: bool) -> None:
        try:
            msg = parse(line) if whole else None
        except Unreadable as exc:
            if exc.id is not None:
                up.fail_own(key(exc.id), f"the server's answer could not be read: {exc.message}")
            return
        if msg is None:
            found = top_id(line.decode("utf-8", "replace"))
            if found is not None:
                up.fail_own(key(found), f"the server's answer is over {up.limit} bytes")
            return
        if up.take_own(msg):
            return
        if isinstance(msg, dict) and classify(msg)[0] == "request":  # e.g. ping, roots/list: answer empty
            with contextlib.suppress(UpstreamGone):
                await up.send(encode({"jsonrpc": "2.0", "id": msg["id"], "result": {}}))

    await up.read_loop(on_line)


async def call_tool_once(command: Sequence[str], tool: str, arguments: Mapping[str, Any], *,
                         meta: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                         cwd: str | None = None, timeout: float = 60.0,
                         custody: Custody | None = None) -> dict[str, Any]:
    """Start the server, ``initialize``, call ``tool`` once, stop; the call's ``result``.
    Raises ``UpstreamGone`` (the server died), ``RuntimeError`` (an error response or
    a result with ``isError``: the tool says it did not do it) and ``CredentialUnavailable``
    (not started)."""
    up = StdioUpstream(command, env=env, cwd=cwd, custody=custody)
    await up.start()
    reader = asyncio.ensure_future(_own_session_loop(up))
    try:
        async with asyncio.timeout(timeout):
            init = await up.request("initialize", {
                "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                "clientInfo": {"name": "agent-saga-recovery", "version": "1"}})
            if "error" in init:
                raise RuntimeError(f"initialize was refused: {init['error']}")
            await up.notify("notifications/initialized")
            params: dict[str, Any] = {"name": tool, "arguments": dict(arguments)}
            if meta:
                params["_meta"] = dict(meta)
            resp = await up.request("tools/call", params)
        return tool_result(resp, tool)
    finally:
        await up.stop()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader


def tool_result(resp: Mapping[str, Any], tool: str) -> dict[str, Any]:
    """The ``result`` of a ``tools/call`` response; ``RuntimeError`` for an error response
    or a result flagged ``isError``."""
    if "error" in resp:
        err = resp["error"] if isinstance(resp["error"], dict) else {}
        raise RuntimeError(f"{tool} answered with JSON-RPC error {err.get('code')}: {err.get('message')}")
    result = resp.get("result")
    if not isinstance(result, dict):
        raise RuntimeError(f"{tool} answered without a result object")
    if result.get("isError") is True:
        raise RuntimeError(f"{tool} reported an error: {_text(result)[:500]}")
    return result


def _text(result: Mapping[str, Any]) -> str:
    parts = [c.get("text", "") for c in result.get("content") or () if isinstance(c, dict)]
    return " ".join(p for p in parts if isinstance(p, str))
