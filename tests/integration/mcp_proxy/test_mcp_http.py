"""``agent-saga mcp --listen ADDR --upstream URL``: a real Streamable HTTP MCP server and
client (the official SDK) through the proxy: the same tools, refusals, progress relayed,
a DELETE commits, an abandoned session is rolled back by calling the inverse."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import mcp_support as ms
import pytest
from fixtures.polling import until
from fixtures.procs import port_open
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-http")


@pytest.fixture(scope="module")
def urls(tmp: Path) -> Iterator[tuple[str, str]]:
    # The server's socket is bound here and handed over, and the proxy binds port 0 and
    # names its port (a port chosen free and then bound by another process could be taken
    # in between by any other process on the machine).
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
             "--upstream", f"http://127.0.0.1:{up}/mcp", "--session-idle", "1"],
            env=env, stdout=plog, stderr=subprocess.STDOUT, cwd=str(ms.ROOT))
    try:
        until("the server answers", lambda: ms.answers_http(up), proc=server)
        px = until("the proxy names its port", lambda: ms.listening_port(tmp / "proxy.log"), proc=proxy)
        assert port_open(px)
        yield f"http://127.0.0.1:{up}/mcp", f"http://127.0.0.1:{px}/mcp"
    finally:
        for p in (proxy, server):
            p.terminate()
            p.wait(timeout=30)


def _ends(wal: Path) -> list[str]:
    return [r["type"] for r in ms.records(wal) if r["type"] in ("SAGA_COMPLETED", "SAGA_ROLLED_BACK")]


async def test_a_session_over_http_is_gated_and_a_delete_commits(urls: tuple[str, str], tmp: Path) -> None:
    direct_url, proxy_url = urls
    async with streamable_http_client(direct_url) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        direct = [t.model_dump(mode="json") for t in (await s.list_tools()).tools]
    before = len(_ends(tmp / "proxy.wal"))
    async with streamable_http_client(proxy_url) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        assert [t.model_dump(mode="json") for t in (await s.list_tools()).tools] == direct
        with pytest.raises(MCPError) as err:
            await s.call_tool("delete_everything", {})
        assert err.value.error.code == -32001 and "not declared" in err.value.error.message
        charge = await s.call_tool("create_charge", {"amount": 5, "to": "acct_h"})
        assert charge.structured_content["to"] == "acct_h"
        big = await s.call_tool("big", {"size": 300_000})  # the SDK client's SSE events stop at 1 MiB
        assert big.content[0].text == "x" * 300_000
        many = await asyncio.gather(*(s.call_tool("search_docs", {"query": f"h{i}"}) for i in range(8)))
        assert [m.content[0].text for m in many] == [f"results for h{i}" for i in range(8)]
    # the client's DELETE ends the session cleanly: committed, nothing undone
    until("the session committed", lambda: len(_ends(tmp / "proxy.wal")) > before)
    assert _ends(tmp / "proxy.wal")[before:] == ["SAGA_COMPLETED"]
    assert ms.calls(tmp, "delete_everything") == []
    assert not [e for e in ms.calls(tmp, "create_refund")
                if e["args"]["charge"] == charge.structured_content["id"]]


async def test_an_abandoned_http_session_is_rolled_back(urls: tuple[str, str], tmp: Path) -> None:
    _, proxy_url = urls
    before = len(_ends(tmp / "proxy.wal"))
    async with streamable_http_client(proxy_url, terminate_on_close=False) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        charge = (await s.call_tool("create_charge", {"amount": 9, "to": "acct_gone"})).structured_content["id"]
    # no DELETE: after --session-idle seconds without a request the session counts as dropped
    until("the refund was called", lambda: [e for e in ms.calls(tmp, "create_refund")
                                            if e["args"]["charge"] == charge], timeout=60)
    until("the session rolled back", lambda: len(_ends(tmp / "proxy.wal")) > before)
    assert _ends(tmp / "proxy.wal")[before:] == ["SAGA_ROLLED_BACK"]
    assert len([e for e in ms.calls(tmp, "create_refund") if e["args"]["charge"] == charge]) == 1
