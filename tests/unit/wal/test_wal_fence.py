"""``BaseWAL.fence`` always agrees with ``barrier``: what the engine awaits for a durable
step is the WAL's own fence, and a subclass that overrides only ``barrier`` is fenced
through that ``barrier``."""

from __future__ import annotations

from pathlib import Path

from agent_saga import ActionSemantics, Compensation, FileWAL, saga_scope
from agent_saga.wal.base import BaseWAL
from agent_saga.wal.batching import BatchingWAL


class Counting(FileWAL):
    """A FileWAL whose ``barrier`` counts the records it was asked to make durable."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.asked: list[int | None] = []

    async def barrier(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        self.asked.append(seq)
        await super().barrier(seq, timeout=timeout)


def test_a_batching_wal_answers_its_fence_without_a_coroutine() -> None:
    assert FileWAL.fence is BatchingWAL.fence
    assert BatchingWAL.fence is not BaseWAL.fence


def test_a_subclass_that_overrides_barrier_gets_its_barrier_as_its_fence() -> None:
    assert Counting.fence is BaseWAL.fence


async def test_a_durable_step_waits_through_an_overridden_barrier(tmp_path: Path) -> None:
    wal = Counting(tmp_path / "w.wal")
    try:
        async with saga_scope(wal, saga_id="fenced") as saga:
            await saga.execute(
                "stripe.charge", ActionSemantics.COMPENSABLE, lambda: {"id": "ch_1"},
                lambda r: Compensation(handler="stripe.refund", kwargs={"id": r["id"]}),
            )
    finally:
        wal.close()
    # The intent and the commit of the step, then SAGA_COMPLETED: every fence the engine
    # took went through the subclass's barrier.
    assert wal.asked == [2, 3, 4]
