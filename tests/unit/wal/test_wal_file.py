"""FileWAL: durability fence, group commit, backpressure, stalls, failures, reopen, torn tails."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from agent_saga import (
    Backpressure,
    ConfigurationError,
    FileWAL,
    WALBackpressure,
    WALClosed,
    WALCorrupt,
    WALError,
    WALStalled,
    verify_records,
)
from agent_saga.wal.file import iter_file_records, torn_tail_bytes
from fixtures.wal import records


def verify(path: Path):
    return verify_records(iter_file_records(path))


class Wedge:
    """A fault hook that blocks the flusher at a named point until released."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.release = threading.Event()
        self.reached = threading.Event()

    def __call__(self, point: str) -> None:
        if point == self.point and not self.release.is_set():
            self.reached.set()
            self.release.wait(30)


async def test_append_barrier_roundtrip_and_chain(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    wal = FileWAL(p)
    s1 = wal.append("SAGA_STARTED", "s-1", None, {"name": "demo"})
    s2 = wal.append("STEP_INTENT", "s-1", "s-1/0", {"tool": "stripe.charge", "amount": 4200, "note": "café"})
    assert (s1, s2) == (1, 2)
    await wal.barrier(s2)
    # durable means on disk now, before close
    on_disk = records(p)
    assert [r.seq for r in on_disk] == [1, 2]
    assert on_disk[1].payload == {"tool": "stripe.charge", "amount": 4200, "note": "café"}
    wal.close()
    res = verify(p)
    assert res.ok and res.records == 2 and res.head == on_disk[1].hash
    assert oct(os.stat(p).st_mode & 0o777) == "0o600"


async def test_reopen_continues_sequence_and_chain(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    for round_ in range(3):
        wal = FileWAL(p)
        for i in range(4):
            wal.append("STEP_INTENT", f"s-{round_}", None, {"i": i})
        await wal.barrier()
        wal.close()
    recs = records(p)
    assert [r.seq for r in recs] == list(range(1, 13))
    assert verify(p).ok
    # the first record of the second session points at the last of the first
    assert recs[4].prev == recs[3].hash


async def test_group_commit_shares_syncs(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "g.wal")

    async def one(i: int) -> None:
        for _ in range(5):
            await wal.barrier(wal.append("STEP_INTENT", f"s-{i}", None, {"i": i}))

    await asyncio.gather(*(one(i) for i in range(64)))
    st = wal.stats()
    wal.close()
    assert st.durable_seq == 320
    # 320 fenced records; without group commit that would be 320 syncs
    assert st.syncs < 320 / 2, st


async def test_backpressure_raise_never_drops(tmp_path: Path) -> None:
    wedge = Wedge("before_write")
    wal = FileWAL(tmp_path / "b.wal", max_pending=5, fault_hook=wedge)
    wal.append("X", "s-1", None, {"i": 0})
    assert wedge.reached.wait(5)  # the flusher holds record 1 and is stuck
    accepted = [wal.append("X", "s-1", None, {"i": i}) for i in range(1, 6)]
    with pytest.raises(WALBackpressure, match="max_pending=5"):
        wal.append("X", "s-1", None, {"i": 99})
    wedge.release.set()
    await wal.barrier(accepted[-1])
    wal.close()
    recs = records(tmp_path / "b.wal")
    assert [r.payload["i"] for r in recs] == [0, 1, 2, 3, 4, 5]  # the refused one is absent, nothing else is


async def test_backpressure_block_is_bounded_and_a_stall_fails_the_writer(tmp_path: Path) -> None:
    wedge = Wedge("before_write")
    wal = FileWAL(tmp_path / "b.wal", max_pending=1, backpressure=Backpressure.BLOCK,
                  stall_timeout=0.2, fault_hook=wedge)
    wal.append("X", "s-1")
    assert wedge.reached.wait(5)  # seq 1 is in the flusher's hands, stuck
    wal.append("X", "s-1")  # seq 2 waits in the queue
    with pytest.raises(WALStalled, match="no room"):
        wal.append("X", "s-1")
    # Fail-stop: the next call raises at once, with the first stall as its cause.
    with pytest.raises(WALStalled, match="stalled earlier and accepts no records") as ei:
        wal.append("X", "s-1")
    assert isinstance(ei.value.__cause__, WALStalled) and "no room" in str(ei.value.__cause__)
    with pytest.raises(WALStalled, match="seq 2 is not durable and will not be written"):
        await wal.barrier(2)
    with pytest.raises(WALStalled, match="stalled before close"):
        wal.close()  # at once: the flusher is still stuck in seq 1's write
    wedge.release.set()
    # The batch in flight was in doubt; it landed when the device came back. The queued
    # record was never written.
    deadline = asyncio.get_running_loop().time() + 10
    while wal.stats().durable_seq < 1:
        assert asyncio.get_running_loop().time() < deadline, "the write in flight never landed"
        await asyncio.sleep(0.01)
    await wal.barrier(1)  # true: seq 1 is on disk
    assert [r.seq for r in records(tmp_path / "b.wal")] == [1]
    reopened = FileWAL(tmp_path / "b.wal")  # the flusher released the lock when it returned
    assert reopened.stats().durable_seq == 1
    reopened.close()


async def test_barrier_raises_walstalled_on_a_wedged_device_and_the_writer_stays_failed(tmp_path: Path) -> None:
    wedge = Wedge("before_sync")
    wal = FileWAL(tmp_path / "s.wal", fault_hook=wedge)
    seq = wal.append("STEP_INTENT", "s-1", "s-1/0", {})
    with pytest.raises(WALStalled, match=f"seq {seq} not durable within 0.2s"):
        await wal.barrier(seq, timeout=0.2)
    # Every later fence, sync or async, and every append raises at once with that cause.
    for attempt in (
        lambda: asyncio.to_thread(wal.barrier_sync, seq, timeout=30),
        lambda: wal.barrier(seq),
    ):
        with pytest.raises(WALStalled, match=f"seq {seq} is not durable and will not be written") as ei:
            await attempt()
        assert f"seq {seq} not durable within 0.2s" in str(ei.value.__cause__)
    with pytest.raises(WALStalled, match="stalled earlier"):
        wal.append("STEP_INTENT", "s-1", "s-1/1", {})
    assert wal.stats().failed is not None and "not durable within 0.2s" in wal.stats().failed
    wedge.release.set()
    with pytest.raises(WALStalled):
        wal.close()


async def test_write_failure_reaches_every_waiter_and_later_caller(tmp_path: Path) -> None:
    # /dev/full is a real device whose writes fail with ENOSPC.
    wal = FileWAL("/dev/full")
    seq = wal.append("STEP_INTENT", "s-1", "s-1/0", {"tool": "x"})
    with pytest.raises(WALError) as ei:
        await wal.barrier(seq)
    assert isinstance(ei.value.__cause__, OSError) and ei.value.__cause__.errno == errno.ENOSPC
    with pytest.raises(WALError, match="failed earlier"):
        wal.append("STEP_INTENT", "s-1", "s-1/1", {})
    with pytest.raises(WALError):
        wal.close()


async def test_unencodable_payload_is_rejected_in_the_log_not_dropped(tmp_path: Path) -> None:
    p = tmp_path / "r.wal"
    wal = FileWAL(p)
    bad = wal.append("STEP_COMMITTED", "s-1", "s-1/0", {"when": object()})
    good = wal.append("STEP_COMMITTED", "s-1", "s-1/1", {"ok": True})
    with pytest.raises(WALError, match=f"seq {bad} was rejected"):
        await wal.barrier(bad)
    await wal.barrier(good)  # an unrelated later record is unaffected
    wal.close()
    recs = records(p)
    assert recs[0].type == "RECORD_REJECTED" and recs[0].payload["original_type"] == "STEP_COMMITTED"
    assert "not JSON serializable" in recs[0].payload["error"]
    assert verify(p).ok


async def test_nan_is_rejected(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "n.wal")
    seq = wal.append("X", "s-1", None, {"amount": float("nan")})
    with pytest.raises(WALError, match="rejected"):
        await wal.barrier(seq)
    wal.close()


def test_second_writer_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "w.wal"
    wal = FileWAL(p)
    with pytest.raises(ConfigurationError, match="already open for writing"):
        FileWAL(p)
    wal.close()
    FileWAL(p).close()  # released on close


def test_a_second_open_in_the_same_process_says_so_and_how_to_reuse_the_first(tmp_path: Path) -> None:
    """(A notebook that ran saga_scope() holds the default WAL; opening the file again there
    is not "another process".)"""
    p = tmp_path / "w.wal"
    wal = FileWAL(p)
    with pytest.raises(ConfigurationError, match="already open for writing in this process, by another FileWAL") as info:
        FileWAL(str(tmp_path / "." / "w.wal"))  # the same file, named differently
    assert "get_default_wal()" in str(info.value) and "close() it first" in str(info.value)
    wal.close()
    FileWAL(p).close()


def test_a_writer_in_another_process_is_named_as_such(tmp_path: Path) -> None:
    import subprocess
    import sys

    p = tmp_path / "w.wal"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from agent_saga import FileWAL; w = FileWAL(sys.argv[1]); print('held', flush=True); sys.stdin.read()", str(p)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigurationError, match="already open for writing by another process"):
            FileWAL(p)
    finally:
        holder.communicate("")


def test_closed_wal_refuses_appends(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "c.wal")
    wal.append("X", "s-1")
    wal.close()
    with pytest.raises(WALClosed):
        wal.append("X", "s-1")
    assert len(records(tmp_path / "c.wal")) == 1  # close wrote what was queued


def test_barrier_sync_from_threads(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "t.wal")
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(20):
                wal.barrier_sync(wal.append("X", f"s-{i}"))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wal.close()
    assert not errors
    assert len(records(tmp_path / "t.wal")) == 160 and verify(tmp_path / "t.wal").ok


async def test_read_all_and_read_since_page(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "p.wal")
    for i in range(25):
        wal.append("X", "s-1", None, {"i": i})
    await wal.barrier()
    all_ = [r.seq async for r in wal.read_all(page_size=7)]
    since = [r.seq async for r in wal.read_since(20, page_size=2)]
    wal.close()
    assert all_ == list(range(1, 26))
    assert since == [21, 22, 23, 24, 25]


async def test_torn_final_line_tolerated_and_moved_aside(tmp_path: Path) -> None:
    p = tmp_path / "torn.wal"
    wal = FileWAL(p)
    for i in range(3):
        wal.append("STEP_INTENT", "s-1", None, {"i": i})
    await wal.barrier()
    wal.close()
    fragment = b'{"v":1,"seq":4,"ts":17,"type":"STEP_INT'
    with open(p, "ab") as f:
        f.write(fragment)  # a power cut mid-write
    assert torn_tail_bytes(p) == len(fragment)
    res = verify(p)
    assert res.ok and res.records == 3  # earlier records verify; the fragment is not hidden-in
    wal = FileWAL(p)
    seq = wal.append("STEP_INTENT", "s-2", None, {"after": True})
    await wal.barrier(seq)
    wal.close()
    recs = records(p)
    assert [r.seq for r in recs] == [1, 2, 3, 4, 5]
    assert recs[3].type == "WAL_TORN_TAIL" and recs[3].payload["bytes"] == len(fragment)
    sidecar = Path(recs[3].payload["sidecar"])
    assert sidecar.read_bytes() == fragment  # nothing lost: kept for forensics
    assert recs[4].payload == {"after": True}
    assert verify(p).ok and torn_tail_bytes(p) == 0


def test_torn_first_line_of_a_new_log(tmp_path: Path) -> None:
    p = tmp_path / "t0.wal"
    p.write_bytes(b'{"v":1,"se')
    wal = FileWAL(p)
    wal.close()
    recs = records(p)
    assert [r.type for r in recs] == ["WAL_TORN_TAIL"] and recs[0].seq == 1


async def test_damaged_last_complete_record_refuses_open(tmp_path: Path) -> None:
    p = tmp_path / "d.wal"
    wal = FileWAL(p)
    wal.append("X", "s-1")
    await wal.barrier()
    wal.close()
    with open(p, "ab") as f:
        f.write(b"this is not json\n")
    with pytest.raises(WALCorrupt, match="last complete record"):
        FileWAL(p)


def test_normal_exit_writes_queued_records(tmp_path: Path) -> None:
    # Records nobody waited for (REVERSIBLE steps) still reach the disk on a normal exit.
    p = tmp_path / "exit.wal"
    code = (
        "from agent_saga import FileWAL\n"
        f"w = FileWAL({str(p)!r})\n"
        "for i in range(1000): w.append('X', 's-1', None, {'i': i})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert len(records(p)) == 1000 and verify(p).ok


def test_record_line_format_is_stable(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "f.wal")
    wal.append("SAGA_STARTED", "s-1", None, {"b": 1, "a": [1, 2]})
    wal.close()
    line = (tmp_path / "f.wal").read_text().splitlines()[0]
    d = json.loads(line)
    assert list(d) == ["v", "seq", "ts", "type", "saga", "step", "payload", "salt", "digest", "prev", "hash"]
    assert '"payload":{"a":[1,2],"b":1}' in line  # canonical: sorted keys, no spaces
    assert d["prev"] == "0" * 64 and len(d["salt"]) == 32


def test_records_nobody_waits_for_reach_the_disk_without_a_fence(tmp_path: Path) -> None:
    # REVERSIBLE steps never fence: their records must still be written, within linger.
    import time

    wal = FileWAL(tmp_path / "l.wal")
    try:
        wal.append("STEP_INTENT", "s-1", "s-1/0", {"tool": "cache.put"})
        deadline = time.monotonic() + 5
        while wal.stats().durable_seq < 1:
            assert time.monotonic() < deadline, "an unfenced record was never written"
            time.sleep(0.001)
        assert b'"type":"STEP_INTENT"' in (tmp_path / "l.wal").read_bytes()
    finally:
        wal.close()


async def test_a_burst_of_unfenced_records_shares_few_writes(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "burst.wal")
    for i in range(2000):
        wal.append("STEP_INTENT", "s-1", None, {"i": i})
    await wal.barrier()
    st = wal.stats()
    wal.close()
    assert st.durable_seq == 2000 and st.batches < 20, st  # not one wake-up per record
