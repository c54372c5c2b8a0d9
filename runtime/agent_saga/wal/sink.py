"""The engine's WAL over any asynchronous store: ``AsyncSink`` (what a store must provide)
and ``SinkWAL`` (the whole WAL contract on top of it).

The engine never touches a disk or a server itself: it appends records, waits on a
fence and reads back, through ``BaseWAL``. ``SinkWAL`` keeps everything that makes that a
WAL -- the queue, the private flusher, group commit, the hash chain, fences with a bound,
backpressure, fail-stop, rejected records, compaction planning -- and asks the store for
only this (``AsyncSink``, every method a coroutine):

- ``open()`` / ``close()``: connect (creating what the store needs) and release.
- ``tail(writer)``: the writer's last stored record, or None for a new chain.
- ``append(writer, batch, expect)``: store one sealed batch durably, as one unit, only if
  the writer's last stored ``seq`` is still ``expect``; otherwise store nothing and raise
  (the fence: a second process with the same writer id, or records removed underneath).
  Stamp each record's ``gseq`` (a global order over every writer) as the store keeps it.
- ``chain(writer, after, limit)``: one writer's records with ``seq > after`` in ``seq``
  order, as ``(location, record-or-WALCorrupt)`` pairs.
- ``read_since(cursor, limit)``: every writer's records with ``gseq > cursor`` in
  ``gseq`` order, such that a record stored later never has a smaller ``gseq`` than one
  already read (the cursor never skips).
- ``resolved()``: the sagas with a terminal record, over every writer.
- ``replace(writer, attestation, runs, removed)``: store the sealed compaction
  attestation and delete the writer's ``runs`` of sequences atomically; raise
  ``CompactionAborted`` if it knows nothing changed.

The sink's coroutines run on one event loop of its own, on a thread ``SinkWAL`` owns: the
flusher thread hands it a batch and waits for the result (so a slow store never runs on
the caller's loop, and a store driver bound to one loop is only ever used from that
loop); reads are awaited from the caller's loop without blocking it. A store error is a
failed batch like any other backend's: it fails the writer, chained to the real error.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any, TypeVar

from ..chain import seal
from ..errors import ConfigurationError, WALClosed, WALCorrupt, WALError
from ..records import Record, validate_id
from .base import Backpressure, FaultHook
from .batching import BatchingWAL, Sealed, default_writer_id
from .compaction import CompactionAborted, CompactionPlan, CompactionReport, CompactionRequest
from .urls import Scrubber

T = TypeVar("T")

Located = tuple[str, Record | WALCorrupt]


class AsyncSink(abc.ABC):
    """What an asynchronous store provides for ``SinkWAL`` (see the module doc)."""

    #: A password-free name of the store, for messages and logs.
    name: str = "sink"
    #: What a completed ``append`` guarantees (``SinkWAL.durability`` repeats it).
    durability: str = "unspecified"
    #: Strings that must never appear in a message (passwords of the store's address).
    secrets: Sequence[str] = ()

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect, creating the store's tables or keys if absent."""

    @abc.abstractmethod
    async def tail(self, writer: str) -> Located | None:
        """The last record ``writer`` stored, or None."""

    @abc.abstractmethod
    async def append(self, writer: str, batch: Sealed, expect: int) -> None:
        """Store ``batch`` durably as one unit if ``writer``'s last ``seq`` is ``expect``."""

    @abc.abstractmethod
    async def chain(self, writer: str, after: int, limit: int) -> list[Located]:
        """Up to ``limit`` of ``writer``'s records with ``seq > after``, in ``seq`` order."""

    @abc.abstractmethod
    async def read_since(self, cursor: int, limit: int) -> list[Record]:
        """Up to ``limit`` records of every writer with ``gseq > cursor``, in ``gseq`` order."""

    @abc.abstractmethod
    async def resolved(self) -> set[str]:
        """The sagas with a terminal record."""

    @abc.abstractmethod
    async def replace(
        self, writer: str, attestation: tuple[Record, str], runs: Sequence[tuple[int, int]], removed: int
    ) -> None:
        """Store ``attestation`` and delete ``runs`` of ``writer`` in one atomic unit."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the connections."""


class SinkWAL(BatchingWAL):
    """The WAL contract over an ``AsyncSink``; ``barrier`` means the sink's ``append`` returned.

    Args:
        sink: the store (not yet opened; ``SinkWAL`` opens and closes it).
        writer: this writer's id (default: unique per process). Reopening a writer id
            continues its sequence and chain from the store.
        open_timeout: seconds to wait for ``sink.open()`` and ``sink.tail()``.
        max_pending, backpressure, stall_timeout, max_batch, fault_hook: as for FileWAL.

    Raises ``ConfigurationError`` on bad arguments, the sink's error (chained in a
    ``WALError``) if it cannot open, ``WALCorrupt`` if the writer's last record cannot be read.
    """

    backend = "sink"

    def __init__(
        self,
        sink: AsyncSink,
        *,
        writer: str | None = None,
        open_timeout: float = 10.0,
        max_pending: int = 100_000,
        backpressure: Backpressure = Backpressure.RAISE,
        stall_timeout: float = 30.0,
        max_batch: int = 1000,
        fault_hook: FaultHook | None = None,
    ) -> None:
        if not isinstance(sink, AsyncSink):
            raise ConfigurationError(
                f"sink must be an agent_saga.wal.AsyncSink, got {type(sink).__name__}"
            )
        self.writer = validate_id(writer if writer is not None else default_writer_id(), "writer")
        self._sink = sink
        super().__init__(
            name=f"{sink.name} writer {self.writer}",
            scrub=Scrubber(list(sink.secrets)),
            max_pending=max_pending,
            backpressure=backpressure,
            stall_timeout=stall_timeout,
            max_batch=max_batch,
            fault_hook=fault_hook,
        )
        self._aloop = asyncio.new_event_loop()
        self._athread = threading.Thread(
            target=self._aloop.run_forever, name="agent-saga-wal-sink", daemon=True
        )
        self._athread.start()
        self._opened = True  # from here on, a failure closes what open() reached
        try:
            self._call(sink.open(), open_timeout)
            tail = self._call(sink.tail(self.writer), open_timeout)
        except BaseException as exc:
            self._release()
            if isinstance(exc, (ConfigurationError, WALCorrupt)):
                raise
            raise WALError(
                f"cannot open SinkWAL: {sink.name} failed: "
                f"{self._scrub(f'{type(exc).__name__}: {exc}')}"
            ) from exc
        self.durability = sink.durability
        self._start_from(tail)

    # ------------------------------------------------------------------ the sink's loop

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the sink's loop from a thread; return its result or raise."""
        self._live(coro)
        fut = asyncio.run_coroutine_threadsafe(coro, self._aloop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"{self._sink.name} did not answer within {timeout}s") from None

    async def _acall(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the sink's loop from another loop, without blocking it."""
        self._live(coro)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._aloop))

    def _live(self, coro: Coroutine[Any, Any, Any]) -> None:
        if self._aloop.is_closed() or not self._athread.is_alive():
            coro.close()
            raise WALClosed(f"WAL {self.name} is closed; open a new SinkWAL to read or append")

    # ------------------------------------------------------------------ BatchingWAL I/O

    def _write_batch(self, sealed: Sealed) -> None:
        self._call(self._sink.append(self.writer, sealed, sealed[0][0].seq - 1))

    def _compact_now(self, req: CompactionRequest, prev: str) -> tuple[CompactionReport, str]:
        try:
            plan = CompactionPlan(self._call(self._sink.resolved()), req.keep_sagas)
            after = 0
            while True:
                page = self._call(self._sink.chain(self.writer, after, 1000))
                for _loc, item in page:
                    if isinstance(item, WALCorrupt):
                        raise item
                    plan.offer(item)
                    after = item.seq
                if len(page) < 1000:
                    break
            rec = plan.attestation(req.seq)
            canonical = seal(rec, prev)
        except Exception as exc:  # noqa: BLE001 - nothing was written yet: abort, unchanged
            raise CompactionAborted(
                f"compaction of {self.name} read failed, nothing was changed: "
                f"{self._scrub(f'{type(exc).__name__}: {exc}')}"
            ) from exc
        report = plan.report(req.seq)
        self._call(self._sink.replace(self.writer, (rec, canonical), report.runs, report.removed))
        return report, rec.hash

    def _release(self) -> None:
        try:
            if self._opened:
                self._opened = False
                self._call(self._sink.close(), 10.0)
        finally:
            if not self._aloop.is_closed():
                self._aloop.call_soon_threadsafe(self._aloop.stop)
                self._athread.join(10.0)
                if not self._athread.is_alive():
                    self._aloop.close()

    # ------------------------------------------------------------------ reads

    async def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every writer's records in ``gseq`` order (see ``read_since``)."""
        async for rec in self.read_since(0, page_size=page_size):
            yield rec

    async def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every writer's records with ``gseq > seq`` in ``gseq`` order, ``page_size`` at a
        time; ``seq`` is a cursor (``BaseWAL.cursor`` of the last record read)."""
        cursor = seq
        while True:
            page = await self._acall(self._sink.read_since(cursor, page_size))
            for rec in page:
                yield rec
            if len(page) < page_size:
                return
            cursor = self.cursor(page[-1])

    async def read_chain(self, writer: str | None = None, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """One writer's chain (default: this one) in ``seq`` order; raises ``WALCorrupt``."""
        after = 0
        while True:
            page = await self._acall(self._sink.chain(writer or self.writer, after, page_size))
            for _loc, item in page:
                if isinstance(item, WALCorrupt):
                    raise item
                yield item
                after = item.seq
            if len(page) < page_size:
                return
