"""A daemon's sync handlers run on a pool of its own, as wide as its ``concurrency``.

The process's tool executor (an agent's tools; by default cpus + 4 threads) does not bound
how many compensations a daemon runs at once, and a daemon does not fill it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from agent_saga import (
    FileWAL,
    compensator,
    set_tool_executor_size,
    tool_executor_stats,
)
from agent_saga.recovery import RecoveryDaemon
from recovery_support import FUTURE, append_orphan

TOGETHER = threading.Barrier(4, timeout=20)  # passes only when four refunds run at once
THREADS: set[str] = set()


@compensator("test.recovery.refund_together")
def refund_together(charge_id: str, idempotency_key: str) -> str:
    THREADS.add(threading.current_thread().name)
    TOGETHER.wait()
    return "refunded"


def orphan(wal: FileWAL, saga_id: str) -> None:
    append_orphan(wal, saga_id, "test.recovery.refund_together")


async def test_concurrency_sync_handlers_run_at_once_whatever_the_process_pool_size(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "a.wal")
    for s in ("s1", "s2", "s3", "s4"):
        orphan(wal, s)
    size = tool_executor_stats().max_workers
    set_tool_executor_size(1)  # the process's pool: one thread
    d = RecoveryDaemon(wal, clock=FUTURE, concurrency=4, compensation_timeout=None)
    try:
        rep = await d.sweep()
    finally:
        set_tool_executor_size(size)
        await d.close()
        wal.close()
    assert sorted((r.saga_id, r.status) for r in rep.results) == [
        ("s1", "ROLLED_BACK"), ("s2", "ROLLED_BACK"), ("s3", "ROLLED_BACK"), ("s4", "ROLLED_BACK")]
    assert len(THREADS) == 4 and all(t.startswith("agent-saga-recovery") for t in THREADS), THREADS
    assert d.executor.stats().saturated_count == 0
