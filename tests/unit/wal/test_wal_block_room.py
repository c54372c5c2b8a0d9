"""``Backpressure.BLOCK``: a caller that waited for room appends to the queue the flusher
reads next, never to the batch the flusher took while it waited.

The flusher takes a queue that is one batch whole (no copy) and leaves a new one in its
place. A caller that had looked at the queue before it waited for room must look again:
appended to the batch being sealed, its record either broke the seal (the writer failed)
or was counted durable without being written (its fence returned, the chain's head moved
to an unsealed record).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from agent_saga import Backpressure, FileWAL, verify_records
from agent_saga.wal.file import iter_file_records


async def test_a_caller_that_waited_for_room_lands_in_the_next_batch(tmp_path: Path) -> None:
    held = [threading.Event(), threading.Event()]  # the flusher reached write 1, write 2
    go = [threading.Event(), threading.Event()]
    writes = [0]

    def hold_writes(point: str) -> None:
        if point == "before_write" and writes[0] < 2:
            n = writes[0]
            writes[0] += 1
            held[n].set()
            go[n].wait(30)

    path = tmp_path / "b.wal"
    wal = FileWAL(path, max_pending=1, backpressure=Backpressure.BLOCK, stall_timeout=30,
                  fault_hook=hold_writes)
    try:
        wal.append("X", "s-1", None, {"i": 1})  # max_pending=1 is a full batch: it goes at once
        assert await asyncio.to_thread(held[0].wait, 30)  # the flusher holds seq 1
        wal.append("X", "s-1", None, {"i": 2})  # seq 2 fills the queue
        blocked = asyncio.create_task(asyncio.to_thread(wal.append, "X", "s-1", None, {"i": 3}))
        await asyncio.sleep(0.05)
        assert not blocked.done()  # waiting for room
        go[0].set()  # seq 1 lands; the flusher takes seq 2 (room) and seals it
        assert await asyncio.to_thread(held[1].wait, 30)
        assert await asyncio.wait_for(blocked, 30) == 3  # woken for room, not at its bound
        go[1].set()
        await wal.barrier(3, timeout=30)
    finally:
        for g in go:
            g.set()
        wal.close(timeout=30)
    items = list(iter_file_records(path))
    assert [(r.seq, r.payload) for _, r in items] == [  # type: ignore[union-attr]
        (1, {"i": 1}), (2, {"i": 2}), (3, {"i": 3}),
    ]
    assert verify_records(items).ok  # the chain links 3 to 2 (its head was never moved early)
