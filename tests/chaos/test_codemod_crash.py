"""Codemod killed with SIGKILL at each phase, then recovered by the daemon from the WAL.

The phases: in the edit before its first file, in the edit half way, while the verify
command runs, after verify before the merge, half way through writing the target, after
the merge before its commit record, and after the saga completed. Afterwards the
repository is byte-identical to its snapshot (every file, mode and directory; HEAD, the
branch, a clean status, no shadow worktree) or, for a completed saga, exactly the
verified commit: never a mix. The half-way merge is checked to have really left the
target half written at the kill, so the test proves the restore, not a lucky window.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from agent_saga import RecoveryDaemon, saga_states
from agent_saga.wal.file import iter_file_records
from chaos_checks import chain_ok, future
from chaos_support import CHAOS_DIR, ROOT, subprocess_env
from fixtures.gitrepo import applied_tree, git, make_repo, state, tree

KILLS = {
    "in_edit_start": None,
    "in_edit_mid": None,
    "in_verify": None,
    "before_merge": "codemod.before_merge:1:sigkill",
    "mid_merge": "codemod.mid_merge:3:sigkill",
    "after_merge": "codemod.after_merge:1:sigkill",
    "after_complete": "codemod.after_complete:1:sigkill",
}


def kill_run(tmp_path: Path, kill: str) -> tuple[Path, Path, Path, dict, dict]:
    """The repository, its WAL, the shadow root, and the repository's tree and state
    before the run, once the worker died at ``kill``."""
    repo = make_repo(tmp_path / "repo")
    before, snapshot = tree(repo), state(repo)
    wal, shadows = tmp_path / "codemod.wal", tmp_path / "shadows"
    extra = {"PYTHONPATH": f"{ROOT / 'tests'}:{CHAOS_DIR}:{ROOT / 'runtime'}"}
    if KILLS[kill]:
        extra["AGENT_SAGA_FAULT"] = KILLS[kill]
    done = subprocess.run(
        [sys.executable, str(CHAOS_DIR / "codemod_worker.py"), str(repo), str(wal), str(shadows), kill],
        env=subprocess_env(**extra), capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == -9, f"the worker was not SIGKILLed at {kill}: exit {done.returncode}\n{done.stderr}"
    return repo, wal, shadows, before, snapshot


def recover(wal: Path):
    async def go():
        daemon = RecoveryDaemon(wal, imports=["agent_saga.codemod"], clock=future)
        try:
            return await daemon.sweep()
        finally:
            await daemon.close()

    return asyncio.run(go())


@pytest.mark.parametrize("kill", list(KILLS))
def test_a_killed_codemod_is_restored_or_whole(tmp_path: Path, kill: str) -> None:
    repo, wal, shadows, before, snapshot = kill_run(tmp_path, kill)
    applied = applied_tree(before)
    chain_ok(wal)  # the hash chain verifies after the kill
    if kill == "mid_merge":
        assert tree(repo) not in (before, applied), "the kill did not land half way through the merge"
    report = recover(wal)
    assert report.error is None and report.escalations == 0, report.summary()
    chain_ok(wal)
    (st,) = saga_states(r for _, r in iter_file_records(wal)).values()
    after = state(repo)
    assert after["status"] == "" and after["worktrees"] == 1 and after["branch"] == "refs/heads/main"
    assert not shadows.exists() or list(shadows.iterdir()) == []
    if kill == "after_complete":
        assert st.status == "COMPLETED" and report.recovered == 0
        assert tree(repo) == applied and after["head"] != snapshot["head"]
        assert git(repo, "rev-parse", "HEAD~1") == snapshot["head"]
    else:
        assert (st.status, report.recovered) == ("ROLLED_BACK", 1), f"{kill}: {st.status}"
        assert tree(repo) == before and after == snapshot
