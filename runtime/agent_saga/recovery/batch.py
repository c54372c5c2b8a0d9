"""Requests made in one event-loop turn, sent to a store together: one round trip, not one each.

A daemon resolves ``concurrency`` sagas at once, and its workers move in step: the WAL's
group commit wakes several of them in the same turn, and each then claims, journals or
releases. ``TurnBatch`` collects the requests made during one turn of the event loop and
hands them to ``send`` together at the start of the next turn (a Lua script over many
keys, or one pipeline); each caller gets its own answer. While one batch is on its way,
the requests made meanwhile wait for it and go together as the next one (group commit):
a busy daemon's batches grow with its load instead of splitting into one round trip per
turn, and an idle one's request still goes at the next turn.

Invariants:
- Nothing is weaker than one request at a time: each caller returns only once its own
  request was answered by the store, with its own result or its own error; a request is
  never dropped, merged with another, or answered for another.
- A failure of the whole round trip (the store cannot be reached) is every caller's
  error; a per-request error (``send`` returns an exception in its slot) is only its own.
- Per event loop: a batch never mixes requests of two loops (a client belongs to one).
- At most one batch per event loop is on its way at a time; the next is sent as soon as
  it has answered or failed, so a request waits at most one round trip before it goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["TurnBatch"]

T = TypeVar("T")


class TurnBatch(Generic[T]):
    """``await batch.submit(item)``: ``send(items)`` runs once per turn for every item
    submitted in that turn and returns one result (or exception) per item, in order."""

    def __init__(self, send: Callable[[list[T]], Awaitable[Sequence[Any]]]) -> None:
        self._send = send
        self._pending: dict[int, list[tuple[T, asyncio.Future[Any]]]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._busy: dict[int, asyncio.AbstractEventLoop] = {}  # loops with a batch on its way (held: ids stay theirs)
        self.batches = 0  # round trips sent (diagnostics, tests)
        self.items = 0  # requests carried by them

    async def submit(self, item: T) -> Any:
        """Queue ``item`` for this turn's batch; its result once the store answered."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        pending = self._pending.setdefault(id(loop), [])
        pending.append((item, fut))
        if len(pending) == 1 and id(loop) not in self._busy:
            loop.call_soon(self._flush, loop)
        return await fut

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        if id(loop) in self._busy:
            return  # the batch on its way sends these when it is done
        batch = self._pending.pop(id(loop), [])
        if batch:
            self._busy[id(loop)] = loop
            task = loop.create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            task.add_done_callback(lambda _t: self._next(loop))

    def _next(self, loop: asyncio.AbstractEventLoop) -> None:
        """A batch of ``loop`` is done: send what was asked meanwhile."""
        self._busy.pop(id(loop), None)
        if self._pending.get(id(loop)) and not loop.is_closed():
            self._flush(loop)

    async def _run(self, batch: list[tuple[T, asyncio.Future[Any]]]) -> None:
        self.batches += 1
        self.items += len(batch)
        try:
            results = await self._send([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} requests got {len(results)} answers")
        except BaseException as exc:  # noqa: BLE001 - every caller gets it, none is left waiting
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for (_, fut), result in zip(batch, results, strict=True):
            if fut.done():
                continue  # the caller was cancelled
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)
