"""Helpers for the MCP proxy tests: the proxy command, a client session held open in a
thread (shared by a module's tests), and readers of the WAL and the server's ledger."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from mcp import ClientSession, StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[3]
SERVER = ROOT / "tests" / "fixtures" / "mcp_server.py"
CLIENT = Path(__file__).resolve().parent / "mcp_client.py"
T = TypeVar("T")

POLICY: dict[str, Any] = {
    "mode": "enforce",
    "tools": {
        "create_charge": {"semantics": "COMPENSABLE",
                          "compensate": {"tool": "create_refund", "args": {"charge": "$.id"}},
                          "policy_args": {"amount": "$.amount"}},
        "die_after_effect": {"semantics": "COMPENSABLE",
                             "compensate": {"tool": "create_refund", "args": {"charge": "$.id"}}},
        "search_docs": {"semantics": "REVERSIBLE"},
        "big": {"semantics": "REVERSIBLE"},
        "slow": {"semantics": "REVERSIBLE"},
        "tell_tools_changed": {"semantics": "REVERSIBLE"},
        "garble": {"semantics": "REVERSIBLE"},
        "create_refund": {"semantics": "IRREVERSIBLE"},
        "wire_send": {"semantics": "IRREVERSIBLE"},
    },
}


def write_policy(path: Path, policy: dict[str, Any] | None = None) -> Path:
    path.write_text(json.dumps(policy or POLICY))
    return path


def proxy_argv(*options: str) -> list[str]:
    """``agent-saga mcp OPTIONS -- python tests/fixtures/mcp_server.py``."""
    return ["-m", "agent_saga.cli", "mcp", *options, "--", sys.executable, str(SERVER)]


def proxy_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    env.update({"MCP_LEDGER": str(tmp / "ledger.jsonl"), "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def params(tmp: Path, *options: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=proxy_argv(*options), env=proxy_env(tmp, **env),
                                 cwd=str(ROOT))


def ledger(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def calls(tmp: Path, tool: str) -> list[dict[str, Any]]:
    return [e for e in ledger(tmp) if e["tool"] == tool]


def records(wal: Path) -> list[dict[str, Any]]:
    """The WAL's records as written so far (complete lines only)."""
    if not wal.exists():
        return []
    out = []
    for line in wal.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break  # the line being written
    return out


def of_type(wal: Path, type_: str, **where: Any) -> list[dict[str, Any]]:
    return [r for r in records(wal) if r["type"] == type_
            and all((r.get("payload") or {}).get(k) == v for k, v in where.items())]


def step_types(wal: Path, tool: str) -> list[str]:
    """The record types of every step of ``tool``, in order."""
    steps = {r["step"] for r in records(wal) if r["type"] == "STEP_INTENT" and r["payload"].get("tool") == tool}
    return [r["type"] for r in records(wal) if r.get("step") in steps]


class HeldSession:
    """One client session through the proxy, held open by a thread's event loop, so the
    tests of a module share it (one proxy and one server start): ``run(fn)`` runs
    ``await fn(session)`` there."""

    def __init__(self, server: StdioServerParameters, errlog: Path, **session_kw: Any) -> None:
        self.server = server
        self.errlog = errlog
        self.session_kw = session_kw
        self.loop = asyncio.new_event_loop()
        self.ready: Future[ClientSession] = Future()
        self._stop: asyncio.Event | None = None
        self.notifications: list[Any] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._held = asyncio.run_coroutine_threadsafe(self._hold(), self.loop)
        self.session = self.ready.result(timeout=60)

    async def _hold(self) -> None:
        self._stop = asyncio.Event()

        async def on_message(message: Any) -> None:
            self.notifications.append(message)

        try:
            with open(self.errlog, "a", encoding="utf-8") as err:
                async with stdio_client(self.server, errlog=err) as (r, w):
                    async with ClientSession(r, w, message_handler=on_message, **self.session_kw) as s:
                        await s.initialize()
                        self.ready.set_result(s)
                        await self._stop.wait()
        except BaseException as exc:
            if not self.ready.done():
                self.ready.set_exception(exc)
            raise

    def run(self, fn: Callable[[ClientSession], Awaitable[T]], timeout: float = 60) -> T:
        async def go() -> T:
            return await fn(self.session)

        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(timeout=timeout)

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        try:
            self._held.result(timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()


def start_client(tmp: Path, script: Sequence[dict[str, Any]], *options: str, **env: str) -> subprocess.Popen[str]:
    """A client process (tests/integration/mcp/mcp_client.py) that runs ``script``
    through the proxy, prints each answer as a JSON line, then ``ready``, and waits."""
    return start_client_argv(tmp, script, proxy_argv(*options), **env)


def start_client_argv(tmp: Path, script: Sequence[dict[str, Any]], argv: Sequence[str], **env: str
                      ) -> subprocess.Popen[str]:
    """``start_client`` in front of any proxy command line (``python ARGV``)."""
    cmd = [sys.executable, str(CLIENT), json.dumps(script), json.dumps(list(argv))]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=proxy_env(tmp, **env), cwd=str(ROOT))


def recoveryd_once(tmp: Path, wal: Path, upstreams: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """One sweep of ``agent-saga-recoveryd --once`` over ``wal``, reaching the MCP servers
    of ``upstreams`` (the ``AGENT_SAGA_MCP_UPSTREAMS`` file's content) to undo calls."""
    path = tmp / "mcp-upstreams.json"
    path.write_text(json.dumps(upstreams))
    return subprocess.run(
        [sys.executable, "-m", "agent_saga_recoveryd", "--once", "--wal-path", str(wal),
         "--import", "agent_saga.mcp.upstreams", "--lease-grace", "0", "--metrics-port", "0",
         "--bind", "127.0.0.1"], capture_output=True, text=True, timeout=120, cwd=str(ROOT),
        env=proxy_env(tmp, AGENT_SAGA_MCP_UPSTREAMS=str(path)))


def read_until_ready(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """The client's answers, up to its ``ready`` line."""
    assert proc.stdout is not None
    out = []
    for line in proc.stdout:
        if line.strip() == "ready":
            return out
        out.append(json.loads(line))
    raise AssertionError(f"the client exited ({proc.wait()}) before it was ready: {proc.stderr.read()[-3000:]}"
                         if proc.stderr else "the client exited")


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(p) for p in text]
    return out


def listening_port(log: Path) -> int | None:
    """The port the proxy's ``--listen 127.0.0.1:0`` took, from its log (None: not yet)."""
    found = re.search(r"listening on 127\.0\.0\.1:(\d+), upstream", log.read_text())
    return int(found.group(1)) if found else None


def answers_http(port: int) -> bool:
    """Does an HTTP server answer on ``port`` (any status)? A connection alone proves
    nothing here: the kernel accepts into a listening socket's backlog before anyone serves."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.settimeout(0.5)
        s.sendall(b"GET /mcp HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            return s.recv(5) == b"HTTP/"
        except TimeoutError:
            return False


def post(port: int, msg: dict[str, Any] | str, *, host: str | None = None, sid: str | None = None,
         content_type: str | None = "application/json", **headers: str) -> tuple[int, Any, http.client.HTTPMessage]:
    """One POST to the proxy with exactly these headers; the status, the JSON-RPC answer
    (the last SSE event's data, or the JSON body) and the response headers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        body = msg if isinstance(msg, str) else json.dumps(msg)
        conn.putrequest("POST", "/mcp", skip_host=True)
        conn.putheader("Host", host or f"127.0.0.1:{port}")
        conn.putheader("Accept", "application/json, text/event-stream")
        conn.putheader("MCP-Protocol-Version", "2025-06-18")
        if content_type is not None:
            conn.putheader("Content-Type", content_type)
        if sid:
            conn.putheader("Mcp-Session-Id", sid)
        for k, v in headers.items():
            conn.putheader(k.replace("_", "-"), v)
        conn.putheader("Content-Length", str(len(body.encode())))
        conn.endheaders(body.encode())
        resp = conn.getresponse()
        raw = resp.read().decode()
        if resp.getheader("Content-Type", "").startswith("text/event-stream"):
            data = [line[5:].strip() for line in raw.splitlines() if line.startswith("data:")]
            return resp.status, json.loads(data[-1]) if data else None, resp.headers
        return resp.status, json.loads(raw) if raw.strip() else None, resp.headers
    finally:
        conn.close()


def session(port: int, **headers: str) -> str:
    """A session opened through the proxy (initialize + initialized); its id."""
    status, init, head = post(port, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "guard", "version": "1"}}},
        **headers)
    assert status == 200 and "result" in init, init
    sid = head["Mcp-Session-Id"]
    assert post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid=sid)[0] == 202
    return sid
