"""The event loop ``agent-saga mcp --listen`` runs on: uvloop's when it is installed (the
``fast`` extra; the test environment has it), asyncio's when it is not or when
``$AGENT_SAGA_MCP_LOOP=asyncio`` says so. Either way a session through the proxy is gated
and logged the same, SIGTERM rolls back an open session, and the startup line names the
loop."""

from __future__ import annotations

import importlib.util
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import mcp_support as ms
import pytest
from fixtures import pki
from fixtures.polling import until
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

#: Said when the test environment lacks uvloop (the dev extra has it, as the fast extra).
NO_UVLOOP = "uvloop is not installed here: `make install` (the dev extra) or pip install 'agent-saga[fast]'"

#: ``agent-saga mcp`` in a Python where ``import uvloop`` fails, as where it is not installed.
WITHOUT_UVLOOP = ["-c", "import sys; sys.modules['uvloop'] = None; from agent_saga.cli import main; "
                  "sys.exit(main())"]


def _serve(tmp: Path, name: str, *tls: str) -> tuple[subprocess.Popen[bytes], int]:
    """The fixture server on a socket bound here (over TLS with ``tls`` = CERT KEY)."""
    listening = socket.create_server(("127.0.0.1", 0))
    with listening, open(tmp / f"{name}.log", "w") as slog:
        server = subprocess.Popen(
            [sys.executable, str(ms.SERVER), "--https-fd" if tls else "--http-fd", str(listening.fileno()), *tls],
            env=ms.proxy_env(tmp), stdout=slog, stderr=subprocess.STDOUT, cwd=str(ms.ROOT),
            pass_fds=(listening.fileno(),))
        return server, listening.getsockname()[1]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    tmp = tmp_path_factory.mktemp("mcp-loop")
    server, port = _serve(tmp, "server")
    try:
        until("the server answers", lambda: ms.answers_http(port), proc=server)
        yield tmp, port
    finally:
        server.terminate()
        server.wait(timeout=30)


def _answers_https(port: int, ca: Path) -> bool:
    """``ms.answers_http`` over TLS (a server not serving yet leaves the handshake waiting)."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"GET /mcp HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            return s.recv(5) == b"HTTP/"
    except TimeoutError:
        return False


@pytest.fixture(scope="module")
def tls_upstream(upstream: tuple[Path, int]) -> Iterator[tuple[Path, int, Path]]:
    """The fixture server over TLS, its certificate signed by a CA of the test's own."""
    tmp = upstream[0]
    files = pki.generate(tmp / "pki")
    server, port = _serve(tmp, "tls-server", str(files.serving_cert), str(files.serving_key))
    try:
        until("the TLS server answers", lambda: _answers_https(port, files.ca_cert), proc=server)
        yield tmp, port, files.ca_cert
    finally:
        server.terminate()
        server.wait(timeout=30)


def _proxy(tmp: Path, up: int, name: str, python: list[str], scheme: str = "http",
           **env: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"{name}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, *python, "mcp", "--policy", str(ms.write_policy(tmp / "p.json")),
             "--wal", str(tmp / f"{name}.wal"), "--name", "bank", "--listen", "127.0.0.1:0",
             "--upstream", f"{scheme}://127.0.0.1:{up}/mcp"],
            env=ms.proxy_env(tmp, **env), stdout=f, stderr=subprocess.STDOUT, cwd=str(ms.ROOT))
    return proc, log


@pytest.mark.parametrize(("python", "env", "loop"), [
    (["-m", "agent_saga.cli"], {}, "uvloop "),
    (WITHOUT_UVLOOP, {}, "asyncio"),
    (["-m", "agent_saga.cli"], {"AGENT_SAGA_MCP_LOOP": "asyncio"}, "asyncio"),
], ids=["uvloop-installed", "uvloop-missing", "asyncio-chosen"])
async def test_the_proxy_runs_on_the_loop_it_names_gates_and_rolls_back_on_sigterm(
        upstream: tuple[Path, int], python: list[str], env: dict[str, str], loop: str,
        request: pytest.FixtureRequest) -> None:
    tmp, up = upstream
    name = request.node.callspec.id
    wal = tmp / f"{name}.wal"
    assert loop == "asyncio" or importlib.util.find_spec("uvloop") is not None, NO_UVLOOP
    proc, log = _proxy(tmp, up, name, python, **env)
    try:
        port = until("the proxy names its port", lambda: ms.listening_port(log), proc=proc)
        line = next(x for x in log.read_text().splitlines() if "listening on" in x)
        assert line.split("event loop ", 1)[1].startswith(loop), line
        async with streamable_http_client(f"http://127.0.0.1:{port}/mcp", terminate_on_close=False) as (r, w), \
                ClientSession(r, w) as s:
            await s.initialize()
            with pytest.raises(MCPError) as err:
                await s.call_tool("delete_everything", {})
            assert err.value.error.code == -32001 and "not declared" in err.value.error.message
            charge = (await s.call_tool("create_charge", {"amount": 3, "to": f"acct_{name}"})).structured_content
            assert charge["to"] == f"acct_{name}"
        # The session is still open (no DELETE): SIGTERM, handled by this loop's signal
        # handling, drops it and the charge is refunded before the proxy exits.
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert "the proxy received SIGTERM" in log.read_text()
    assert [e for e in ms.calls(tmp, "create_refund") if e["args"]["charge"] == charge["id"]]
    assert ms.of_type(wal, "SAGA_ROLLED_BACK") and not ms.of_type(wal, "SAGA_COMPLETED")
    assert ms.calls(tmp, "delete_everything") == []


def test_an_unknown_loop_is_refused_naming_the_variable(upstream: tuple[Path, int]) -> None:
    tmp, up = upstream
    proc, log = _proxy(tmp, up, "bad-loop", ["-m", "agent_saga.cli"], AGENT_SAGA_MCP_LOOP="trio")
    assert proc.wait(timeout=60) == 2
    text = log.read_text()
    assert "AGENT_SAGA_MCP_LOOP='trio'" in text and "asyncio" in text, text


@pytest.mark.parametrize(("python", "loop"), [(["-m", "agent_saga.cli"], "uvloop "), (WITHOUT_UVLOOP, "asyncio")],
                         ids=["uvloop", "asyncio"])
async def test_an_https_upstream_is_verified_and_served_on_either_loop(
        tls_upstream: tuple[Path, int, Path], python: list[str], loop: str) -> None:
    tmp, up, ca = tls_upstream
    name = f"tls-{loop.strip()}"
    assert loop == "asyncio" or importlib.util.find_spec("uvloop") is not None, NO_UVLOOP
    # Trusted through the CA file OpenSSL's default verify paths read: the proxy's own
    # default context verifies the server's certificate and name.
    proc, log = _proxy(tmp, up, name, python, "https", SSL_CERT_FILE=str(ca))
    untrusted, untrusted_log = _proxy(tmp, up, f"{name}-untrusted", python, "https")
    try:
        port = until("the proxy names its port", lambda: ms.listening_port(log), proc=proc)
        assert f"upstream https://127.0.0.1:{up}/mcp, event loop {loop}" in log.read_text()
        async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            charge = (await s.call_tool("create_charge", {"amount": 4, "to": f"acct_{name}"})).structured_content
            assert charge["to"] == f"acct_{name}"
        # Without the CA the certificate is not trusted: nothing reaches the server.
        bad = until("the other proxy names its port", lambda: ms.listening_port(untrusted_log), proc=untrusted)
        status, doc, _ = ms.post(bad, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert status == 502 and "CERTIFICATE_VERIFY_FAILED" in doc["error"]["message"], doc
    finally:
        for p in (proc, untrusted):
            p.terminate()
            p.wait(timeout=30)
    assert [e for e in ms.calls(tmp, "create_charge") if e["args"]["to"] == f"acct_{name}"]
