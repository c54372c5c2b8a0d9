"""Codemod on a real git repository, in process: success, and every failure path restores.

What is pinned: a verified edit lands whole (files, branch, index, no shadow left); a
failing verify, a raising edit, a branch moved under the codemod and a later failure in
the caller's saga each leave the repository byte-identical to its snapshot; a dirty or
non-git target is refused before anything is written; the WAL says why it stopped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from agent_saga import (
    ActionSemantics,
    Codemod,
    CodemodRefused,
    ConfigurationError,
    FileWAL,
    VerifyFailed,
    saga_scope,
    saga_states,
)
from fixtures.gitrepo import EDIT, applied_tree, git, make_repo, state, tree
from fixtures.wal import records as wal_records

COMPILE = [sys.executable, "-m", "compileall", "-q", "pkg"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def wal(tmp_path: Path):
    w = FileWAL(tmp_path / "saga.wal")
    yield w
    w.close()


def records(wal: FileWAL) -> list:
    return wal_records(wal.path, damaged="keep")


def shadows(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "shadows").glob("agent-saga-codemod-*")) if (tmp_path / "shadows").exists() else []


async def test_a_verified_edit_lands_whole(repo: Path, wal: FileWAL, tmp_path: Path) -> None:
    before, snap = tree(repo), state(repo)
    mod = Codemod(repo, verify=COMPILE, wal=wal, shadow_root=tmp_path / "shadows")
    result = await mod.run(EDIT, message="rename fetch to load")
    assert tree(repo) == applied_tree(before)
    after = state(repo)
    assert after["head"] == result.commit != snap["head"] == result.snapshot
    assert after["branch"] == "refs/heads/main" and after["status"] == "" and after["worktrees"] == 1
    assert git(repo, "rev-parse", "HEAD~1") == snap["head"]
    assert result.changed == (("M", "pkg/a.py"), ("D", "pkg/b.py"), ("A", "pkg/new/c.py"))
    assert shadows(tmp_path) == []
    assert (repo / "build/cache.txt").read_bytes() == b"not tracked\n"  # ignored files untouched
    (st,) = saga_states(records(wal)).values()
    assert st.status == "COMPLETED"
    assert [s.tool for s in st.steps.values()] == ["codemod.shadow", "codemod.edit", "codemod.verify", "codemod.merge"]


async def test_a_failing_verify_leaves_the_repository_untouched_and_says_why(repo: Path, wal: FileWAL, tmp_path: Path) -> None:
    before, snap = tree(repo), state(repo)
    broken = {"pkg/a.py": "def load(:\n"}
    mod = Codemod(repo, verify=COMPILE, wal=wal, shadow_root=tmp_path / "shadows")
    with pytest.raises(VerifyFailed) as info:
        await mod.run(broken, message="a syntax error")
    assert info.value.exit_code == 1 and "SyntaxError" in info.value.output
    assert "the repository was not changed" in str(info.value)
    assert tree(repo) == before and state(repo) == snap
    assert shadows(tmp_path) == []
    (st,) = saga_states(records(wal)).values()
    assert st.status == "ROLLED_BACK"
    failed = [r for r in records(wal) if r.type == "STEP_FAILED"]
    assert len(failed) == 1 and failed[0].payload["tool"] == "codemod.verify"
    assert "exit code 1" in failed[0].payload["message"]


async def test_an_edit_that_raises_is_rolled_back(repo: Path, wal: FileWAL, tmp_path: Path) -> None:
    before, snap = tree(repo), state(repo)

    def edit(shadow: Path) -> None:
        (shadow / "pkg/a.py").write_text("half\n")
        raise RuntimeError("the model gave up")

    with pytest.raises(RuntimeError, match="gave up"):
        await Codemod(repo, verify=COMPILE, wal=wal, shadow_root=tmp_path / "shadows").run(edit, message="x")
    assert tree(repo) == before and state(repo) == snap and shadows(tmp_path) == []


async def test_a_later_failure_in_the_callers_saga_restores_the_merged_repository(repo: Path, wal: FileWAL, tmp_path: Path) -> None:
    before, snap = tree(repo), state(repo)
    mod = Codemod(repo, verify=COMPILE, wal=wal, shadow_root=tmp_path / "shadows")

    def deploy() -> None:
        raise RuntimeError("the deploy failed")

    with pytest.raises(RuntimeError, match="deploy failed"):
        async with saga_scope(wal, name="goal") as saga:
            await mod.run(EDIT, message="rename", saga=saga)
            assert tree(repo) == applied_tree(before)  # merged: the goal goes on
            await saga.execute("deploy", ActionSemantics.REVERSIBLE, deploy)
    assert tree(repo) == before and state(repo) == snap
    assert saga.rollback_report is not None and saga.rollback_report.clean


async def test_a_branch_moved_under_the_codemod_is_refused_not_overwritten(repo: Path, wal: FileWAL, tmp_path: Path) -> None:
    def edit(shadow: Path) -> None:
        (shadow / "pkg/a.py").write_text("def load():\n    return 2\n")
        git(repo, "commit", "-q", "--allow-empty", "-m", "someone else")  # in the target

    with pytest.raises(CodemodRefused, match="changed while the codemod ran"):
        await Codemod(repo, verify=COMPILE, wal=wal, shadow_root=tmp_path / "shadows").run(edit, message="x")
    assert git(repo, "log", "-1", "--format=%s") == "someone else" and state(repo)["status"] == "" and shadows(tmp_path) == []


async def test_a_dirty_repository_is_refused_before_anything_is_written(repo: Path, wal: FileWAL, tmp_path: Path) -> None:
    (repo / "pkg/a.py").write_text("work in progress\n")
    (repo / "notes.txt").write_text("untracked\n")
    before = tree(repo)
    with pytest.raises(CodemodRefused, match=r"uncommitted changes \(.*pkg/a.py.*notes.txt.*Commit or stash"):
        await Codemod(repo, verify=COMPILE, wal=wal, shadow_root=tmp_path / "shadows").run(EDIT, message="x")
    assert tree(repo) == before and records(wal) == []


async def test_not_a_repository_and_bad_arguments_are_refused_with_the_fix(tmp_path: Path, wal: FileWAL) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(CodemodRefused, match="not inside a git work tree: run `git init`"):
        await Codemod(plain, verify=COMPILE, wal=wal).run(EDIT, message="x")
    with pytest.raises(ConfigurationError, match="verify must be a non-empty command"):
        Codemod(plain, verify=[])
    repo = make_repo(tmp_path / "repo")
    mod = Codemod(repo, verify=COMPILE, wal=wal)
    with pytest.raises(ConfigurationError, match=r"edit path '../x' must be relative"):
        await mod.run({"../x": "y"}, message="x")
    with pytest.raises(ConfigurationError, match="message must be a non-empty"):
        await mod.run(EDIT, message=" ")
    assert records(wal) == []


async def test_a_merge_that_fails_half_way_is_restored_before_it_reports_failure(
    repo: Path, wal: FileWAL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk error on the second file: the step raises (did not happen), so it must not
    leave the first file written."""
    import agent_saga.codemod._git as gitops

    before, snap = tree(repo), state(repo)
    real, calls = gitops.os.replace, []

    def failing(src: object, dst: object) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(gitops.os, "replace", failing)
    with pytest.raises(OSError, match="No space left") as info:
        await Codemod(repo, verify=COMPILE, wal=wal, shadow_root=tmp_path / "shadows").run(EDIT, message="x")
    assert any("was restored to" in note for note in info.value.__notes__)
    assert len(calls) == 2 and tree(repo) == before and state(repo) == snap and shadows(tmp_path) == []


async def test_a_verify_that_hangs_is_stopped_by_its_timeout(repo: Path, wal: FileWAL, tmp_path: Path) -> None:
    before = tree(repo)
    hang = [sys.executable, "-c", "import time; time.sleep(30)"]
    with pytest.raises(VerifyFailed, match="did not finish within 0.5s") as info:
        await Codemod(repo, verify=hang, verify_timeout=0.5, wal=wal, shadow_root=tmp_path / "shadows").run(
            EDIT, message="x")
    assert info.value.exit_code is None and tree(repo) == before and shadows(tmp_path) == []


async def test_files_git_converts_on_checkout_are_refused_and_restored(repo: Path, wal: FileWAL, tmp_path: Path) -> None:
    (repo / ".gitattributes").write_text("*.py filter=lfs\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "lfs")
    before, snap = tree(repo), state(repo)
    with pytest.raises(CodemodRefused, match=r"pkg/a.py has the git attribute filter=lfs"):
        await Codemod(repo, verify=COMPILE, wal=wal, shadow_root=tmp_path / "shadows").run(EDIT, message="x")
    assert tree(repo) == before and state(repo) == snap and shadows(tmp_path) == []
