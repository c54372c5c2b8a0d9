"""Requests to a store made while a batch is on its way go together as the next batch.

``TurnBatch`` (``recovery.batch``) sends one batch per event loop at a time: what the
daemon's workers ask for meanwhile waits for it and goes in one round trip, so a busy
daemon's batches grow with its load instead of one round trip per event-loop turn.
"""

from __future__ import annotations

import asyncio

import pytest
from agent_saga.recovery.batch import TurnBatch


class Store:
    """A store whose answers the test releases one batch at a time."""

    def __init__(self, fail_first: bool = False) -> None:
        self.sent: list[list[str]] = []
        self.answer = asyncio.Event()
        self.fail_first = fail_first

    async def send(self, items: list[str]) -> list[str]:
        self.sent.append(list(items))
        await self.answer.wait()
        self.answer.clear()
        if self.fail_first and len(self.sent) == 1:
            raise ConnectionError("the store did not answer")
        return [f"ok {i}" for i in items]


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_requests_made_while_a_batch_is_on_its_way_go_together_next() -> None:
    store = Store()
    batch: TurnBatch[str] = TurnBatch(store.send)
    first = asyncio.ensure_future(batch.submit("a"))
    await turns(3)
    assert store.sent == [["a"]]
    later = [asyncio.ensure_future(batch.submit(x)) for x in ("b", "c")]
    await turns(1)
    later.append(asyncio.ensure_future(batch.submit("d")))  # another turn, the same wait
    await turns(3)
    assert store.sent == [["a"]], "nothing else is sent while the first batch is on its way"
    store.answer.set()
    assert await first == "ok a"
    await turns(3)
    assert store.sent == [["a"], ["b", "c", "d"]]
    store.answer.set()
    assert await asyncio.gather(*later) == ["ok b", "ok c", "ok d"]
    assert (batch.batches, batch.items) == (2, 4)


async def test_a_failed_batch_fails_its_callers_only_and_the_next_one_still_goes() -> None:
    store = Store(fail_first=True)
    batch: TurnBatch[str] = TurnBatch(store.send)
    first = asyncio.ensure_future(batch.submit("a"))
    await turns(3)
    second = asyncio.ensure_future(batch.submit("b"))
    await turns(3)
    store.answer.set()
    with pytest.raises(ConnectionError, match="did not answer"):
        await first
    await turns(3)
    assert store.sent == [["a"], ["b"]]
    store.answer.set()
    assert await second == "ok b"
