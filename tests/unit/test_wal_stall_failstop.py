"""After a stall the writer is failed-stop: nothing waits a second bound.

The device is wedged through the named fault point ``before_sync`` (the flusher blocks
there like a thread stuck in fdatasync); tests/integration/test_wal_wedged_disks.py does
the same on a really frozen ext4 filesystem and a tmpfs that fills.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from agent_saga import (
    ActionSemantics,
    Compensation,
    FileWAL,
    RollbackIncomplete,
    WALStalled,
    saga_scope,
)
from agent_saga.rollback import RollbackOutcome
from agent_saga.wal.file import iter_file_records
from engine_support import Wedge
from fixtures.polling import until_async

C = ActionSemantics.COMPENSABLE


@pytest.fixture
def wedge() -> Wedge:
    w = Wedge()
    yield w
    w.release.set()


def refused_at_once(text: str) -> bool:
    """A WAL error of the fail-stop kind (raised at once), not a fence that waited its bound."""
    return "stalled earlier and accepts no records" in text or "will not be written" in text


async def test_a_rollback_after_a_stall_runs_every_compensation_and_waits_for_no_fence(
    tmp_path: Path, wedge: Wedge
) -> None:
    wal = FileWAL(tmp_path / "w.wal", stall_timeout=0.5, fault_hook=wedge)
    undone: list[int] = []
    ran: list[int] = []
    with pytest.raises(RollbackIncomplete) as ei:
        async with saga_scope(wal, name="pay") as saga:
            for i in range(5):
                await saga.execute(
                    f"t{i}", C, lambda i=i: i, lambda r: Compensation(fn=lambda r=r: undone.append(r))
                )
            wedge.armed.set()
            await saga.execute("t5", C, lambda: ran.append(5), lambda r: Compensation(fn=print))
    cause = ei.value.__cause__
    assert isinstance(cause, WALStalled) and "not durable within 0.5s" in str(cause)
    assert ran == []  # the sixth step's intent never became durable: its forward never ran
    report = ei.value.report
    # Every step's true status: each compensation ran and returned.
    assert [(s.step_id.rsplit("/", 1)[1], s.outcome) for s in report.steps] == [
        (str(i), RollbackOutcome.COMPENSATED) for i in (4, 3, 2, 1, 0)
    ]
    assert undone == [4, 3, 2, 1, 0]
    # Not clean (its records are not on disk), and every log error the rollback met was
    # a refusal at once: only the sixth step's fence waited out its bound.
    assert not report.clean and report.wal_errors
    assert all(refused_at_once(e) for e in report.wal_errors), report.wal_errors
    assert wal.stats().failed is not None
    with pytest.raises(WALStalled, match="stalled before close"):
        wal.close()
    wedge.release.set()


async def test_one_stall_fails_every_other_waiter_at_once(tmp_path: Path, wedge: Wedge) -> None:
    wal = FileWAL(tmp_path / "w.wal", stall_timeout=3600, fault_hook=wedge)
    wedge.armed.set()
    first = wal.append("X", "s-1")
    assert await asyncio.to_thread(wedge.reached.wait, 10)
    second = wal.append("X", "s-2")
    # Waiters under the default bound (an hour): they must not wait it out.
    slow = asyncio.ensure_future(wal.barrier(second))
    in_thread = asyncio.ensure_future(asyncio.to_thread(wal.barrier_sync, second))
    await asyncio.sleep(0)
    with pytest.raises(WALStalled, match=f"seq {first} not durable within 0.2s"):
        await wal.barrier(first, timeout=0.2)
    for waiter in (slow, in_thread):
        with pytest.raises(WALStalled, match=f"seq {second} is not durable and will not be written") as ei:
            await asyncio.wait_for(waiter, 60)  # a guard against a hang, not a timing claim
        assert isinstance(ei.value.__cause__, WALStalled)
    with pytest.raises(WALStalled, match="stalled earlier"):
        wal.append("X", "s-3")
    with pytest.raises(WALStalled, match="stalled earlier"):
        await wal.compact()
    with pytest.raises(WALStalled, match="stalled before close"):
        wal.close()
    wedge.release.set()
    # The batch in flight was in doubt and lands once the device is back; the queued one
    # never does, and the chain on disk is whole.
    await until_async("the write in flight landing", lambda: wal.stats().durable_seq >= first, timeout=30,
                      interval=0.01)
    await wal.barrier(first)
    assert [r.seq for _, r in iter_file_records(wal.path)] == [first]
    again = FileWAL(tmp_path / "w.wal")  # the flusher released the lock on its way out
    again.close()


async def test_a_failed_write_after_a_stall_keeps_the_first_cause(tmp_path: Path) -> None:
    release = threading.Event()

    def hook(point: str) -> None:
        if point == "before_sync":
            release.wait(60)
            raise OSError(5, "Input/output error")

    wal = FileWAL(tmp_path / "w.wal", stall_timeout=0.2, fault_hook=hook)
    seq = wal.append("X", "s-1")
    try:
        with pytest.raises(WALStalled):
            await wal.barrier(seq)
    finally:
        release.set()
    await until_async("the flusher returning", lambda: wal._flusher is None or not wal._flusher.is_alive(),
                      timeout=30, interval=0.01)
    with pytest.raises(WALStalled, match="stalled earlier") as ei:
        wal.append("X", "s-1")
    assert "not durable within 0.2s" in str(ei.value.__cause__)
    with pytest.raises(WALStalled):
        wal.close()
