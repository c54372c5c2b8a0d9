"""A durable step's fences on their error paths, with the steps waiting when the outcome
arrives: the flusher holds the batch (a fault hook) until the test lets it go.

What these pin: cancelling one step among several waiting for their intents in one batch
cancels that step alone (its forward never runs, the others go on); a failed write fails
every step waiting for it, and none runs its forward; a stall past the fences' bound
raises ``WALStalled`` in every waiting step, and none runs its forward; a WAL closed
while a step waits writes the intent (so the forward may run) and refuses the commit;
and, at the WAL, a rejected record fails its own waiting fence only, not the others of
its batch.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from pathlib import Path

import pytest
from agent_saga import (
    ActionSemantics,
    Compensation,
    FileWAL,
    WALClosed,
    WALError,
    WALStalled,
    saga_scope,
)
from agent_saga.wal.file import iter_file_records
from fixtures.polling import until_async

C = ActionSemantics.COMPENSABLE


class Hold:
    """A fault hook that stops the flusher before each write until that write is let go
    (``go``), or fails it (``fail``), or lets every write through once ``open`` is set."""

    def __init__(self, *, fail: bool = False) -> None:
        self.entered: queue.Queue[None] = queue.Queue()
        self.go: queue.Queue[None] = queue.Queue()
        self.open = threading.Event()
        self.fail = fail

    def __call__(self, point: str) -> None:
        if point == "before_write" and not self.open.is_set():
            self.entered.put(None)
            self.go.get(timeout=30)
            if self.fail:
                raise OSError(5, "Input/output error")

    async def reached(self) -> None:
        await asyncio.to_thread(self.entered.get, timeout=30)

    def release(self) -> None:
        self.open.set()
        self.go.put(None)


def _undo(r: object) -> Compensation:
    return Compensation(fn=lambda: None)


async def _steps(saga, ran: list[int], n: int) -> list[asyncio.Task]:  # type: ignore[no-untyped-def]
    async def forward(i: int) -> int:
        ran.append(i)
        return i

    return [
        asyncio.create_task(saga.execute(f"t{i}", C, lambda i=i: forward(i), _undo)) for i in range(n)
    ]


async def test_cancelling_one_waiting_step_cancels_it_alone(tmp_path: Path) -> None:
    hold = Hold()
    wal = FileWAL(tmp_path / "c.wal", fault_hook=hold)
    ran: list[int] = []
    try:
        async with saga_scope(wal, name="c") as saga:
            tasks = await _steps(saga, ran, 4)
            await hold.reached()  # the flusher holds the four intents, unwritten
            tasks[1].cancel()
            with pytest.raises(asyncio.CancelledError):
                await tasks[1]
            assert not any(t.done() for i, t in enumerate(tasks) if i != 1)  # it woke no other
            hold.release()
            assert await asyncio.gather(tasks[0], tasks[2], tasks[3]) == [0, 2, 3]
    finally:
        hold.release()
        wal.close()
    assert sorted(ran) == [0, 2, 3]  # the cancelled step's forward never ran
    recs = [r for _, r in iter_file_records(tmp_path / "c.wal")]
    failed = [r for r in recs if r.type == "STEP_FAILED"]
    assert [(r.step, r.payload["started"]) for r in failed] == [(f"{saga.saga_id}/1", False)]
    assert sorted(r.step for r in recs if r.type == "STEP_COMMITTED") == [f"{saga.saga_id}/{i}" for i in (0, 2, 3)]


async def test_a_failed_write_fails_every_waiting_step_and_runs_no_forward(tmp_path: Path) -> None:
    hold = Hold(fail=True)
    wal = FileWAL(tmp_path / "f.wal", fault_hook=hold)
    ran: list[int] = []
    try:
        with pytest.raises(WALError):  # the scope cannot complete on a failed writer
            async with saga_scope(wal, name="f") as saga:
                tasks = await _steps(saga, ran, 4)
                await hold.reached()
                hold.go.put(None)  # the write fails: fail-stop
                for t in tasks:
                    with pytest.raises(WALError, match="Input/output error") as ei:
                        await t
                    assert isinstance(ei.value.__cause__, OSError)
    finally:
        hold.open.set()
        hold.go.put(None)
        with pytest.raises(WALError):
            wal.close()
    assert ran == []


async def test_a_stall_past_the_bound_fails_every_waiting_step_and_runs_no_forward(tmp_path: Path) -> None:
    hold = Hold()
    wal = FileWAL(tmp_path / "s.wal", fault_hook=hold, stall_timeout=0.3)
    ran: list[int] = []
    try:
        with pytest.raises(WALStalled):  # the scope's rollback and end meet a stalled writer
            async with saga_scope(wal, name="s") as saga:
                tasks = await _steps(saga, ran, 3)
                await hold.reached()  # wedged: the write never returns within the bound
                for t in tasks:
                    with pytest.raises(WALStalled, match="not durable"):
                        await asyncio.wait_for(t, 60)  # a guard against a hang, not a timing claim
                own = [t for t in tasks if "not durable within 0.3s" in str(t.exception())]
                assert own, [str(t.exception()) for t in tasks]  # at least one passed its own bound
    finally:
        hold.release()
        with pytest.raises(WALStalled):
            wal.close()
    assert ran == []


async def test_a_wal_closed_while_a_step_waits_writes_its_intent_and_refuses_its_commit(tmp_path: Path) -> None:
    hold = Hold()
    wal = FileWAL(tmp_path / "x.wal", fault_hook=hold)
    ran: list[int] = []
    try:
        with pytest.raises(WALClosed):
            async with saga_scope(wal, name="x") as saga:
                (task,) = await _steps(saga, ran, 1)
                await hold.reached()
                closing = asyncio.ensure_future(asyncio.to_thread(wal.close))
                await until_async("close() began", lambda: wal._closing)
                hold.release()  # close writes what is queued: the intent becomes durable
                await closing
                with pytest.raises(WALClosed, match="is closed"):
                    await task
    finally:
        hold.release()
    assert ran == [0]  # its intent was durable, so the forward ran; its commit was refused
    recs = [r for _, r in iter_file_records(tmp_path / "x.wal")]
    assert [r.type for r in recs] == ["SAGA_STARTED", "STEP_INTENT"]


async def test_a_rejected_record_fails_its_own_waiting_fence_only(tmp_path: Path) -> None:
    hold = Hold()
    wal = FileWAL(tmp_path / "r.wal", fault_hook=hold)
    try:
        seqs = [
            wal.append("STEP_INTENT", "s-1", None, {"i": 0}),
            wal.append("STEP_INTENT", "s-1", None, {"when": object()}),  # cannot be encoded
            wal.append("STEP_INTENT", "s-1", None, {"i": 2}),
        ]
        tasks = [asyncio.create_task(wal.barrier(s)) for s in seqs]
        await hold.reached()  # one batch of three, sealed (the middle one rejected), unwritten
        assert not any(t.done() for t in tasks)
        hold.release()
        await tasks[0]
        await tasks[2]
        with pytest.raises(WALError, match=f"seq {seqs[1]} was rejected") as ei:
            await tasks[1]
        assert isinstance(ei.value.__cause__, TypeError)
        assert wal.stats().failed is None  # a rejection does not fail the writer
    finally:
        hold.release()
        wal.close()
    types = [r.type for _, r in iter_file_records(tmp_path / "r.wal")]
    assert types == ["STEP_INTENT", "RECORD_REJECTED", "STEP_INTENT"]


async def test_an_observer_hears_each_fence_a_step_waited_on(tmp_path: Path) -> None:
    from agent_saga import observe

    class Fences(observe.Observer):
        def __init__(self) -> None:
            self.waits: list[float] = []

        def fence_waited(self, seconds: float) -> None:
            self.waits.append(seconds)

    hold = Hold()
    wal = FileWAL(tmp_path / "o.wal", fault_hook=hold)
    obs = observe.add_observer(Fences())

    async def one_write_at_a_time() -> None:
        # Lets each write go from the loop, so no record becomes durable between its
        # append and its fence (that code runs without yielding): every fence waits.
        while True:
            await hold.reached()
            hold.go.put(None)

    feeder = asyncio.create_task(one_write_at_a_time())
    ran: list[int] = []
    try:
        async with saga_scope(wal, name="o") as saga:
            (task,) = await _steps(saga, ran, 1)
            assert await task == 0
    finally:
        observe.remove_observer(obs)
        feeder.cancel()
        hold.release()
        hold.entered.put(None)  # the feeder's waiting thread returns
        wal.close()
    # the intent's and the commit's fences, and the saga's end
    assert len(obs.waits) == 3 and all(w >= 0 for w in obs.waits), obs.waits
