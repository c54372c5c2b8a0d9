"""``--listen`` against a web page: a real Streamable HTTP MCP server (the official SDK)
behind the proxy, driven with hand-made requests. A page that rebinds its DNS name to the
proxy's address sends its own Host and Origin: both refused, so it cannot drive tool
calls; a body that is not ``application/json`` is refused too. The server's ledger shows
that nothing refused reached it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mcp_support as ms
import pytest
from fixtures.polling import until

INVALID_REQUEST = -32600


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-http-guard")


@pytest.fixture(scope="module")
def port(tmp: Path) -> Iterator[int]:
    listening = socket.create_server(("127.0.0.1", 0))
    up = listening.getsockname()[1]
    env = ms.proxy_env(tmp)
    with listening, open(tmp / "server.log", "w") as slog, open(tmp / "proxy.log", "w") as plog:
        server = subprocess.Popen([sys.executable, str(ms.SERVER), "--http-fd", str(listening.fileno())], env=env,
                                  stdout=slog, stderr=subprocess.STDOUT, cwd=str(ms.ROOT),
                                  pass_fds=(listening.fileno(),))
        proxy = subprocess.Popen(
            [sys.executable, "-m", "agent_saga.cli", "mcp", "--policy", str(ms.write_policy(tmp / "p.json")),
             "--wal", str(tmp / "proxy.wal"), "--name", "bank", "--listen", "127.0.0.1:0",
             "--upstream", f"http://127.0.0.1:{up}/mcp", "--allow-host", "mcp.internal"],
            env=env, stdout=plog, stderr=subprocess.STDOUT, cwd=str(ms.ROOT))
    try:
        until("the server answers", lambda: ms.answers_http(up), proc=server)
        yield until("the proxy names its port", lambda: ms.listening_port(tmp / "proxy.log"), proc=proxy)
    finally:
        for p in (proxy, server):
            p.terminate()
            p.wait(timeout=30)


def charge(to: str, id_: int = 2) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call",
            "params": {"name": "create_charge", "arguments": {"amount": 1, "to": to}}}


def charged(tmp: Path, to: str) -> list[dict[str, Any]]:
    return [e for e in ms.calls(tmp, "create_charge") if e["args"]["to"] == to]


def test_a_foreign_host_is_refused_before_anything_is_forwarded(port: int, tmp: Path) -> None:
    sid = ms.session(port)
    status, answer, _ = ms.post(port, charge("acct_rebound"), sid=sid, host=f"evil.example:{port}")
    assert status == 421 and answer["error"]["code"] == INVALID_REQUEST
    assert "evil.example" in answer["error"]["message"] and "--allow-host" in answer["error"]["message"]
    assert charged(tmp, "acct_rebound") == []
    # a name the proxy was told to serve, and a loopback name, are answered
    ok, result, _ = ms.post(port, charge("acct_named"), sid=sid, host=f"mcp.internal:{port}")
    assert ok == 200 and result["result"]["structuredContent"]["to"] == "acct_named"
    assert ms.post(port, charge("acct_local", 3), sid=sid, host=f"localhost:{port}")[0] == 200
    assert len(charged(tmp, "acct_named")) == len(charged(tmp, "acct_local")) == 1


def test_a_foreign_origin_is_refused_and_a_local_page_is_answered(port: int, tmp: Path) -> None:
    status, answer, _ = ms.post(port, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}}},
        Origin="http://evil.example")
    assert status == 403 and "evil.example" in answer["error"]["message"]
    sid = ms.session(port, Origin="http://localhost:5173")
    assert ms.post(port, charge("acct_page"), sid=sid, Origin="null")[0] == 403
    assert ms.post(port, charge("acct_page"), sid=sid, Origin="https://mcp.internal")[0] == 200
    assert len(charged(tmp, "acct_page")) == 1


def test_a_post_that_is_not_application_json_is_refused(port: int, tmp: Path) -> None:
    sid = ms.session(port)
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        status, answer, _ = ms.post(port, charge("acct_form"), sid=sid, content_type=ctype)
        assert status == 415 and answer["error"]["code"] == INVALID_REQUEST
    assert ms.post(port, charge("acct_form"), sid=sid, content_type="application/json; charset=utf-8")[0] == 200
    assert len(charged(tmp, "acct_form")) == 1


def test_framing_attacks_over_http_are_refused(port: int, tmp: Path) -> None:
    sid = ms.session(port)
    dup = ('{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "create_charge", '
           '"arguments": {"amount": 1, "to": "acct_dup"}}, "method": "ping"}')
    status, answer, _ = ms.post(port, dup, sid=sid)
    assert status == 400 and answer["id"] == 4 and answer["error"]["code"] == INVALID_REQUEST
    status, answer, _ = ms.post(port, {"jsonrpc": "2.0", "method": "tools/call",
                                    "params": {"name": "create_charge", "arguments": {"amount": 1, "to": "acct_dup"}}},
                             sid=sid)
    assert status == 400 and answer["error"]["code"] == INVALID_REQUEST
    status, answer, _ = ms.post(port, json.dumps([{"jsonrpc": "2.0", "method": "tools/call", "params": {
        "name": "create_charge", "arguments": {"amount": 1, "to": "acct_dup"}}}]), sid=sid)
    assert status == 400
    deep = '{"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"x": ' + "[" * 1000 + "]" * 1000 + "}}"
    status, answer, _ = ms.post(port, deep, sid=sid)
    assert status == 400 and answer["id"] == 5 and "nests deeper" in answer["error"]["message"]
    assert charged(tmp, "acct_dup") == []
    assert ms.post(port, {"jsonrpc": "2.0", "id": 6, "method": "ping"}, sid=sid)[0] == 200  # the proxy goes on


def test_a_request_id_still_in_flight_is_refused_over_http(port: int, tmp: Path) -> None:
    sid = ms.session(port)
    slow = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "slow", "arguments": {"steps": 1}}}
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(ms.post, port, slow, sid=sid)
        until("the slow call reached the server", lambda: ms.calls(tmp, "slow"))
        status, answer, _ = ms.post(port, charge("acct_same_id", 9), sid=sid)
        assert status == 400 and answer["id"] == 9 and "still in flight" in answer["error"]["message"]
        assert ms.post(port, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                              "params": {"requestId": 9, "reason": "test"}}, sid=sid)[0] == 202
        first.result(timeout=60)  # the cancelled call's stream ends without an answer
    assert charged(tmp, "acct_same_id") == []
    # once the first is over, the id may be used again
    assert ms.post(port, charge("acct_same_id", 9), sid=sid)[0] == 200
