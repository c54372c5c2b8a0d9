"""One blocked compensation holds one slot of its daemon, not the daemon: a saga orphaned
while it hangs is resolved meanwhile, a later sweep never takes the saga it holds, and its
result is reported once it ends."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_saga import FileWAL, compensator
from agent_saga.recovery import RecoveryDaemon
from agent_saga.recovery.report import SweepReport
from fixtures.polling import until_async
from recovery_support import FUTURE, append_orphan

HELD = asyncio.Event()  # set by the test: the held refund may return (one per test: per loop)
STARTED: list[str] = []  # charge ids whose refund was started, in order


@compensator("test.recovery.refund_held")
async def refund_held(charge_id: str, idempotency_key: str) -> str:
    STARTED.append(charge_id)
    if charge_id == "held":
        await HELD.wait()
    return "refunded"


def orphan(wal: FileWAL, saga_id: str, charge_id: str) -> None:
    """One committed COMPENSABLE step of a saga whose owner is gone (this process's own
    log, written while the daemon holds it open)."""
    append_orphan(wal, saga_id, "test.recovery.refund_held", charge_id)


def held_log(path: Path) -> FileWAL:
    """A fresh log with one orphan whose refund hangs until ``HELD`` is set."""
    global HELD
    STARTED.clear()
    HELD = asyncio.Event()
    wal = FileWAL(path)
    orphan(wal, "slow", "held")
    return wal


async def test_a_blocked_compensation_does_not_stall_newer_orphans(tmp_path: Path) -> None:
    wal = held_log(tmp_path / "a.wal")
    reports: list[SweepReport] = []
    d = RecoveryDaemon(wal, clock=FUTURE, concurrency=2, compensation_timeout=None)
    run = asyncio.ensure_future(d.run(interval=0.05, on_report=reports.append))
    try:
        await until_async("the first refund started and hangs", lambda: STARTED == ["held"])
        # Orphaned while the first one hangs: resolved by the next sweeps, not after it.
        orphan(wal, "fast", "quick")
        await until_async("the newer orphan resolved", lambda: any(
            r.saga_id == "fast" and r.status == "ROLLED_BACK" for rep in reports for r in rep.results))
        assert "slow" in d.scan.in_flight and "slow" in d._in_hand
        assert STARTED == ["held", "quick"], "no later sweep started the held saga again"
        HELD.set()
        await until_async("the held one reported once it ended", lambda: any(
            r.saga_id == "slow" and r.status == "ROLLED_BACK" for rep in reports for r in rep.results))
    finally:
        HELD.set()
        d.drain()
        await run
        await d.close()
        wal.close()
    assert STARTED == ["held", "quick"]
    statuses = [(r.saga_id, r.status) for rep in reports for r in rep.results]
    assert statuses.count(("slow", "ROLLED_BACK")) == 1 and statuses.count(("fast", "ROLLED_BACK")) == 1
    assert not d.scan.in_flight


async def test_slots_held_by_blocked_compensations_bound_what_a_daemon_takes(tmp_path: Path) -> None:
    wal = held_log(tmp_path / "b.wal")
    d = RecoveryDaemon(wal, clock=FUTURE, concurrency=1, compensation_timeout=None)
    try:
        first = await d.sweep(wait=0.05)  # returns with the held one still running
        assert first.results == () and d._in_hand == {"slow"}
        # Its handler starts once COMPENSATION_STARTED is durable (an fsync: slow on a loaded disk).
        await until_async("the held refund started", lambda: STARTED == ["held"])
        orphan(wal, "fast", "quick")
        second = await d.sweep(wait=0.05)
        assert second.results == () and d._in_hand == {"slow"}, "its one slot is held: nothing more is taken"
        assert STARTED == ["held"]
        HELD.set()
        await until_async("the held one ended", lambda: not d._in_hand)
        third = await d.sweep()
        assert [(r.saga_id, r.status) for r in third.results] == [("slow", "ROLLED_BACK"), ("fast", "ROLLED_BACK")]
        assert STARTED == ["held", "quick"]
    finally:
        HELD.set()
        await d.close()
        wal.close()
