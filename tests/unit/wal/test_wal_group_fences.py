"""Fences share a batch's wake-up; a batch is sealed with one credential-hint scan.

What these pin: one ``call_soon_threadsafe`` per loop per batch however many fences wait,
a cancelled fence leaves the others of its batch waiting (and a failed batch then fails
every other one), a fence that joined while an
earlier batch was being written returns only once its own batch is durable, and ``seal_batch`` writes the same
chain (the documented formula) and redacts the same secrets as sealing each record alone.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from pathlib import Path

import pytest
from agent_saga import FileWAL, Record, WALClosed, WALError, verify_records
from agent_saga.chain import content_digest, header_hash, seal_batch
from agent_saga.records import GENESIS, canonical_json
from agent_saga.scrubber import REDACTED
from agent_saga.wal.file import iter_file_records
from fixtures.polling import until_async


class Gate:
    """A fault hook that stops the flusher before each write until that write is let go."""

    def __init__(self) -> None:
        self.entered: queue.Queue[None] = queue.Queue()
        self.go: queue.Queue[None] = queue.Queue()
        self.open = threading.Event()

    def __call__(self, point: str) -> None:
        if point == "before_write" and not self.open.is_set():
            self.entered.put(None)
            self.go.get(timeout=30)

    async def reached(self) -> None:
        await asyncio.to_thread(self.entered.get, timeout=30)


async def test_many_fences_of_one_loop_are_woken_with_one_hop_per_batch(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "g.wal")
    loop = asyncio.get_running_loop()
    hops = []
    real = loop.call_soon_threadsafe

    def counted(cb, *args, **kw):  # type: ignore[no-untyped-def]
        if threading.current_thread().name.startswith("agent-saga-wal-flusher"):
            hops.append(cb)
        return real(cb, *args, **kw)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        async def one(i: int) -> None:
            for _ in range(4):
                await wal.barrier(wal.append("STEP_INTENT", f"s-{i}", None, {"i": i}))

        before = wal.stats().batches
        await asyncio.gather(*(one(i) for i in range(100)))
        batches = wal.stats().batches - before
    finally:
        del loop.call_soon_threadsafe
        wal.close()
    # 400 fences; each batch hands the loop its fences once
    assert 0 < len(hops) <= batches < 400 / 2, (len(hops), batches)
    assert verify_records(iter_file_records(tmp_path / "g.wal")).ok


async def test_a_cancelled_fence_leaves_the_others_of_its_batch_waiting(tmp_path: Path) -> None:
    gate = Gate()
    wal = FileWAL(tmp_path / "c.wal", fault_hook=gate)
    try:
        seqs = [wal.append("STEP_INTENT", "s-1", None, {"i": i}) for i in range(3)]
        tasks = [asyncio.create_task(wal.barrier(s)) for s in seqs]
        await gate.reached()  # the flusher holds all three records, unwritten
        tasks[1].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
        assert not tasks[0].done() and not tasks[2].done()  # cancelling one woke no other
        gate.open.set()
        gate.go.put(None)
        await asyncio.gather(tasks[0], tasks[2])
        assert wal.stats().durable_seq >= seqs[2]
    finally:
        gate.open.set()
        gate.go.put(None)
        wal.close()


async def test_a_fence_waiting_during_an_earlier_batch_returns_only_with_its_own(tmp_path: Path) -> None:
    gate = Gate()
    wal = FileWAL(tmp_path / "w.wal", fault_hook=gate)
    try:
        first = wal.append("STEP_INTENT", "s-1", None, {"i": 1})
        t1 = asyncio.create_task(wal.barrier(first))
        await gate.reached()  # batch 1 (seq 1 alone) is in the flusher's hands
        second = wal.append("STEP_INTENT", "s-1", None, {"i": 2})
        t2 = asyncio.create_task(wal.barrier(second))
        await asyncio.sleep(0)  # one turn: t2 joins the fences waiting on this loop
        gate.go.put(None)  # batch 1 lands: it wakes the first fence only
        await t1
        await gate.reached()  # batch 2 (seq 2) is held before its write
        assert wal.stats().durable_seq == first
        assert not t2.done(), "a fence returned before its record was durable"
        gate.go.put(None)
        await until_async("the second fence returns", t2.done)
        await t2
        assert wal.stats().durable_seq >= second
    finally:
        gate.open.set()
        gate.go.put(None)
        wal.close()


class FailingGate(Gate):
    """A ``Gate`` whose write, once let go, fails (a device error)."""

    def __call__(self, point: str) -> None:
        super().__call__(point)
        if point == "before_write":
            raise OSError(5, "Input/output error")


async def test_a_cancelled_fence_among_many_then_a_failed_batch_fails_every_other(tmp_path: Path) -> None:
    """Eight fences of one batch, two of them cancelled: those raise CancelledError alone, and when the batch's write fails every
    other fence raises WALError naming the cause (none returns as if durable)."""
    gate = FailingGate()
    wal = FileWAL(tmp_path / "f.wal", fault_hook=gate)
    try:
        seqs = [wal.append("STEP_INTENT", f"s-{i}", None, {"i": i}) for i in range(8)]
        tasks = [asyncio.create_task(wal.barrier(s)) for s in seqs]
        await gate.reached()  # the flusher holds all eight records, unwritten
        for i in (2, 5):
            tasks[i].cancel()
        for i in (2, 5):
            with pytest.raises(asyncio.CancelledError):
                await tasks[i]
        assert not any(t.done() for i, t in enumerate(tasks) if i not in (2, 5))
        gate.go.put(None)  # the write fails: fail-stop
        for i, t in enumerate(tasks):
            if i in (2, 5):
                continue
            with pytest.raises(WALError, match="Input/output error"):
                await t
        assert wal.stats().durable_seq == 0
    finally:
        gate.open.set()
        gate.go.put(None)
        with pytest.raises(WALError):
            wal.close()


def _batch(payloads: list[dict]) -> list[Record]:
    return [Record("STEP_INTENT", "saga-1", f"saga-1/{i}", p, i + 1, 1_700_000_000_000_000 + i)
            for i, p in enumerate(payloads)]


def _check_chain(sealed: list[tuple[Record, str]]) -> None:
    prev = GENESIS
    for rec, canonical in sealed:
        assert canonical == ("null" if rec.payload is None else canonical_json(rec.payload))
        assert rec.prev == prev
        assert rec.digest == content_digest(rec.salt, canonical)
        assert rec.hash == header_hash(rec)
        prev = rec.hash


def test_seal_batch_writes_the_documented_chain_and_redacts_by_key_name() -> None:
    payloads = [{"tool": "stripe.charge", "i": i} for i in range(20)]
    payloads[7] = {"tool": "db.login", "password": "hunter2-correct-horse"}  # no shape: by its key
    sealed = seal_batch(_batch(payloads), GENESIS, on_error=lambda r, e: pytest.fail(f"{e}"))
    _check_chain(sealed)
    assert sealed[7][0].payload == {"tool": "db.login", "password": REDACTED}
    assert all(rec.payload == payloads[i] for i, (rec, _) in enumerate(sealed) if i != 7)


def test_seal_batch_scans_for_shapes_when_one_payload_of_the_batch_holds_a_hint() -> None:
    key = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
    payloads = [{"tool": "stripe.charge", "i": i} for i in range(20)]
    payloads[13] = {"tool": "stripe.charge", "customer_note": f"use {key} here"}
    sealed = seal_batch(_batch(payloads), GENESIS, on_error=lambda r, e: pytest.fail(f"{e}"))
    _check_chain(sealed)
    text = sealed[13][1]
    assert key not in text and REDACTED in text
    assert sealed[0][0].payload == payloads[0]


def test_seal_batch_hands_an_unencodable_record_to_on_error_and_keeps_the_chain() -> None:
    payloads: list[dict] = [{"i": 0}, {"bad": float("nan")}, {"i": 2}]
    rejected = []

    def reject(rec: Record, exc: Exception) -> None:
        rejected.append((rec.seq, type(exc).__name__))
        rec.payload = {"original_type": rec.type, "error": str(exc)}
        rec.type = "RECORD_REJECTED"

    sealed = seal_batch(_batch(payloads), GENESIS, on_error=reject)
    assert rejected == [(2, "ValueError")]
    assert [r.type for r, _ in sealed] == ["STEP_INTENT", "RECORD_REJECTED", "STEP_INTENT"]
    _check_chain(sealed)


async def test_a_fence_for_a_seq_never_written_raises_when_the_wal_closes(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "n.wal")
    last = wal.append("STEP_INTENT", "s-1", None, {"i": 1})
    waiting = asyncio.create_task(wal.barrier(last + 5))  # a seq nobody appended
    await asyncio.sleep(0)  # one turn: the fence joins the loop's waiting fences
    wal.close()
    with pytest.raises(WALClosed, match=f"closed before seq {last + 5} was durable"):
        await waiting
