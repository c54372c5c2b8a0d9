"""Claimants share reads of the log: one read serves every caller that asked before it
began, and a read that began before a caller asked never serves that caller."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agent_saga.recovery import RecoveryDaemon
from recovery_support import FUTURE, desc, write_orphan


async def test_callers_waiting_on_a_read_share_the_next_one_which_sees_what_they_waited_for(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s1", [{"comp": desc("c1")}])
    d = RecoveryDaemon(wal, clock=FUTURE)
    real = d.source.read_pages
    reads = 0
    first_read_done = asyncio.Event()
    release = asyncio.Event()

    async def counted() -> Any:
        nonlocal reads
        reads += 1
        async for page in real():
            yield page
        if reads == 1:  # the first read has read the log, and is held before it ends
            first_read_done.set()
            await release.wait()

    d.source.read_pages = counted  # type: ignore[method-assign]
    first = asyncio.ensure_future(d._refresh())
    await first_read_done.wait()
    # Written after the first read looked: a caller asking now needs a read begun later.
    write_orphan(wal, "s2", [{"comp": desc("c2")}])
    waiting = [asyncio.ensure_future(d._refresh()) for _ in range(3)]
    for _ in range(3):
        await asyncio.sleep(0)  # let each waiter reach the read lock
    release.set()
    await asyncio.gather(first, *waiting)
    assert reads == 2  # the first, and one read shared by the three that asked during it
    assert set(d.scan.in_flight) == {"s1", "s2"}  # that shared read began after they asked
    await d._refresh()
    assert reads == 3  # a caller alone always gets a read of its own
    await d.close()
