"""The WAL contract, run against FileWAL, RedisWAL, PostgresWAL and SinkWAL over an
asynchronous PostgreSQL store (real servers).

Ordering, barrier, group commit, stalls, backpressure, rejected records, paging,
reopen-continues-chain, compaction with attestation, tamper detection, damaged records,
a failed batch. Each backend's specifics (restarts, fleets, credentials) are in its own
test module.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _wal_backends import Harness, harness_for
from agent_saga import (
    BaseWAL,
    WALBackpressure,
    WALClosed,
    WALCorrupt,
    WALError,
    WALStalled,
    verify_records,
)
from agent_saga.chain import removal_digest
from agent_saga.records import encode_line
from agent_saga.wal.file import iter_file_records
from fixtures.polling import until

BACKENDS = ["file", "redis", "postgres", "postgres-async"]


@pytest.fixture(params=BACKENDS)
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_for(request.param, request, tmp_path) as harness:
        yield harness


def poll(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    until(what, predicate, timeout=timeout, interval=0.01)


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


def settle(wal: BaseWAL, sid: str, *, done: bool) -> None:
    wal.append("SAGA_STARTED", sid, None, {"name": "pay"})
    wal.append("STEP_INTENT", sid, f"{sid}/0", {"tool": "stripe.charge", "amount": 4200})
    wal.append("STEP_COMMITTED", sid, f"{sid}/0", {"tool": "stripe.charge", "charge": "ch_1"})
    if done:
        wal.append("SAGA_COMPLETED", sid, None, {})


async def test_concurrent_appends_are_ordered_durable_and_chained(h: Harness) -> None:
    wal = h.open()
    acked: list[int] = []

    async def agent(i: int) -> None:
        for k in range(10):
            seq = wal.append("STEP_COMMITTED", f"s-{i}", f"s-{i}/{k}", {"i": i, "k": k, "note": "café ✓"})
            await wal.barrier(seq)
            acked.append(seq)

    await asyncio.gather(*(agent(i) for i in range(32)))
    # Durable means readable by anyone now, before close.
    recs = h.records()
    assert [r.seq for r in recs] == list(range(1, 321)) == sorted(acked)
    assert all(r.payload["note"] == "café ✓" for r in recs)
    st = wal.stats()
    assert st.durable_seq == 320 and st.batches < 320  # group commit
    wal.close()
    res = h.verify()
    assert res.ok and res.records == 320 and res.head == recs[-1].hash


async def test_barrier_sync_from_threads(h: Harness) -> None:
    wal = h.open()
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
    assert len(h.records()) == 160 and h.verify().ok


async def test_a_stall_fails_the_writer_and_later_calls_raise_at_once(h: Harness) -> None:
    wedge = Wedge("before_write")
    wal = h.open(fault_hook=wedge)
    seq = wal.append("STEP_INTENT", "s-1", "s-1/0", {})
    with pytest.raises(WALStalled, match=f"seq {seq} not durable within 0.2s"):
        await wal.barrier(seq, timeout=0.2)
    with pytest.raises(WALStalled, match="will not be written") as ei:
        await asyncio.to_thread(wal.barrier_sync, seq, timeout=30)
    assert isinstance(ei.value.__cause__, WALStalled)
    with pytest.raises(WALStalled, match="stalled earlier and accepts no records"):
        wal.append("STEP_INTENT", "s-1", "s-1/1", {})
    wedge.release.set()
    with pytest.raises(WALStalled):
        wal.close()
    # What landed is a verifiable prefix (the batch in flight may or may not have).
    poll(lambda: wal.stats().durable_seq == seq, "the write in flight to land")
    assert h.verify().ok and [r.seq for r in h.records()] == [seq]


async def test_backpressure_raise_never_drops(h: Harness) -> None:
    wedge = Wedge("before_write")
    wal = h.open(max_pending=5, fault_hook=wedge)
    wal.append("X", "s-1", None, {"i": 0})
    assert wedge.reached.wait(5)
    accepted = [wal.append("X", "s-1", None, {"i": i}) for i in range(1, 6)]
    with pytest.raises(WALBackpressure, match="max_pending=5"):
        wal.append("X", "s-1", None, {"i": 99})
    wedge.release.set()
    await wal.barrier(accepted[-1])
    wal.close()
    assert [r.payload["i"] for r in h.records()] == [0, 1, 2, 3, 4, 5]


async def test_unencodable_payload_is_rejected_in_the_log(h: Harness) -> None:
    wal = h.open()
    bad = wal.append("STEP_COMMITTED", "s-1", "s-1/0", {"when": object()})
    good = wal.append("STEP_COMMITTED", "s-1", "s-1/1", {"ok": True})
    nan = wal.append("STEP_COMMITTED", "s-1", "s-1/2", {"amount": float("nan")})
    with pytest.raises(WALError, match=f"seq {bad} was rejected"):
        await wal.barrier(bad)
    await wal.barrier(good)
    with pytest.raises(WALError, match="rejected"):
        await wal.barrier(nan)
    wal.close()
    recs = h.records()
    assert [r.type for r in recs] == ["RECORD_REJECTED", "STEP_COMMITTED", "RECORD_REJECTED"]
    assert recs[0].payload["original_type"] == "STEP_COMMITTED"
    assert h.verify().ok


async def test_read_all_pages_and_read_since_is_a_cursor(h: Harness) -> None:
    wal = h.open()
    for i in range(25):
        wal.append("X", "s-1", None, {"i": i})
    await wal.barrier()
    all_ = [r async for r in wal.read_all(page_size=7)]
    assert [r.payload["i"] for r in all_] == list(range(25))
    cursors = [BaseWAL.cursor(r) for r in all_]
    assert cursors == sorted(set(cursors))
    since = [r.payload["i"] async for r in wal.read_since(cursors[19], page_size=2)]
    assert since == [20, 21, 22, 23, 24]
    assert [r async for r in wal.read_since(cursors[-1])] == []
    wal.close()


async def test_reopen_continues_sequence_and_chain(h: Harness) -> None:
    for round_ in range(3):
        wal = h.open()
        for i in range(4):
            wal.append("STEP_INTENT", f"s-{round_}", None, {"i": i})
        await wal.barrier()
        wal.close()
    recs = h.records()
    assert [r.seq for r in recs] == list(range(1, 13))
    assert recs[4].prev == recs[3].hash
    assert h.verify().ok


async def test_compaction_attests_what_left_and_survives_later_compactions(h: Harness) -> None:
    wal = h.open()
    for i in range(6):
        settle(wal, f"s-{i}", done=i % 2 == 0)
    await wal.barrier()
    before = {r.seq: r for r in h.records()}
    report = await wal.compact()
    gone = sorted(s for s, r in before.items() if r.saga in {"s-0", "s-2", "s-4"})
    assert report.removed == len(gone) == 12 and report.kept == 9
    assert report.digest == removal_digest(before[s].hash for s in gone)
    after = h.records()
    assert {r.saga for r in after} == {"s-1", "s-3", "s-5", "wal"}
    att = after[-1]
    assert att.type == "COMPACTION" and att.seq == report.attestation_seq == 22
    assert [(a, b) for a, b, _ in att.payload["removed"]] == list(report.runs)
    res = h.verify()
    assert res.ok and res.attested == 12, res
    # Appends continue the chain after the attestation; a later compaction keeps it.
    wal.append("SAGA_COMPLETED", "s-1", None, {})
    settle(wal, "s-9", done=False)
    await wal.barrier()
    second = await wal.compact(keep_sagas={"s-3"})  # s-3 is open anyway; s-1 now leaves
    assert second.sagas_removed == 1
    wal.close()
    wal = h.open()  # reopen after compaction continues the chain
    seq = wal.append("X", "s-9")
    await wal.barrier(seq)
    wal.close()
    recs = h.records()
    assert [r.type for r in recs if r.saga == "wal"] == ["COMPACTION", "COMPACTION"]
    assert {r.saga for r in recs} == {"s-3", "s-5", "s-9", "wal"}
    assert h.verify().ok
    # An unexplained gap is still an attack: delete a kept record.
    victim = next(r.seq for r in recs if r.saga == "s-5")
    h.delete(victim)
    res = h.verify()
    assert not res.ok and "no compaction attestation accounts for them" in (res.reason or "")


async def test_compaction_of_a_stalled_writer_is_bounded(h: Harness) -> None:
    wedge = Wedge("before_compact")
    wal = h.open(fault_hook=wedge)
    settle(wal, "s-0", done=True)
    await wal.barrier()
    with pytest.raises(WALStalled, match="compaction"):
        await wal.compact(timeout=0.2)
    wedge.release.set()
    await wal.barrier()
    wal.close()
    assert h.verify().ok and h.records()[-1].type == "COMPACTION"


@pytest.mark.parametrize("attack", ["alter", "delete", "swap"])
async def test_tampering_is_detected_and_named(h: Harness, attack: str) -> None:
    wal = h.open()
    for i in range(8):
        wal.append("STEP_COMMITTED", "s-1", f"s-1/{i}", {"amount": 100 * i})
    await wal.barrier()
    wal.close()
    assert h.verify().ok
    if attack == "alter":
        h.alter_payload(5, {"amount": 1})
    elif attack == "delete":
        h.delete(5)
    else:
        h.swap(4, 5)
    res = h.verify()
    assert not res.ok and res.location and res.reason
    assert res.first_bad_seq in (4, 5, 6), res


async def test_damaged_records_are_named_and_a_damaged_head_refuses_reopen(h: Harness) -> None:
    wal = h.open()
    for i in range(4):
        wal.append("X", "s-1", None, {"i": i})
    await wal.barrier()
    wal.close()
    h.corrupt(2)
    res = h.verify()
    assert not res.ok and res.first_bad_seq == 2 and "not valid JSON" in (res.reason or "")
    h.corrupt(4)
    with pytest.raises(WALCorrupt):
        h.open()


async def test_a_failed_batch_fails_the_writer_and_reopen_continues(h: Harness) -> None:
    boom = ConnectionResetError(104, "Connection reset by peer")

    def hook(point: str) -> None:
        if point == "before_write" and armed.is_set():
            raise boom

    armed = threading.Event()
    wal = h.open(fault_hook=hook)
    first = wal.append("X", "s-1", None, {"i": 0})
    await wal.barrier(first)
    armed.set()
    lost = wal.append("X", "s-1", None, {"i": 1})
    with pytest.raises(WALError) as ei:
        await wal.barrier(lost)
    assert ei.value.__cause__ is boom  # the real error, chained
    with pytest.raises(WALError, match="failed earlier"):
        wal.append("X", "s-1")
    with pytest.raises(WALError):
        wal.close()
    wal = h.open()
    again = wal.append("X", "s-1", None, {"i": 2})
    await wal.barrier(again)
    wal.close()
    recs = h.records()
    assert [r.payload["i"] for r in recs] == [0, 2] and again == 2  # never acknowledged, never written
    assert h.verify().ok


async def test_closed_wal_refuses(h: Harness) -> None:
    wal = h.open()
    wal.append("X", "s-1")
    wal.close()
    with pytest.raises(WALClosed):
        wal.append("X", "s-1")
    with pytest.raises(WALClosed):
        await wal.compact()
    assert len(h.records()) == 1


async def test_one_writers_log_verifies_as_a_file_whatever_is_stamped(h: Harness, tmp_path: Path) -> None:
    wal = h.open()
    for i in range(6):
        settle(wal, f"s-{i}", done=i % 3 == 0)
    await wal.barrier()
    await wal.compact()
    wal.close()
    recs = h.records()
    if h.name != "file":
        assert all({"gseq", "writer"} <= set(r.extra) for r in recs)  # stamped, not hashed
    out = tmp_path / "exported.wal"
    out.write_bytes(b"".join(encode_line(r) for r in recs))
    res = verify_records(iter_file_records(out))
    assert res.ok and res.records == len(recs) and res.attested > 0
