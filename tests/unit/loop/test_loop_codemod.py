"""An AgentLoop editing a real git repository through codemod_tool: a reached goal keeps
the verified change; an unfinished one (the model thrashes on an edit that does not
compile) restores the repository byte for byte, through the saga's rollback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agent_saga import AgentLoop, Codemod, FileWAL, StopReason
from agent_saga.loop import codemod_tool
from agent_saga.routing import (
    CallableHost,
    Capabilities,
    HostAnswer,
    ModelRequest,
    Route,
    Router,
    ToolCall,
    Usage,
)
from fixtures.gitrepo import EDIT, applied_tree, make_repo, state, tree

GOOD = {"files": EDIT, "message": "rename fetch to load"}
BROKEN = {"files": {"pkg/b.py": "def (:\n"}, "message": "oops"}


def edit_call(n: int, args: dict) -> HostAnswer:
    return HostAnswer(tool_calls=(ToolCall(f"c{n}", "repo.edit", json.dumps(args)),), usage=Usage(100, 20))


def run_loop(tmp_path: Path, script) -> tuple[Path, object]:
    import asyncio

    repo = make_repo(tmp_path / "repo")
    wal = FileWAL(tmp_path / "loop.wal")
    seen: list[ModelRequest] = []

    def host(request: ModelRequest) -> HostAnswer:
        seen.append(request)
        return script(len(seen), request)

    mod = Codemod(repo, verify=[sys.executable, "-m", "compileall", "-q", "pkg"], wal=wal, shadow_root=tmp_path / "sh")
    router = Router(Route([CallableHost("scripted", host, Capabilities(context_tokens=8000, tools=True))]), wal=wal)
    loop = AgentLoop(router, tools=[codemod_tool(mod)], wal=wal)
    try:
        return repo, asyncio.run(loop.run("rename fetch to load"))
    finally:
        wal.close()


def test_a_reached_goal_keeps_the_verified_change(tmp_path: Path) -> None:
    pristine = tree(make_repo(tmp_path / "pristine"))
    repo, result = run_loop(tmp_path, lambda n, r: edit_call(n, GOOD) if n == 1 else HostAnswer(content="done"))
    assert result.stop is StopReason.DONE
    assert tree(repo) == applied_tree(pristine) and state(repo)["status"] == ""


def test_an_unfinished_goal_restores_the_repository(tmp_path: Path) -> None:
    def script(n: int, request: ModelRequest) -> HostAnswer:
        if n > 1:  # the model was told why its edit did not land
            assert "VerifyFailed" in request.messages[-1].content or n == 2
        return edit_call(n, GOOD if n == 1 else BROKEN)

    repo_before = make_repo(tmp_path / "pristine")
    before = tree(repo_before)
    repo, result = run_loop(tmp_path, script)
    assert result.stop is StopReason.STALLED  # the broken edit, asked for a third time
    assert result.rollback is not None and result.rollback.clean
    assert tree(repo) == before  # the merged first edit was restored by the rollback
    assert state(repo)["status"] == "" and state(repo)["worktrees"] == 1
    assert not (tmp_path / "sh").exists() or list((tmp_path / "sh").iterdir()) == []
