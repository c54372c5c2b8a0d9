"""The saga boundary hooks isolation stands on: on_commit before SAGA_COMPLETED, on_exit
after the saga is resolved, on every exit path."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga import ConfigurationError, FileWAL, saga_scope
from agent_saga.wal.file import iter_file_records


async def test_on_commit_runs_before_saga_completed_and_a_failing_one_rolls_back(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w.wal")
    seen: list[str] = []
    try:
        async with saga_scope(wal, saga_id="ok") as saga:
            async def commit() -> None:
                seen.append(" ".join(r.type for _, r in iter_file_records(tmp_path / "w.wal")))
            saga.on_commit(commit)
            saga.on_exit(lambda s: seen.append(s.status))
        assert "SAGA_COMPLETED" not in seen[0] and seen[1] == "COMPLETED"

        async def fail() -> None:
            raise ValueError("commit refused")
        with pytest.raises(ValueError, match="commit refused"):
            async with saga_scope(wal, saga_id="bad") as saga:
                saga.on_commit(fail)
                saga.on_exit(lambda s: seen.append(s.status))
        assert seen[-1] == "ROLLED_BACK"
        with pytest.raises(ConfigurationError, match="hooks can only be added while it runs"):
            saga.on_exit(print)
        with pytest.raises(ConfigurationError, match="on_commit takes a callable"):
            async with saga_scope(wal) as other:
                other.on_commit("not callable")  # type: ignore[arg-type]
    finally:
        wal.close()


async def test_a_failing_exit_hook_is_logged_and_the_others_still_run(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    wal = FileWAL(tmp_path / "w.wal")
    ran: list[int] = []
    try:
        async with saga_scope(wal, saga_id="hooks") as saga:
            saga.on_exit(lambda s: ran.append(1))
            saga.on_exit(lambda s: 1 / 0)
            saga.on_exit(lambda s: ran.append(3))
    finally:
        wal.close()
    assert ran == [3, 1]  # newest first, and the failure in between stopped nothing
    assert "an on_exit hook failed (ZeroDivisionError" in caplog.text
