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

import pytest
from agent_saga import FileWAL, WALError
from agent_saga.wal.batching import _Bell, _Room
from agent_saga.wal.file import iter_file_records
from fixtures.polling import until


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
        threading.Event().wait(0.001)  # let the sleeper take the lock
    t.join(30)
    assert out == [True]  # rung, not timed out
    with lock:
        assert not bell.asleep
        assert bell.wait(0.01) is False  # the ring was used up


class _HeldBack:
    """A lock whose next acquire, once armed, first stops until let through: the moment
    after the sleeper's wait timed out and before it holds the lock again."""

    def __init__(self) -> None:
        self.inner = threading.Lock()
        self.armed = False
        self.reached = threading.Event()
        self.go = threading.Event()

    def acquire(self) -> bool:
        if self.armed:
            self.armed = False
            self.reached.set()
            self.go.wait(30)
        return self.inner.acquire()

    def release(self) -> None:
        self.inner.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_ring_after_a_timed_out_wait_wakes_the_next_wait_once() -> None:
    lock = _HeldBack()
    bell = _Bell(lock)  # type: ignore[arg-type]
    out: list[bool] = []

    def sleeper() -> None:
        with lock:
            lock.armed = True  # the acquire after the wait stops
            out.append(bell.wait(0.01))

    t = threading.Thread(target=sleeper)
    t.start()
    assert lock.reached.wait(30)  # the wait timed out; the sleeper is still marked asleep
    with lock.inner:
        assert bell.asleep
        bell.notify()  # too late for that wait
        bell.notify()  # a second ring of the same sleep adds nothing
    lock.go.set()
    t.join(30)
    assert out == [False]
    with lock:
        assert bell.wait(30) is True  # the late ring is not lost: the next wait has it
        assert bell.wait(0.01) is False  # and the two rings woke that one wait only


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
        threading.Event().wait(0.001)  # let them take the lock
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
        until("the record durable without waiting for the flusher's idle sleep",
              lambda: wal.stats().durable_seq >= seq, timeout=10, interval=0.01)
    finally:
        wal.close()


async def test_a_lone_fence_asks_at_once_and_still_waits_for_its_write(tmp_path: Path) -> None:
    # One saga stepping: each batch holds one fence, so the next fence asks the flusher
    # at once instead of at the end of the loop's turn. It still returns only once its
    # record is written, and a write that fails fails it.
    held, go = threading.Event(), threading.Event()
    fail = threading.Event()

    def hook(point: str) -> None:
        if point == "before_write" and fail.is_set():
            raise OSError("disk gone")
        if point == "before_write" and not go.is_set():
            held.set()
            go.wait(30)

    path = tmp_path / "lone.wal"
    wal = FileWAL(path, fault_hook=hook)
    try:
        go.set()
        for i in range(3):
            await wal.barrier(wal.append("STEP_INTENT", "s-1", f"s-1/{i}", {"i": i}))
        assert wal._lone  # noqa: SLF001 - the last batch held one fence alone
        go.clear()
        seq = wal.append("STEP_INTENT", "s-1", "s-1/3", {"i": 3})
        fence = asyncio.create_task(wal.barrier(seq, timeout=30))
        assert await asyncio.to_thread(held.wait, 30)  # its batch is being written
        await asyncio.sleep(0.05)
        assert not fence.done() and wal.stats().durable_seq < seq  # not before its write
        go.set()
        await fence
        assert wal.stats().durable_seq == seq

        # Fences that gather while a batch is written: that batch hands back several, so
        # the next fences go back to one ask per turn of the loop.
        held.clear()
        go.clear()
        first = asyncio.create_task(wal.barrier(wal.append("STEP_INTENT", "s-1", "s-1/4", {})))
        assert await asyncio.to_thread(held.wait, 30)
        seqs = [wal.append("STEP_INTENT", f"s-{k}", None, {}) for k in range(8)]
        rest = [asyncio.create_task(wal.barrier(s)) for s in seqs]
        await asyncio.sleep(0.05)  # they join the loop's waiting fences
        go.set()
        await asyncio.gather(first, *rest)
        assert not wal._lone  # noqa: SLF001

        # The early ask of a lone fence whose write fails: the fence raises.
        await wal.barrier(wal.append("STEP_INTENT", "s-1", "s-1/5", {}))
        assert wal._lone  # noqa: SLF001 - one fence alone again
        fail.set()
        doomed = wal.append("STEP_INTENT", "s-1", "s-1/6", {})
        with pytest.raises(WALError, match="disk gone"):
            await wal.barrier(doomed, timeout=30)
    finally:
        go.set()
        try:
            wal.close(timeout=30)
        except WALError:
            pass  # failed above, as intended
    assert [r.seq for _, r in iter_file_records(path)][-1] < doomed  # type: ignore[union-attr]
