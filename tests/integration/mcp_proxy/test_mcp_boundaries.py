"""Where a saga ends through the proxy: a clean disconnect commits, a dropped one rolls
back by calling the compensating tool, the upstream killed mid-call leaves the step
UNKNOWN, and the proxy killed with SIGKILL is finished by the recovery daemon exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import mcp_support as ms
import pytest
from fixtures.polling import until
from fixtures.procs import pid_alive
from mcp import ClientSession, stdio_client
from mcp.shared.exceptions import MCPError

pytestmark = pytest.mark.crash

OUTCOME_UNKNOWN = -32002
CHARGE = [{"tool": "create_charge", "args": {"amount": 42, "to": "acct_1"}}]


def _proxy_options(tmp: Path, *more: str) -> list[str]:
    return ["--policy", str(ms.write_policy(tmp / "saga-policy.json")), "--wal", str(tmp / "proxy.wal"),
            "--name", "bank", *more]


def _saga_ends(wal: Path) -> list[str]:
    return [r["type"] for r in ms.records(wal) if r["type"] in ("SAGA_COMPLETED", "SAGA_ROLLED_BACK",
                                                                 "SAGA_ROLLBACK_PARTIAL")]


async def test_a_clean_disconnect_commits(tmp_path: Path) -> None:
    server = ms.params(tmp_path, *_proxy_options(tmp_path))
    with open(tmp_path / "proxy.log", "w") as errlog:
        async with stdio_client(server, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool("create_charge", {"amount": 42, "to": "acct_1"})
    # the client closed the session (stdin) with nothing in flight, and is alive: committed
    assert ms.calls(tmp_path, "create_charge"), "the charge reached the server"
    until("the session committed", lambda: _saga_ends(tmp_path / "proxy.wal"))
    assert _saga_ends(tmp_path / "proxy.wal") == ["SAGA_COMPLETED"]
    assert ms.calls(tmp_path, "create_refund") == []


def test_a_dropped_connection_rolls_back_by_calling_the_compensating_tool(tmp_path: Path) -> None:
    client = ms.start_client(tmp_path, CHARGE, *_proxy_options(tmp_path))
    charge = ms.read_until_ready(client)[0]["ok"]["structuredContent"]["id"]
    proxy = ms.children(client.pid)[0]
    client.kill()  # the agent dies: its end of the session drops
    client.communicate(timeout=60)
    until("the proxy rolled the session back", lambda: _saga_ends(tmp_path / "proxy.wal"), timeout=60)
    until("the proxy exited", lambda: not pid_alive(proxy))
    assert _saga_ends(tmp_path / "proxy.wal") == ["SAGA_ROLLED_BACK"]
    assert [e["args"] for e in ms.calls(tmp_path, "create_refund")] == [{"charge": charge}]


async def test_the_upstream_killed_mid_call_leaves_the_step_unknown(tmp_path: Path) -> None:
    server = ms.params(tmp_path, *_proxy_options(tmp_path))
    with open(tmp_path / "proxy.log", "w") as errlog:
        async with stdio_client(server, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            with pytest.raises(MCPError) as err:
                await s.call_tool("die_after_effect", {"amount": 7})
    assert err.value.error.code == OUTCOME_UNKNOWN
    assert "may have happened" in err.value.error.message
    assert ms.calls(tmp_path, "die_after_effect"), "the effect happened before the server died"
    wal = tmp_path / "proxy.wal"
    types = until("the session was resolved", lambda: _saga_ends(wal) and ms.step_types(wal, "die_after_effect"))
    # Never assumed not to have happened: UNKNOWN, and the rollback asks a human
    # (there is no result to derive the refund from).
    assert "STEP_UNKNOWN" in types and "STEP_FAILED" not in types and "ESCALATED" in types
    assert ms.calls(tmp_path, "create_refund") == []


def test_the_proxy_killed_mid_session_is_compensated_once_by_the_recovery_daemon(tmp_path: Path) -> None:
    client = ms.start_client(tmp_path, CHARGE, *_proxy_options(tmp_path, "--lease-seconds", "1"))
    charge = ms.read_until_ready(client)[0]["ok"]["structuredContent"]["id"]
    proxy = ms.children(client.pid)[0]
    os.kill(proxy, signal.SIGKILL)
    until("the proxy is gone", lambda: not pid_alive(proxy))
    client.kill()
    client.communicate(timeout=60)
    assert _saga_ends(tmp_path / "proxy.wal") == []  # nobody finished it yet

    def sweep() -> subprocess.CompletedProcess[str]:
        return ms.recoveryd_once(tmp_path, tmp_path / "proxy.wal", {"bank": {"command": [sys.executable,
                                                                                       str(ms.SERVER)]}})

    def compensated() -> bool:
        done = sweep()
        assert done.returncode in (0, 1), done.stderr[-3000:]
        return bool(ms.calls(tmp_path, "create_refund"))

    until("the recovery daemon compensated the charge", compensated, timeout=90, interval=0.2)
    again = sweep()  # a second sweep finds the saga resolved and does nothing
    assert again.returncode == 0, again.stderr[-3000:]
    assert [e["args"] for e in ms.calls(tmp_path, "create_refund")] == [{"charge": charge}]
    assert _saga_ends(tmp_path / "proxy.wal") == ["SAGA_ROLLED_BACK"]


async def test_explicit_boundary_adds_commit_and_rollback_tools(tmp_path: Path) -> None:
    server = ms.params(tmp_path, *_proxy_options(tmp_path, "--boundary", "explicit"))
    with open(tmp_path / "proxy.log", "w") as errlog:
        async with stdio_client(server, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            names = [t.name for t in (await s.list_tools()).tools]
            assert names[-2:] == ["saga_commit", "saga_rollback"]
            first = (await s.call_tool("create_charge", {"amount": 1, "to": "a"})).structured_content["id"]
            undone = await s.call_tool("saga_rollback", {})
            assert "rolled back" in undone.content[0].text
            await s.call_tool("create_charge", {"amount": 2, "to": "b"})
            kept = await s.call_tool("saga_commit", {})
            assert "committed" in kept.content[0].text
    assert [e["args"] for e in ms.calls(tmp_path, "create_refund")] == [{"charge": first}]
    assert _saga_ends(tmp_path / "proxy.wal") == ["SAGA_ROLLED_BACK", "SAGA_COMPLETED"]
