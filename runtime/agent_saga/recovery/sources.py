"""Where a daemon reads a log and writes its resolution records.

    PathSource(path)   a FileWAL file another process wrote. Read without a lock, page by
                       page from the last offset; written by opening it as a FileWAL once
                       its ``flock`` is free (a lease AND a free flock = the owner is gone)
    WALSource(wal)     any open ``BaseWAL`` (RedisWAL, PostgresWAL, or this process's own
                       FileWAL): read with ``read_since(cursor)``, written with ``append``

Either way the daemon's records continue the log's hash chain (FileWAL: the same chain the
dead process wrote; a fleet log: the daemon's own writer chain), so ``agent-saga inspect``
and ``certify`` see the saga resolved.

Invariants:
- ``read_pages`` hands out each record once, in log order, ``page_size`` at a time,
  verified (``recovery.verified``: digest, chain, sequence, attestations) and then
  decrypted: a read holds one page of decoded records, never the whole log. A record that
  fails, a line that cannot be decoded, or an encrypted payload with no key for it raises
  (the daemon halts: it never acts on what it has not verified, nor on an envelope). A
  torn final fragment is not a record and does not stop the read. What only the whole
  read shows (below) is checked after its last page; nothing read is acted on before.
- When records left the log since the last read (a compaction), ``read_pages`` reads the
  whole log again and says so (a ``LogRead.from_start`` page): the caller starts over
  from it. A whole read that was interrupted is read whole again the next time.
- ``reread`` (where ``rereads``: a RedisWAL) reads a claimed saga's records again by
  their places and checks each is the record verified there (digest, header, and the
  hash the chain verification saw): a changed one halts; a missing one is not acted on,
  and the next read is a whole one (where an unexplained gap halts).
- A fleet log that can confirm a read (``RedisWAL.confirm_read``) is asked to after every
  read, before anything read is handed on: with ``wait_replicas`` the records read must
  be on the replicas (else ``LocationUnavailable``: not acted on, read again next time),
  and the newest record read must still be there (else records were lost from the end,
  a failover or a restore: the log is read again whole, and the anchors halt).
- ``PathSource`` holds the file's writer lock only while resolutions are in hand and for
  at most ``writer_wait`` seconds of waiting: a live owner is never displaced, and a
  restarted owner waits at most one resolution for the lock.
- A log file that cannot be opened, and a log that cannot be written, raise
  ``LocationUnavailable`` naming the path (not a halt: the next sweep tries again).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import fcntl
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ..audit.encryption import EncryptedWAL, PayloadEncryptor, decrypt_record
from ..chain import check_record
from ..errors import ConfigurationError, WALCorrupt, WALStalled
from ..records import Record, decode_line
from ..wal.base import BaseWAL
from .batch import TurnBatch
from .errors import LocationUnavailable, RecoveryError, RecoveryHalted, location_error
from .scan import Place
from .verified import Item, Rescan, VerifiedReads

__all__ = ["LogRead", "LogSource", "PathSource", "WALSource", "WriterBusy"]

_READ_ONLY_LOG_FIX = (
    "Recovery writes its resolution records into the log itself (they continue its hash "
    "chain), so the log must be writable where recovery runs; a read-only copy can only be "
    "planned over (--dry-run), inspected and verified"
)


class WriterBusy(RecoveryError):
    """The log's writer lock is held by another live process (its owner or another daemon)."""


@dataclass(frozen=True, slots=True)
class LogRead:
    """One ``read_new``: verified records in log order, payloads in plaintext.

    ``from_start``: the whole log was read (the first read, or a re-read after records
    left the log): the caller drops what it knew and starts over from these records.
    """

    records: list[Record]
    from_start: bool


class LogSource(abc.ABC):
    """A log a daemon reads and resolves sagas in (see the module doc).

    A subclass fetches raw records in pages (``_fetch_pages``); this class verifies them
    (``VerifiedReads``) page by page, re-reads the log whole when it must, and decrypts.
    """

    description: str
    #: True if several processes write this log (a RedisWAL/PostgresWAL fleet log).
    fleet: bool = False
    #: True if one record can be read again by its place (``reread``): the daemon then
    #: keeps only places and hashes of what it scanned (``LogScan(refs=True)``).
    rereads: bool = False
    #: records verified and handed on at a time: what a read holds at its peak.
    page_size: int = 1000
    encryptor: PayloadEncryptor | None = None
    _reads: VerifiedReads
    _whole_pending: bool = False  # a whole read began and did not end: the next is whole too
    _gone: bool = False  # a record read before was not found again: the next read is whole

    @abc.abstractmethod
    def _fetch_pages(self, from_start: bool) -> AsyncIterator[list[Item]]:
        """Raw ``(location, record-or-WALCorrupt)`` pairs appended since the last fetch (all
        of them if ``from_start``), ``page_size`` at a time; the read position moves with
        each page handed out. May raise ``Rescan`` (the log must be read whole)."""

    async def _confirm(self, from_start: bool) -> None:
        """After the last page: what was read is what the log keeps (see the module doc).
        May raise ``Rescan`` or ``LocationUnavailable``."""
        return None

    @abc.abstractmethod
    def _rewind(self) -> None:
        """Forget the read position: the next ``_fetch`` starts at the log's beginning."""

    async def read_pages(self) -> AsyncIterator[LogRead]:
        """Records appended since the last read, verified, in log order, one page at a
        time (see the module doc). A page with ``from_start`` (and no records) opens a
        read of the whole log: the caller drops what it knew and starts over from the
        pages after it. Nothing read may be acted on before the iteration ends: what
        only the whole read shows (a gap accounted for, the anchors met, the records
        kept by the replicas) is checked after the last page."""
        from_start = not self._reads.started or self._whole_pending or self._gone
        self._gone = False
        if from_start:
            self._rewind()
            if self._reads.started:  # an interrupted whole read: read it whole again
                self._reads.restart()
        whole_reads = 0
        while True:
            whole_reads += from_start
            self._whole_pending = from_start
            # A read that continues the last one is handed on only once it ended well: if
            # it fails, the next read starts where this one did (nothing of it was used).
            mark = None if from_start else (self._reads.mark(), self._position())
            held: list[Record] = []
            try:
                if from_start:
                    yield LogRead([], True)
                async for items in self._fetch_pages(from_start):
                    records = await asyncio.to_thread(self._reads.page, items)
                    page = [decrypt_record(r, self.encryptor) for r in records]
                    if from_start:
                        yield LogRead(page, False)
                    else:
                        held.extend(page)
                await self._confirm(from_start)
                self._reads.end(whole=from_start, last_try=whole_reads >= 2)
            except Rescan:
                self._rewind()
                self._reads.restart()
                from_start = True
                continue
            except BaseException:
                if mark is not None:
                    self._reads.reset(mark[0])
                    self._set_position(mark[1])
                raise
            self._whole_pending = False
            if held:
                yield LogRead(held, False)
            return

    @abc.abstractmethod
    def _position(self) -> Any:
        """Where the next fetch starts (to go back to it)."""

    @abc.abstractmethod
    def _set_position(self, position: Any) -> None:
        """Go back to ``_position()``."""

    async def read_new(self) -> LogRead:
        """``read_pages`` collected into one ``LogRead`` (what tools and tests read)."""
        records: list[Record] = []
        from_start = False
        async for page in self.read_pages():
            if page.from_start:
                records, from_start = [], True
            records.extend(page.records)
        return LogRead(records, from_start)

    async def reread(self, saga_id: str, places: Sequence[Place]) -> list[Record]:
        """The records at ``places`` (``LogScan(refs=True)``), read again and checked: each
        must be the very record the scan verified (its digest, its header and the hash the
        verifier checked), then decrypted. A record changed since raises
        ``RecoveryHalted``; one gone (compacted away since) ``LocationUnavailable``."""
        if not places:
            return []
        got = await self._read_places([(w, g) for w, g, _ in places])
        out: list[Record] = []
        for (_w, _g, verified), (location, item) in zip(places, got, strict=True):
            if item is None:
                self._gone = True  # compacted, or deleted: a whole read tells which
                raise LocationUnavailable(
                    f"{location}: a record of saga {saga_id} is gone since recovery read it (the "
                    f"log was compacted meanwhile); nothing was acted on, the next sweep reads the "
                    f"log again", path=self.description)
            if isinstance(item, WALCorrupt):
                self._changed(location, saga_id, item.message)
            reason = check_record(item, item.prev, None)
            if reason is None and (item.saga != saga_id or bytes.fromhex(item.hash) != verified):
                reason = "it is not the record recovery verified there (its hash differs)"
            if reason is not None:
                self._changed(location, saga_id, reason)
            out.append(decrypt_record(item, self.encryptor))
        return out

    async def _read_places(self, places: list[tuple[str, int]]) -> list[tuple[str, Record | WALCorrupt | None]]:
        raise NotImplementedError  # only where ``rereads``

    def _changed(self, location: str, saga_id: str, reason: str) -> NoReturn:
        raise RecoveryHalted(
            f"{location}: a record of saga {saga_id} changed after recovery verified it ({reason}). "
            f"Recovery acts only on records it has verified, so it stopped without acting on any "
            f"saga of {self.description}; run `agent-saga verify` on the log and find out who "
            f"rewrote it before restarting recovery",
            location=location, saga_id=saga_id,
        )

    @abc.abstractmethod
    def writer(self) -> contextlib.AbstractAsyncContextManager[BaseWAL]:
        """The WAL to append resolution records to, for the duration of the block.
        Raises ``WriterBusy`` if it cannot be had."""

    async def close(self) -> None:
        """Release the log."""
        return None


class WALSource(LogSource):
    """An open ``BaseWAL``; the daemon appends to it directly. Not closed by the daemon.

    Records are read from the backend as stored (for an ``EncryptedWAL``, from the WAL it
    wraps), verified, then decrypted with the ``EncryptedWAL``'s key; an encrypted payload
    in a WAL not wrapped so halts the daemon (``WALKeyMissing``).
    """

    def __init__(self, wal: BaseWAL, reopen: Callable[[], BaseWAL] | None = None) -> None:
        from ..wal.file import FileWAL

        self._reopen = reopen
        self._reopening = threading.Lock()
        self._use(wal)
        inner = self._raw
        self.fleet = not isinstance(inner, FileWAL)
        name = getattr(inner, "path", None) or getattr(inner, "name", None) or type(inner).__name__
        self.description = str(name)
        self._reads = VerifiedReads(self.description)
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
                with contextlib.suppress(Exception):
                    old.close()  # failed: it raises what it failed with
            return self.wal

    def _unreachable(self, exc: BaseException) -> LocationUnavailable:
        scrub = getattr(self._raw, "_scrub", str)
        return LocationUnavailable(
            f"{self.description}: the log cannot be read now ({scrub(f'{type(exc).__name__}: {exc}')}); "
            f"nothing was acted on, the next read tries again", path=self.description)

    async def _fetch_pages(self, from_start: bool) -> AsyncIterator[list[Item]]:
        # A server that cannot be reached (a Redis failover, a restart) is not a log that
        # cannot be trusted: this read stops, nothing is acted on, the next one retries.
        unreachable: tuple[type[BaseException], ...] = getattr(self._raw, "_redis_errors", ())
        if from_start:
            self._last = None
        out: list[Item] = []
        records = self._raw.read_since(self._cursor, page_size=self.page_size)
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

    async def _confirm(self, from_start: bool) -> None:
        # Only what the log will keep is acted on (RedisWAL: confirmed on the replicas
        # with WAIT), and a newest record read that is gone means records were lost
        # from the end (a failover, a restore): read it again whole, never past them.
        confirm: Callable[[tuple[str, int] | None], bool] | None = getattr(self._raw, "confirm_read", None)
        if confirm is None:
            return
        unreachable: tuple[type[BaseException], ...] = getattr(self._raw, "_redis_errors", ())
        try:
            kept = await asyncio.to_thread(confirm, self._last)
        except unreachable as exc:
            raise self._unreachable(exc) from exc
        except WALStalled as exc:
            raise LocationUnavailable(
                f"{exc.message}; nothing was acted on, the next read tries again", path=self.description) from exc
        if not kept:
            if from_start:
                raise LocationUnavailable(
                    f"{self.description}: records read were gone by the end of the read (a failover "
                    f"or restore); nothing was acted on, the next read tries again", path=self.description)
            raise Rescan(self.description)

    async def _read_places(self, places: list[tuple[str, int]]) -> list[tuple[str, Record | WALCorrupt | None]]:
        # The re-reads of the sagas claimed in one event-loop turn share one round trip.
        result: list[tuple[str, Record | WALCorrupt | None]] = await self._rereads.submit(places)
        return result

    async def _read_places_many(self, batch: list[list[tuple[str, int]]]) -> list[Any]:
        unreachable: tuple[type[BaseException], ...] = getattr(self._raw, "_redis_errors", ())
        flat = [p for places in batch for p in places]
        try:
            got = await asyncio.to_thread(self._raw._log.records_at, flat)  # type: ignore[attr-defined]
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


class PathSource(LogSource):
    """A FileWAL file written by another process (see the module doc).

    Args:
        path: the log file.
        writer_wait: how long to wait for the file's writer lock before giving up on a
            resolution (``WriterBusy``), in seconds.
        encryptor: the key(s) of an encrypted log (``agent_saga.audit.encryption``):
            records are decrypted as they are read and the daemon's own records encrypted.
            Without one, the first encrypted record halts the daemon (``WALKeyMissing``).
        wal_options: keyword arguments for the ``FileWAL`` the daemon opens to write.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        writer_wait: float = 2.0,
        encryptor: PayloadEncryptor | None = None,
        **wal_options: Any,
    ) -> None:
        self.path = os.fspath(path)
        self.encryptor = encryptor
        self.description = self.path
        self.writer_wait = writer_wait
        self._wal_options = wal_options
        self._reads = VerifiedReads(self.path)
        self._offset = 0
        self._line = 0
        self._ino: int | None = None
        self._open_lock = asyncio.Lock()
        self._wal: BaseWAL | None = None
        self._refs = 0

    def _open_log(self) -> Any:
        try:
            return open(self.path, "rb")
        except FileNotFoundError as exc:
            if self._reads.started or self._offset:
                raise RecoveryHalted(
                    f"WAL file {self.path!r} is gone (deleted or moved) after recovery read it; "
                    f"recovery stopped without acting. Find out what happened to the log",
                    location=self.path,
                ) from exc
            raise location_error(
                exc, self.path, "the log", "Check the path (the log appears with the agent's first saga)", verb="read"
            ) from exc
        except OSError as exc:
            raise location_error(exc, self.path, "the log", "Make the file readable by this process", verb="read") from exc

    def _open_at(self, from_start: bool) -> Any:
        f = self._open_log()
        try:
            st = os.fstat(f.fileno())
            if not from_start and self._ino is not None and (st.st_ino != self._ino or st.st_size < self._offset):
                raise Rescan(self.path)  # compaction swapped the file in (or it was cut): read it all
            self._ino = st.st_ino
            f.seek(self._offset)
        except BaseException:
            f.close()
            raise
        return f

    def _next_page(self, f: Any) -> list[Item]:
        """Up to ``page_size`` lines from ``f``; the read position moves past them."""
        out: list[Item] = []
        offset, number = self._offset, self._line
        for line in f:
            if not line.endswith(b"\n"):
                break  # a torn final fragment: never acknowledged, not a record
            number += 1
            offset += len(line)
            location = f"{self.path} line {number}"
            if not line.strip():
                out.append((location, WALCorrupt(f"{location}: empty line inside the log", location=location)))
            else:
                try:
                    out.append((location, decode_line(line, location)))
                except WALCorrupt as exc:
                    out.append((location, exc))
            if len(out) >= self.page_size:
                break
        self._offset, self._line = offset, number
        return out

    async def _fetch_pages(self, from_start: bool) -> AsyncIterator[list[Item]]:
        f = await asyncio.to_thread(self._open_at, from_start)
        try:
            while True:
                page = await asyncio.to_thread(self._next_page, f)
                if not page:
                    return
                yield page
        finally:
            f.close()

    def _rewind(self) -> None:
        self._offset, self._line, self._ino = 0, 0, None

    def _position(self) -> Any:
        return self._offset, self._line, self._ino

    def _set_position(self, position: Any) -> None:
        self._offset, self._line, self._ino = position

    def _lock_free(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # releases our probe lock, if taken
        return True

    def _open_wal(self) -> BaseWAL:
        from ..wal.file import FileWAL

        try:
            wal = FileWAL(self.path, **self._wal_options)
        except OSError as exc:
            raise location_error(exc, self.path, "the log", _READ_ONLY_LOG_FIX) from exc
        return wal if self.encryptor is None else EncryptedWAL(wal, self.encryptor)

    async def _acquire(self) -> BaseWAL:
        async with self._open_lock:
            if self._wal is None:
                deadline = time.monotonic() + self.writer_wait
                while True:
                    if self._lock_free():
                        try:
                            self._wal = await asyncio.to_thread(self._open_wal)
                            break
                        except ConfigurationError:
                            pass  # taken between the probe and the open
                    if time.monotonic() >= deadline:
                        raise WriterBusy(
                            f"WAL {self.path!r} is held by another live process (its owner, or "
                            f"another daemon) for more than {self.writer_wait}s; its sagas are "
                            f"left for a later sweep. A live owner is never displaced: run "
                            f"RecoveryDaemon(wal=...) inside that process to recover its "
                            f"earlier incarnation's sagas"
                        )
                    await asyncio.sleep(0.01)
            self._refs += 1
            return self._wal

    async def _release(self) -> None:
        async with self._open_lock:
            self._refs -= 1
            if self._refs == 0 and self._wal is not None:
                wal, self._wal = self._wal, None
                await asyncio.to_thread(wal.close)

    @contextlib.asynccontextmanager
    async def writer(self) -> AsyncIterator[BaseWAL]:
        """This daemon's writer on the fleet log."""
        wal = await self._acquire()
        try:
            yield wal
        finally:
            await self._release()

    async def close(self) -> None:
        """Close the writer and the reader."""
        async with self._open_lock:
            if self._wal is not None:
                wal, self._wal, self._refs = self._wal, None, 0
                await asyncio.to_thread(wal.close)


def keep_set(resolved: dict[str, int], now: float, grace_seconds: float, extra: Collection[str]) -> set[str]:
    """Resolved sagas to keep through a compaction: terminal within ``grace_seconds`` of
    ``now`` (epoch seconds), plus ``extra`` (e.g. sagas with open escalations)."""
    cutoff_us = (now - grace_seconds) * 1e6
    keep = {s for s, ts in resolved.items() if ts >= cutoff_us}
    keep.update(s for s in extra if s in resolved)
    return keep
