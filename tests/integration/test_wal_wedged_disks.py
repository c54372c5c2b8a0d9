"""Sagas on real broken storage: a frozen ext4 disk, a tmpfs that fills, a stopped Redis.

What each test proves: the step that meets the fault raises within the bound, the writer
is then failed-stop, the rollback that follows runs every compensation and reports each
step's true status without waiting on the log again, and what did land is a verifiable
chain. Timings are printed for the record (run with -s), never asserted: "bounded" is
asserted structurally, as "every log error after the first is a refusal at once".
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_saga import (
    ActionSemantics,
    Compensation,
    FileWAL,
    RollbackIncomplete,
    WALError,
    WALStalled,
    saga_scope,
    verify_records,
)
from agent_saga.rollback import RollbackOutcome
from agent_saga.wal.file import iter_file_records
from fixtures.disks import FreezableDisk, SmallTmpfs
from fixtures.polling import until

C = ActionSemantics.COMPENSABLE
STALL = 2.0


def refused_at_once(text: str) -> bool:
    return any(m in text for m in ("accepts no records", "will not be written", "not durable and"))


def poll(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    until(what, predicate, timeout=timeout)


async def stall_a_saga(wal: Any, fault: Callable[[], None], what: str) -> None:
    """Five committed steps, then ``fault()``, then a sixth: the saga stalls once and rolls
    back. Asserts the failed-stop contract and prints the exit time against the bound."""
    undone: list[int] = []
    marks: dict[str, float] = {}
    with pytest.raises(RollbackIncomplete) as ei:
        async with saga_scope(wal, name="pay") as saga:
            for i in range(5):
                await saga.execute(f"t{i}", C, lambda i=i: i, lambda r: Compensation(fn=lambda r=r: undone.append(r)))
            fault()
            marks["fault"] = time.monotonic()
            await saga.execute("t5", C, lambda: 5, lambda r: Compensation(fn=lambda: undone.append(5)))
    exit_after = time.monotonic() - marks["fault"]
    cause = ei.value.__cause__
    assert isinstance(cause, WALStalled) and f"not durable within {STALL}s" in str(cause)
    report = ei.value.report
    assert [s.outcome for s in report.steps] == [RollbackOutcome.COMPENSATED] * 5
    assert undone == [4, 3, 2, 1, 0]
    assert not report.clean and report.wal_errors
    assert all(refused_at_once(e) for e in report.wal_errors), report.wal_errors
    with pytest.raises(WALStalled, match="stalled earlier"):
        wal.append("X", "s-late")
    with pytest.raises(WALStalled, match="stalled before close"):
        wal.close()  # at once: the flusher is stuck in the write
    print(f"\n{what}: saga exit {exit_after:.2f}s after the fault, stall bound {STALL}s "
          f"(ratio {exit_after / STALL:.2f}; 5 committed steps rolled back)")


async def test_a_saga_on_a_frozen_disk_is_failed_stop_after_one_bound(tmp_path: Path) -> None:
    with FreezableDisk(tmp_path) as disk:
        path = disk.mnt / "saga.wal"
        wal = FileWAL(path, stall_timeout=STALL)
        try:
            await stall_a_saga(wal, disk.freeze, "frozen ext4")
        finally:
            disk.thaw()
        # The write in flight lands once the disk thaws; the flusher then releases the file.
        poll(lambda: wal._flusher is not None and not wal._flusher.is_alive(), "the flusher to return")
        result = verify_records(iter_file_records(path))
        assert result.ok, result.describe()
        types = [r.type for _, r in iter_file_records(path)]
        assert types.count("STEP_COMMITTED") == 5 and "SAGA_ROLLBACK_PARTIAL" not in types


async def test_a_saga_on_a_tmpfs_that_fills_fails_stop_and_reports_every_step(tmp_path: Path) -> None:
    with SmallTmpfs(tmp_path, size_kb=256) as fs:
        path = fs.mnt / "saga.wal"
        wal = FileWAL(path)
        fs.fill(leave=8192)
        undone: list[int] = []
        ran: list[int] = []
        with pytest.raises(RollbackIncomplete) as ei:
            async with saga_scope(wal, name="pay") as saga:
                for i in range(500):  # the disk fills long before
                    await saga.execute(
                        f"t{i}", C, lambda i=i: ran.append(i) or i,
                        lambda r: Compensation(fn=lambda r=r: undone.append(r), description="refund " + "x" * 200),
                    )
        cause = ei.value.__cause__
        assert isinstance(cause, WALError) and not isinstance(cause, WALStalled)
        assert isinstance(cause.__cause__, OSError) and cause.__cause__.errno == errno.ENOSPC
        assert ran, "no step ran before the disk filled"
        report = ei.value.report
        # Every step whose forward ran is undone and reported so, newest first.
        assert [s.outcome for s in report.steps] == [RollbackOutcome.COMPENSATED] * len(ran)
        assert undone == ran[::-1]
        assert not report.clean and all(refused_at_once(e) for e in report.wal_errors), report.wal_errors
        assert all("No space left on device" in e for e in report.wal_errors)
        with pytest.raises(WALError, match="failed earlier"):
            wal.append("X", "s-late")
        with pytest.raises(WALError):
            wal.close()
        fs.free()
        # Reopened with room again: the torn tail (if any) is set aside, the chain verifies.
        again = FileWAL(path)
        again.close()
        result = verify_records(iter_file_records(path))
        assert result.ok, result.describe()


async def test_a_saga_on_a_stopped_redis_is_failed_stop_after_one_bound(redis_server_factory: Any) -> None:
    from agent_saga.wal.redis import RedisWAL

    server = redis_server_factory()
    wal = RedisWAL(server.url, key="stall-test", writer="w1", stall_timeout=STALL, socket_timeout=120)
    pid = server.pid
    assert pid is not None
    try:
        # SIGSTOP: the server is alive, its socket accepts bytes, it never answers.
        await stall_a_saga(wal, lambda: os.kill(pid, signal.SIGSTOP), "stopped redis")
    finally:
        os.kill(pid, signal.SIGCONT)
    poll(lambda: wal._flusher is not None and not wal._flusher.is_alive(), "the flusher to return")
