"""The reviewed policy for ``mcp-server-git`` (examples/policies/mcp-server-git.yaml) on the
real server from PyPI, through ``agent-saga mcp``, with the official SDK client: reads
pass, ``git_add`` is undone by ``git_reset`` with the repository taken from the call (in
the proxy's rollback, and by the recovery daemon after the proxy is killed), a call the
inverse cannot be built from is refused before it runs, and a commit waits for a human."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_support as ms
import pytest
from agent_saga.controls.policy import load_policy_file
from fixtures.gitrepo import git, make_repo, state
from fixtures.mcp_servers import require_mcp_server_git
from fixtures.polling import until
from fixtures.procs import pid_alive
from mcp import StdioServerParameters
from mcp.shared.exceptions import MCPError

POLICY = ms.ROOT / "examples" / "policies" / "mcp-server-git.yaml"
REFUSED = -32001


def _argv(server: Path, repo: Path, *options: str) -> list[str]:
    return ["-m", "agent_saga.cli", "mcp", *options, "--", str(server), "--repository", str(repo)]


def _params(tmp: Path, argv: list[str], **env: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=argv, env=ms.proxy_env(tmp, **env), cwd=str(ms.ROOT))


def _edit(repo: Path, tag: str) -> None:
    """A modified tracked file and a new untracked one: what an agent stages next."""
    (repo / "README.md").write_text(f"# demo\n{tag}\n")
    (repo / f"notes-{tag}.txt").write_text(f"{tag}\n")


@pytest.fixture(scope="module")
def server() -> Path:
    return require_mcp_server_git()


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-git")


@pytest.fixture(scope="module")
def repo(tmp: Path) -> Path:
    return make_repo(tmp / "repo")


@pytest.fixture(scope="module")
def held(tmp: Path, repo: Path, server: Path) -> Iterator[ms.HeldSession]:
    (tmp / "approvals").mkdir()
    argv = _argv(server, repo, "--policy", str(POLICY), "--wal", str(tmp / "proxy.wal"), "--name", "git",
                 "--boundary", "explicit", "--approvals", str(tmp / "approvals"))
    session = ms.HeldSession(_params(tmp, argv, AGENT_SAGA_SWITCH_STORE=str(tmp / "switches.json")),
                             tmp / "proxy.log")
    yield session
    session.close()


def _text(result: Any) -> str:
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def test_the_policy_declares_every_tool_the_server_lists(held: ms.HeldSession) -> None:
    listed = {t.name for t in held.run(lambda s: s.list_tools()).tools} - {"saga_commit", "saga_rollback"}
    assert listed == set(load_policy_file(POLICY).tools)


def test_reads_pass_and_change_nothing(held: ms.HeldSession, repo: Path) -> None:
    before = state(repo)
    assert "nothing to commit" in _text(held.run(lambda s: s.call_tool("git_status", {"repo_path": str(repo)})))
    assert "initial" in _text(held.run(lambda s: s.call_tool("git_log", {"repo_path": str(repo)})))
    assert state(repo) == before


def test_git_add_is_undone_by_git_reset_with_the_repository_from_the_call(
        held: ms.HeldSession, repo: Path, tmp: Path) -> None:
    _edit(repo, "rollback")
    before = git(repo, "status", "--porcelain", "--untracked-files=all")
    staged = held.run(lambda s: s.call_tool("git_add", {"repo_path": str(repo),
                                                         "files": ["README.md", "notes-rollback.txt"]}))
    assert _text(staged) == "Files staged successfully"
    assert git(repo, "status", "--porcelain", "--untracked-files=all") != before  # the index changed
    undone = held.run(lambda s: s.call_tool("saga_rollback", {}))
    assert "rolled back" in _text(undone), _text(undone)
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == before
    committed = ms.of_type(tmp / "proxy.wal", "STEP_COMMITTED")
    inverse = [r["payload"]["compensation"] for r in committed if r["payload"].get("compensation")][-1]
    assert inverse["kwargs"] == {"tool": "git_reset", "arguments": {"repo_path": str(repo)}}


def test_a_call_without_the_argument_the_inverse_needs_is_refused_before_it_runs(
        held: ms.HeldSession, repo: Path, tmp: Path) -> None:
    before = ms.records(tmp / "proxy.wal")
    with pytest.raises(MCPError) as err:
        held.run(lambda s: s.call_tool("git_add", {"files": ["README.md"], "path": str(repo)}))
    assert err.value.error.code == REFUSED
    assert "compensate.callArgs" in err.value.error.message and "$.repo_path" in err.value.error.message
    new = until("the refusal is logged", lambda: [r["type"] for r in ms.records(tmp / "proxy.wal")[len(before):]
                                                   if r["type"].startswith("STEP_")])
    assert new == ["STEP_REFUSED"]  # no STEP_INTENT: it was never sent


def test_a_commit_is_irreversible_and_waits_for_a_human_who_denies_it(
        held: ms.HeldSession, repo: Path, tmp: Path) -> None:
    git(repo, "add", "-A")
    head = git(repo, "rev-parse", "HEAD")
    call = asyncio.run_coroutine_threadsafe(
        held.session.call_tool("git_commit", {"repo_path": str(repo), "message": "agent commit"}), held.loop)
    store = tmp / "approvals"

    def pending() -> list[dict[str, Any]]:  # the store's request files (<id>.json), read as the CLI would
        docs = [json.loads(f.read_text()) for f in store.glob("*.json") if not f.name.endswith(".decision.json")]
        return [d for d in docs if d.get("tool") == "git_commit"]

    request = until("the commit waits for a human", pending)[0]
    assert not call.done() and git(repo, "rev-parse", "HEAD") == head
    denied = subprocess.run([sys.executable, "-m", "agent_saga.cli", "approvals", "deny", request["requestId"],
                             "--store", str(store), "--approver", "lead@corp", "--note", "not now"],
                            capture_output=True, text=True, timeout=60, cwd=str(ms.ROOT))
    assert denied.returncode == 0, denied.stderr
    with pytest.raises(MCPError) as err:
        call.result(timeout=60)
    assert err.value.error.code == REFUSED
    assert git(repo, "rev-parse", "HEAD") == head
    git(repo, "reset", "-q")


def test_the_recovery_daemon_undoes_git_add_after_the_proxy_is_killed(tmp_path: Path, server: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    _edit(repo, "crash")
    before = git(repo, "status", "--porcelain", "--untracked-files=all")
    argv = _argv(server, repo, "--policy", str(POLICY), "--wal", str(tmp_path / "proxy.wal"), "--name", "git",
                 "--lease-seconds", "1")
    script = [{"tool": "git_add", "args": {"repo_path": str(repo), "files": ["README.md", "notes-crash.txt"]}}]
    client = ms.start_client_argv(tmp_path, script, argv)
    assert "ok" in ms.read_until_ready(client)[0]
    assert git(repo, "status", "--porcelain", "--untracked-files=all") != before
    proxy = ms.children(client.pid)[0]
    os.kill(proxy, signal.SIGKILL)
    until("the proxy is gone", lambda: not pid_alive(proxy))
    client.kill()
    client.communicate(timeout=60)

    # The lease (1 s) runs from the dead proxy's last record (docs: agent_saga.leases): one
    # sweep once it has lapsed, instead of one recoveryd start per poll.
    lapse = max(r["ts"] for r in ms.records(tmp_path / "proxy.wal")) / 1e6 + 1.0
    until("the dead proxy's lease lapsed", lambda: time.time() > lapse, timeout=10)

    def swept() -> bool:
        done = ms.recoveryd_once(tmp_path, tmp_path / "proxy.wal",
                                 {"git": {"command": [str(server), "--repository", str(repo)]}})
        assert done.returncode in (0, 1), done.stderr[-3000:]
        return any(r["type"] == "SAGA_ROLLED_BACK" for r in ms.records(tmp_path / "proxy.wal"))

    until("the recovery daemon rolled the saga back", swept, timeout=90, interval=0.2)
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == before
    undo = [r for r in ms.records(tmp_path / "proxy.wal") if r["type"] == "COMPENSATION_DONE"]
    assert len(undo) == 1
