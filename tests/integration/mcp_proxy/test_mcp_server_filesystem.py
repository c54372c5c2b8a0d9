"""The reviewed policy for the reference filesystem server
(examples/policies/mcp-server-filesystem.yaml) on the real server from npm, through
``agent-saga mcp``, with the official SDK client: reads pass, ``move_file`` is undone by
moving the file back (both paths from the call), and a write, which cannot be undone,
waits for a human unsent.

(mcp-server-sqlite, the other candidate, is not used: its last release, 2025.4.25, is
written against the MCP SDK's 1.x server API and fails at start with the 2.x SDK this
project's tests and mcp-server-git need.)"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import mcp_support as ms
import pytest
from agent_saga.controls.policy import load_policy_file
from fixtures.gitrepo import tree
from fixtures.mcp_servers import require_mcp_server_filesystem
from fixtures.polling import until
from mcp import StdioServerParameters

POLICY = ms.ROOT / "examples" / "policies" / "mcp-server-filesystem.yaml"


def _argv(server: Path, root: Path, *options: str) -> list[str]:
    return ["-m", "agent_saga.cli", "mcp", *options, "--", str(server), str(root)]


@pytest.fixture(scope="module")
def server() -> Path:
    return require_mcp_server_filesystem()


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-files")


@pytest.fixture(scope="module")
def root(tmp: Path) -> Path:
    data = (tmp / "data").resolve()
    (data / "reports").mkdir(parents=True)
    (data / "draft.txt").write_text("quarterly numbers\n")
    (data / "draft.txt").chmod(0o640)
    (data / "reports" / "q1.txt").write_text("q1\n")
    return data


@pytest.fixture(scope="module")
def held(tmp: Path, server: Path, root: Path) -> Iterator[ms.HeldSession]:
    (tmp / "approvals").mkdir()
    argv = _argv(server, root, "--policy", str(POLICY), "--wal", str(tmp / "proxy.wal"), "--name", "files",
                 "--boundary", "explicit", "--approvals", str(tmp / "approvals"))
    params = StdioServerParameters(command=sys.executable, args=argv, cwd=str(ms.ROOT),
                                   env=ms.proxy_env(tmp, AGENT_SAGA_SWITCH_STORE=str(tmp / "switches.json")))
    session = ms.HeldSession(params, tmp / "proxy.log")
    yield session
    session.close()


def test_the_policy_declares_every_tool_the_server_lists(held: ms.HeldSession) -> None:
    listed = {t.name for t in held.run(lambda s: s.list_tools()).tools} - {"saga_commit", "saga_rollback"}
    assert listed == set(load_policy_file(POLICY).tools)


def test_reads_pass(held: ms.HeldSession, root: Path) -> None:
    got = held.run(lambda s: s.call_tool("read_text_file", {"path": str(root / "draft.txt")}))
    assert got.content[0].text == "quarterly numbers\n"


def test_move_file_is_undone_by_moving_it_back(held: ms.HeldSession, root: Path, tmp: Path) -> None:
    before = tree(root)
    moved = held.run(lambda s: s.call_tool("move_file", {"source": str(root / "draft.txt"),
                                                          "destination": str(root / "reports" / "final.txt")}))
    assert not moved.is_error, moved
    assert tree(root) != before and (root / "reports" / "final.txt").exists()
    undone = held.run(lambda s: s.call_tool("saga_rollback", {}))
    assert "rolled back" in undone.content[0].text, undone.content[0].text
    assert tree(root) == before  # the same paths, contents and modes
    inverse = [r["payload"]["compensation"] for r in ms.of_type(tmp / "proxy.wal", "STEP_COMMITTED")
               if r["payload"].get("compensation")][-1]
    assert inverse["kwargs"] == {"tool": "move_file", "arguments": {
        "source": str(root / "reports" / "final.txt"), "destination": str(root / "draft.txt")}}


def test_a_write_is_irreversible_and_not_sent_while_it_waits_for_a_human(held: ms.HeldSession, root: Path) -> None:
    before = tree(root)
    call = asyncio.run_coroutine_threadsafe(
        held.session.call_tool("write_file", {"path": str(root / "draft.txt"), "content": "overwritten\n"}),
        held.loop)
    until("the write waits for a human", lambda: list((root.parent / "approvals").iterdir()))
    assert not call.done() and tree(root) == before
    call.cancel()
