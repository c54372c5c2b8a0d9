"""``WALSource``: recovery over an open ``BaseWAL`` (a RedisWAL or PostgresWAL fleet log, or
this process's own FileWAL), read with ``read_since(cursor)`` and written with ``append``.

The invariants are in ``recovery.sources``: reads are confirmed by the log where it can
(``RedisWAL.confirm_read``), and a claimed saga's records are read again by their places
(``RedisLog.records_at``), the re-reads of one event-loop turn in one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..audit.encryption import EncryptedWAL
from ..errors import WALCorrupt, WALStalled
from ..records import Record
from ..wal.base import BaseWAL
from ..wal.batching import SharedLogReads
from .batch import TurnBatch
from .errors import LocationUnavailable
from .logsource import LogSource
from .verified import Item, Rescan, VerifiedReads

__all__ = ["WALSource"]


class WALSource(LogSource):
    """An open ``BaseWAL``; the daemon appends to it directly. Not closed by the daemon.

    Records are read from the backend as stored (for an ``EncryptedWAL``, from the WAL it
    wraps), verified, then decrypted with the ``EncryptedWAL``'s key; an encrypted payload
    in a WAL not wrapped so halts the daemon (``WALKeyMissing``).
    """

    def __init__(self, wal: BaseWAL, reopen: Callable[[], BaseWAL] | None = None) -> None:
        super().__init__()
        from ..wal.file import FileWAL

        self._reopen = reopen
        self._reopening = threading.Lock()
        self._reading = 0  # reads in flight (their WAL may be one a reopen retired)
        self._retired: list[BaseWAL] = []  # replaced writers, closed once no read uses them
        self._use(wal)
        inner = self._raw
        self.fleet = not isinstance(inner, FileWAL)
        name = getattr(inner, "path", None) or getattr(inner, "name", None) or type(inner).__name__
        self.description = str(name)
        self._reads = VerifiedReads(self.description, fleet=self.fleet)
        self.rereads = callable(getattr(getattr(inner, "_log", None), "records_at", None))
        self._rereads: TurnBatch[list[tuple[str, int]]] = TurnBatch(self._read_places_many)
        self._cursor = 0
        self._last: tuple[str, int] | None = None  # (writer, gseq) of the newest record read

    def _use(self, wal: BaseWAL) -> None:
        self.wal = wal
        inner = wal.inner if isinstance(wal, EncryptedWAL) else wal
        self.encryptor = wal.encryptor if isinstance(wal, EncryptedWAL) else None
        self._raw = inner

    def _fresh_writer(self) -> BaseWAL:
        """The WAL, opened again by ``reopen`` when it failed: a fleet log's writer is
        fail-stop, and a server that failed over or came back must not stop recovery for
        good. (``open_wal`` gives the new writer a new id: a new chain in the same log.)"""
        with self._reopening:
            failed = getattr(self._raw.stats(), "failed", None) if hasattr(self._raw, "stats") else None
            if failed is not None and self._reopen is not None:
                old = self.wal
                self._use(self._reopen())
                if self._reading:
                    # A read in flight still uses it: closing its client now would cut the
                    # connection under that read (redis-py then fails with AttributeError,
                    # not a connection error). The last read to end closes it.
                    self._retired.append(old)
                else:
                    _close_failed(old)
            return self.wal

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[BaseWAL]:
        """The WAL a read uses, kept open until the read ends (see ``_fresh_writer``)."""
        with self._reopening:
            self._reading += 1
            raw = self._raw
        try:
            yield raw
        finally:
            with self._reopening:
                self._reading -= 1
                retired, self._retired = (self._retired, []) if not self._reading else ([], self._retired)
            for old in retired:
                await asyncio.to_thread(_close_failed, old)

    def _unreachable(self, exc: BaseException) -> LocationUnavailable:
        scrub = getattr(self._raw, "_scrub", str)
        return LocationUnavailable(
            f"{self.description}: the log cannot be read now ({scrub(f'{type(exc).__name__}: {exc}')}); "
            f"nothing was acted on, the next read tries again", path=self.description)

    async def _fetch_pages(self, from_start: bool) -> AsyncIterator[list[Item]]:
        # A server that cannot be reached (a Redis failover, a restart) is not a log that
        # cannot be trusted: this read stops, nothing is acted on, the next one retries.
        async with self._read() as raw:
            pages = self._pages_of(raw, from_start)
            try:
                async for page in pages:
                    yield page
            finally:
                await pages.aclose()  # type: ignore[attr-defined]

    async def _pages_of(self, raw: BaseWAL, from_start: bool) -> AsyncIterator[list[Item]]:
        unreachable: tuple[type[BaseException], ...] = getattr(raw, "_redis_errors", ())
        if from_start:
            self._last = None
        log_pages = getattr(getattr(raw, "_log", None), "pages_since", None)
        if isinstance(raw, SharedLogReads) and log_pages is not None:
            # A fleet log hands its records over a page at a time: no step of an async
            # iterator per record.
            # A writer with an entry that cannot be read is broken, not the log: the
            # others are read on (``VerifiedReads.writer_unreadable``); broken and
            # quarantined writers are not read at all.
            broken: dict[str, WALCorrupt] = {}
            quarantined: dict[str, dict[str, Any]] = {}
            pages = log_pages(self._cursor, self.page_size, broken=broken,
                              skip=frozenset(self._reads.broken), quarantined=quarantined)
            desc = self.description
            while True:
                try:
                    page = await asyncio.to_thread(next, pages, None)
                except unreachable as exc:
                    raise self._unreachable(exc) from exc
                except WALStalled as exc:
                    raise LocationUnavailable(
                        f"{exc.message}; nothing was acted on, the next read tries again", path=self.description) from exc
                self.quarantined = quarantined
                if page is None:
                    # Once the records read before it were handed on: a broken writer's
                    # sagas are then known, and held.
                    for w, bad in broken.items():
                        self._reads.writer_unreadable(w, bad)
                    break
                items: list[Item] = [
                    (f"{desc} gseq {g}" if (g := rec.extra.get("gseq")) is not None else f"{desc} seq {rec.seq}", rec)
                    for rec in page]
                for i in range(0, len(items), self.page_size):
                    chunk = items[i:i + self.page_size]
                    self._advance(chunk)
                    yield chunk
            return
        out: list[Item] = []
        records = raw.read_since(self._cursor, page_size=self.page_size)
        try:
            while True:
                try:
                    rec = await anext(records)
                except StopAsyncIteration:
                    break
                except unreachable as exc:
                    raise self._unreachable(exc) from exc
                except WALStalled as exc:
                    raise LocationUnavailable(
                        f"{exc.message}; nothing was acted on, the next read tries again", path=self.description) from exc
                g = rec.extra.get("gseq")
                out.append((f"{self.description} " + (f"gseq {g}" if g is not None else f"seq {rec.seq}"), rec))
                if len(out) >= self.page_size:
                    self._advance(out)
                    yield out
                    out = []
            if out:
                self._advance(out)
                yield out
        finally:
            await records.aclose()  # type: ignore[attr-defined]

    def _advance(self, page: list[Item]) -> None:
        for _, rec in page:
            if isinstance(rec, Record):
                w, g = rec.extra.get("writer"), rec.extra.get("gseq")
                if isinstance(w, str) and isinstance(g, int):
                    self._last = (w, g)
        self._cursor = max((BaseWAL.cursor(r) for _, r in page if isinstance(r, Record)), default=self._cursor)

    async def _confirm(self, from_start: bool, places: list[tuple[str, int]]) -> list[Any] | None:
        # Only what the log will keep is acted on (RedisWAL: confirmed on the replicas
        # with WAIT), and a newest record read that is gone means records were lost
        # from the end (a failover, a restore): read it again whole, never past them.
        # The claimed sagas' records are read again in the same request (``places``).
        async with self._read() as raw:
            confirm: Callable[..., Any] | None = getattr(raw, "confirm_read_at", None)
            if confirm is None:
                plain: Callable[[tuple[str, int] | None], bool] | None = getattr(raw, "confirm_read", None)
                if plain is None:
                    return None
                confirm = lambda last, _places: (plain(last), None)  # noqa: E731
            unreachable: tuple[type[BaseException], ...] = getattr(raw, "_redis_errors", ())
            try:
                kept, got = await asyncio.to_thread(confirm, self._last, places)
            except unreachable as exc:
                raise self._unreachable(exc) from exc
            except WALStalled as exc:
                raise LocationUnavailable(
                    f"{exc.message}; nothing was acted on, the next read tries again",
                    path=self.description) from exc
        if not kept:
            if from_start:
                raise LocationUnavailable(
                    f"{self.description}: records read were gone by the end of the read (a failover "
                    f"or restore); nothing was acted on, the next read tries again", path=self.description)
            raise Rescan(self.description)
        result: list[Any] | None = got
        return result

    async def _read_places(self, places: list[tuple[str, int]]) -> list[tuple[str, Record | WALCorrupt | None]]:
        # The re-reads of the sagas claimed in one event-loop turn share one round trip.
        result: list[tuple[str, Record | WALCorrupt | None]] = await self._rereads.submit(places)
        return result

    async def _read_places_many(self, batch: list[list[tuple[str, int]]]) -> list[Any]:
        flat = [p for places in batch for p in places]
        async with self._read() as raw:
            unreachable: tuple[type[BaseException], ...] = getattr(raw, "_redis_errors", ())
            try:
                got = await asyncio.to_thread(raw._log.records_at, flat)  # type: ignore[attr-defined]
            except unreachable as exc:
                raise self._unreachable(exc) from exc
        out, i = [], 0
        for places in batch:
            out.append(got[i:i + len(places)])
            i += len(places)
        return out

    def _rewind(self) -> None:
        self._cursor = 0
        self._last = None

    def _position(self) -> Any:
        return self._cursor, self._last

    def _set_position(self, position: Any) -> None:
        self._cursor, self._last = position

    @contextlib.asynccontextmanager
    async def writer(self) -> AsyncIterator[BaseWAL]:
        """A writer for the recovery records (held for the block); a failed one is opened
        again first when the source can (``reopen``)."""
        yield await asyncio.to_thread(self._fresh_writer) if self._reopen is not None else self.wal


def _close_failed(wal: BaseWAL) -> None:
    with contextlib.suppress(Exception):
        wal.close()  # failed: it raises what it failed with
