"""How the WAL's flusher sleeps and is woken: its bell, and the callers' wait for room.

What these pin: a fence and ``close`` each wake a flusher that would otherwise sleep for
an hour (its own timeouts never fire here), so nothing waits for the flusher's clock; a
record nobody waits for is written one linger after it was queued, not after the
flusher's longer sleep on an empty queue; the bell never loses a ring, never raises for a ring that came too late,
and never keeps one nobody needed; and the callers waiting for room are woken by the
flusher's ``notify_all`` (which costs nothing when nobody waits).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from agent_saga import FileWAL
from agent_saga.wal.batching import _Bell, _Room
from agent_saga.wal.file import iter_file_records


def _asleep_for_an_hour(wal: FileWAL) -> FileWAL:
    # The flusher's own timeouts (linger, and 20 x linger on an empty queue) never fire in
    # these tests: only a ring wakes it.
    wal._linger = 3600.0  # noqa: SLF001 - the flusher's clock, set out of the way
    return wal


def _seqs(path: Path) -> list[int]:
    return [r.seq for _, r in iter_file_records(path)]  # type: ignore[union-attr]


async def test_fences_and_close_wake_a_flusher_asleep_on_an_empty_queue(tmp_path: Path) -> None:
    path = tmp_path / "w.wal"
    wal = FileWAL(path)
    try:
        await wal.barrier(wal.append("SAGA_STARTED", "s-1", None, {}))  # the flusher runs
        _asleep_for_an_hour(wal)
        await asyncio.sleep(0.3)  # past its last 0.1 s sleep: now on the hour-long one
        for i in range(3):
            seq = wal.append("STEP_INTENT", "s-1", f"s-1/{i}", {"i": i})
            await wal.barrier(seq, timeout=30)  # WALStalled if the fence did not wake it
            assert wal.stats().durable_seq == seq
        last = wal.append("STEP_INTENT", "s-1", "s-1/3", {"i": 3})  # nobody waits for it
    finally:
        wal.close(timeout=30)  # WALStalled if close did not wake it
    assert _seqs(path) == [1, 2, 3, 4, last]


def _wait_in_thread(lock: threading.Lock, bell: _Bell, timeout: float, out: list[bool]) -> threading.Thread:
    def run() -> None:
        with lock:
            out.append(bell.wait(timeout))

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_ring_is_heard_by_a_sleeper_and_not_kept_without_one() -> None:
    lock = threading.Lock()
    bell = _Bell(lock)
    with lock:
        bell.notify()  # nobody asleep: like a condition's notify, it is not kept
        assert bell.wait(0.01) is False
    out: list[bool] = []
    t = _wait_in_thread(lock, bell, 30, out)
    while True:
        with lock:
            if bell.asleep:
                bell.notify()
                break
    t.join(30)
    assert out == [True]  # rung, not timed out
    with lock:
        assert not bell.asleep
        assert bell.wait(0.01) is False  # the ring was used up


def test_a_ring_after_a_timed_out_wait_wakes_the_next_wait_once() -> None:
    lock = threading.Lock()
    bell = _Bell(lock)
    out: list[bool] = []
    t = _wait_in_thread(lock, bell, 0.01, out)
    while True:
        lock.acquire()
        if bell.asleep:
            break
        lock.release()
    # Hold the lock past the sleeper's timeout: it gives up waiting on the bell and waits
    # for the lock, still marked asleep. Ring then, twice.
    threading.Event().wait(0.3)
    bell.notify()
    bell.notify()  # a second ring of the same sleep adds nothing
    lock.release()
    t.join(30)
    with lock:
        if out == [False]:  # timed out before the ring (the late ring this is about) ...
            assert bell.wait(30) is True  # ... which is not lost: the next wait has it
        # Either way the two rings woke exactly one wait.
        assert bell.wait(0.01) is False


def test_a_ring_while_the_bell_is_still_rung_does_not_raise() -> None:
    lock = threading.Lock()
    bell = _Bell(lock)
    with lock:
        bell.asleep = True  # a late ring is pending and the flusher has just gone to sleep
        bell._bell.release()  # noqa: SLF001 - the pending ring
        bell.notify()  # a plain Lock would raise RuntimeError here
        assert bell.wait(30) is True
        assert bell.wait(0.01) is False


def test_room_wakes_every_caller_waiting_and_is_quiet_without_one() -> None:
    lock = threading.Lock()
    room = _Room(lock)
    with lock:
        room.notify_all()  # nobody waits: nothing to do, nothing kept
        assert room.wait(0.01) is False
    woken: list[bool] = []

    def wait() -> None:
        with lock:
            woken.append(room.wait(30))

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    while True:
        with lock:
            if len(room._waiters) == 3:  # noqa: SLF001 - all three are waiting
                room.notify_all()
                break
    for t in threads:
        t.join(30)
    assert woken == [True, True, True]


def test_a_record_nobody_waits_for_is_written_after_the_linger_not_the_idle_sleep(tmp_path: Path) -> None:
    # On an empty queue the flusher sleeps 20 x linger; the first record of a batch rings
    # it, so the record is written about one linger after its append. Here the linger is
    # 1 s and the idle sleep 20 s: a record still queued after 10 s waited for the sleep.
    import time

    wal = FileWAL(tmp_path / "l.wal")
    try:
        wal.barrier_sync(wal.append("SAGA_STARTED", "s-1", None, {}))
        wal._linger = 1.0  # noqa: SLF001 - the flusher's clock
        time.sleep(0.3)  # past its last 0.1 s sleep: asleep on the empty queue, now for 20 s
        seq = wal.append("STEP_INTENT", "s-1", "s-1/0", {"tool": "cache.put"})  # no fence
        deadline = time.monotonic() + 10
        while wal.stats().durable_seq < seq:
            assert time.monotonic() < deadline, "the record waited for the flusher's idle sleep"
            time.sleep(0.01)
    finally:
        wal.close()
