"""Credential custody: the proxy is the only holder of an upstream's credentials. A real
MCP server (the official SDK, tests/fixtures/mcp_echo_server.py) echoes the headers and
environment it was given in results, errors and its stderr; the proxy injects the
credential (a header over HTTP, an environment variable over stdio) and the secret then
appears nowhere the client, the WAL or the logs can see it. A credential that cannot be
resolved refuses the request (-32001), naming the reference."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_support as ms
import pytest
from fixtures.known_secrets import holds_secrets, secret
from fixtures.polling import until
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

ECHO = ms.ROOT / "tests" / "fixtures" / "mcp_echo_server.py"
REFUSED = -32001
# Shapes no generic scrubber knows: only custody can hide them.
HTTP_SECRET = secret("mcp-custody-http", "hx")
STDIO_SECRET = secret("mcp-custody-stdio", "sx")
POLICY: dict[str, Any] = {"mode": "enforce", "tools": {
    "whoami": {"semantics": "COMPENSABLE",
               "compensate": {"tool": "undo_whoami", "args": {"seen": "$.headers.authorization"}}},
    "undo_whoami": {"semantics": "IRREVERSIBLE"},
    "leak_in_error": {"semantics": "REVERSIBLE"}}}


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _dump(x: Any) -> str:
    return json.dumps(x.model_dump(mode="json") if hasattr(x, "model_dump") else x, ensure_ascii=False)


def _assert_nowhere(secret: str, *places: tuple[str, str]) -> None:
    for what, text in places:
        for form in (secret, json.dumps(secret)[1:-1], secret[:12]):
            assert form not in text, f"the secret reached {what}"


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp-custody")
    (path / "secrets").mkdir()
    (path / "secrets" / "echo-token").write_text(HTTP_SECRET + "\n")
    return path


def _upstreams(tmp: Path, up: int) -> Path:
    path = tmp / "mcp-upstreams.json"
    path.write_text(json.dumps({
        "echo": {"url": f"http://127.0.0.1:{up}/mcp", "credentials": [{"credentialRef": "echo-token"}]},
        "echo-missing": {"url": f"http://127.0.0.1:{up}/mcp", "credentials": [{"credentialRef": "missing-token"}]},
        "echo-stdio": {"command": [sys.executable, str(ECHO)],
                       "credentials": [{"credentialRef": "env:PROXY_HELD_SECRET", "env": "ECHO_SECRET"}]}}))
    return path


@pytest.fixture(scope="module")
def upstream(tmp: Path) -> Iterator[int]:
    listening = socket.create_server(("127.0.0.1", 0))
    up = listening.getsockname()[1]
    holds_secrets(tmp / "server.log", "the upstream's own log: its leak_in_error tool prints the headers it was sent")
    with listening, open(tmp / "server.log", "w") as slog:
        server = subprocess.Popen([sys.executable, str(ECHO), "--http-fd", str(listening.fileno())],
                                  env=ms.proxy_env(tmp), stdout=slog, stderr=subprocess.STDOUT, cwd=str(ms.ROOT),
                                  pass_fds=(listening.fileno(),))
    try:
        until("the server answers", lambda: ms.answers_http(up), proc=server)
        _upstreams(tmp, up)
        yield up
    finally:
        server.terminate()
        server.wait(timeout=30)


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return ms.proxy_env(tmp, AGENT_SAGA_MCP_UPSTREAMS=str(tmp / "mcp-upstreams.json"),
                        AGENT_SAGA_CREDENTIALS_DIR=str(tmp / "secrets"), **extra)


def _http_proxy(tmp: Path, up: int, name: str, log: Path, *more: str, wal: str = "") -> tuple[
        subprocess.Popen[bytes], int]:
    with open(log, "w") as plog:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "agent_saga.cli", "mcp", "--policy", str(ms.write_policy(tmp / "p.json", POLICY)),
             "--wal", str(tmp / (wal or f"{name}.wal")), "--name", name, "--listen", "127.0.0.1:0",
             "--upstream", f"http://127.0.0.1:{up}/mcp", "--session-idle", "1", *more],
            env=_env(tmp), stdout=plog, stderr=subprocess.STDOUT, cwd=str(ms.ROOT))
    return proxy, until("the proxy names its port", lambda: ms.listening_port(log), proc=proxy)


async def test_an_http_upstream_gets_the_credential_and_nothing_gives_it_back(upstream: int, tmp: Path) -> None:
    proxy, port = _http_proxy(tmp, upstream, "echo", tmp / "proxy.log")
    seen: list[str] = []
    try:
        async with streamable_http_client(f"http://127.0.0.1:{port}/mcp", terminate_on_close=False) as (r, w), \
                ClientSession(r, w) as s:
            await s.initialize()
            who = await s.call_tool("whoami", {})
            seen.append(_dump(who))
            assert who.structured_content["headers"]["authorization"] == "Bearer " + "*" * len(HTTP_SECRET)
            leak = await s.call_tool("leak_in_error", {})
            seen.append(_dump(leak))
            assert leak.is_error and "authorization" in leak.content[0].text
        # abandoned: the rollback calls undo_whoami on a fresh session, with the credential too
        until("the session rolled back", lambda: ms.of_type(tmp / "echo.wal", "SAGA_ROLLED_BACK"), timeout=60)
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    injected = _sha("Bearer " + HTTP_SECRET)
    assert {e["tool"]: e["auth"] for e in ms.ledger(tmp)} == {
        "whoami": injected, "leak_in_error": injected, "undo_whoami": injected}
    _assert_nowhere(HTTP_SECRET, ("the client", "\n".join(seen)), ("the WAL", (tmp / "echo.wal").read_text()),
                    ("the proxy's log", (tmp / "proxy.log").read_text()))
    assert "holding 1 credential(s) of upstream echo: echo-token" in (tmp / "proxy.log").read_text()


def test_a_missing_credential_refuses_the_request_naming_the_reference(upstream: int, tmp: Path) -> None:
    before = len(ms.ledger(tmp))
    proxy, port = _http_proxy(tmp, upstream, "echo-missing", tmp / "proxy-missing.log")
    try:
        status, init, _ = ms.post(port, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert status == 200 and init["error"]["code"] == REFUSED and "'missing-token'" in init["error"]["message"]
        status, call, _ = ms.post(port, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                      "params": {"name": "whoami", "arguments": {}}})
        assert call["error"]["code"] == REFUSED and "'missing-token'" in call["error"]["message"]
        assert call["error"]["message"].lower().count("nothing was executed") == 1
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    assert len(ms.ledger(tmp)) == before  # nothing reached the server


def _stdio(tmp: Path, **env: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[
        "-m", "agent_saga.cli", "mcp", "--policy", str(ms.write_policy(tmp / "p.json", POLICY)), "--wal",
        str(tmp / "stdio.wal"), "--name", "echo-stdio", "--", sys.executable, str(ECHO)], env=_env(tmp, **env),
        cwd=str(ms.ROOT))


async def test_a_stdio_upstream_gets_the_credential_in_its_environment_and_nothing_gives_it_back(
        upstream: int, tmp: Path) -> None:
    seen: list[str] = []
    with open(tmp / "stdio-proxy.log", "w") as errlog:
        async with stdio_client(_stdio(tmp, PROXY_HELD_SECRET=STDIO_SECRET), errlog=errlog) as (r, w), \
                ClientSession(r, w) as s:
            await s.initialize()
            who = await s.call_tool("whoami", {})
            seen.append(_dump(who))
            assert who.structured_content["env"] == {"ECHO_SECRET": "*" * len(STDIO_SECRET)}
            leak = await s.call_tool("leak_in_error", {})
            seen.append(_dump(leak))
            assert leak.is_error
    until("the server's stderr reached the log", lambda: "leak_in_error:" in (tmp / "stdio-proxy.log").read_text())
    assert [e["env"] for e in ms.ledger(tmp) if e["tool"] == "whoami"][-1] == _sha(STDIO_SECRET)
    _assert_nowhere(STDIO_SECRET, ("the client", "\n".join(seen)), ("the WAL", (tmp / "stdio.wal").read_text()),
                    ("the proxy's log and the server's stderr", (tmp / "stdio-proxy.log").read_text()))


async def test_a_stdio_upstream_without_its_credential_is_not_started_and_every_request_is_refused(
        upstream: int, tmp: Path) -> None:
    with open(tmp / "stdio-missing.log", "w") as errlog:
        async with stdio_client(_stdio(tmp), errlog=errlog) as (r, w), ClientSession(r, w) as s:
            with pytest.raises(MCPError) as err:
                await s.initialize()
    assert err.value.error.code == REFUSED and "'env:PROXY_HELD_SECRET'" in err.value.error.message
    assert "the upstream was not started" in (tmp / "stdio-missing.log").read_text()


def test_after_a_crash_recoveryd_resolves_the_same_reference_from_its_own_mount(upstream: int, tmp: Path) -> None:
    proxy, port = _http_proxy(tmp, upstream, "echo", tmp / "proxy-crash.log", "--lease-seconds", "1",
                              "--session-idle", "300", wal="crash.wal")
    try:
        sid = ms.session(port)
        status, who, _ = ms.post(port, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                        "params": {"name": "whoami", "arguments": {}}}, sid=sid)
        assert status == 200 and "result" in who
    finally:
        proxy.kill()  # the proxy dies mid-session: its saga is orphaned
        proxy.wait(timeout=30)
    undone = len(ms.calls(tmp, "undo_whoami"))
    own_mount = tmp / "recoveryd-secrets"  # the daemon's own copy of the Secret
    own_mount.mkdir()
    (own_mount / "echo-token").write_text(HTTP_SECRET)
    env = ms.proxy_env(tmp, AGENT_SAGA_MCP_UPSTREAMS=str(tmp / "mcp-upstreams.json"),
                       AGENT_SAGA_CREDENTIALS_DIR=str(own_mount))
    outputs: list[str] = []

    def compensated() -> bool:
        done = subprocess.run(
            [sys.executable, "-m", "agent_saga_recoveryd", "--once", "--wal-path", str(tmp / "crash.wal"),
             "--import", "agent_saga.mcp.upstreams", "--lease-grace", "0", "--metrics-port", "0",
             "--bind", "127.0.0.1"], capture_output=True, text=True, timeout=120, env=env, cwd=str(ms.ROOT))
        assert done.returncode in (0, 1), done.stderr[-3000:]
        outputs.append(done.stdout + done.stderr)
        return len(ms.calls(tmp, "undo_whoami")) > undone

    until("the recovery daemon compensated whoami", compensated, timeout=90, interval=0.2)
    assert [e["auth"] for e in ms.calls(tmp, "undo_whoami")][-1] == _sha("Bearer " + HTTP_SECRET)
    assert ms.of_type(tmp / "crash.wal", "SAGA_ROLLED_BACK")
    _assert_nowhere(HTTP_SECRET, ("the recovery daemon's output", "\n".join(outputs)),
                    ("the WAL", (tmp / "crash.wal").read_text()), ("the proxy's log", (tmp / "proxy-crash.log").read_text()))
