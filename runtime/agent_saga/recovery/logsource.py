"""The read side every recovery log source shares: verified pages, whole re-reads, re-reads by place.

``LogSource`` fetches nothing itself: a subclass (``WALSource``, ``PathSource``) fetches
raw records in pages, and this class verifies them (``recovery.verified``) page by page,
reads the log whole again when it must, decrypts, and reads a claimed saga's records
again by their places (``reread``) where the log can. The invariants are in
``recovery.sources``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ..audit.encryption import PayloadEncryptor, decrypt_record
from ..chain import check_record
from ..errors import WALCorrupt
from ..records import Record
from ..wal.base import BaseWAL
from .errors import LocationUnavailable, RecoveryError, RecoveryHalted
from .scan import Place
from .verified import Item, Rescan, VerifiedReads

__all__ = ["LogRead", "LogSource", "WriterBusy"]

#: Records verified on the event loop itself rather than in a thread (~1 ms of hashing).
_INLINE_PAGE = 64

#: The sagas a read should read again as it ends: ``(saga id, places)`` each.
Wanted = Callable[[], Sequence[tuple[str, Sequence[Place]]]]
#: Records read again with a read's last request, by saga: the places read, what was there.
Fetched = dict[str, tuple[tuple[Place, ...], list[tuple[str, "Record | WALCorrupt | None"]]]]


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
    #: re-reads served by the records read with a read's confirmation (no request of their own)
    prefetched: int = 0

    def __init__(self) -> None:
        self._fetched: Fetched = {}  # saga id -> its records read ahead (a claimed saga: few)
        #: the log's quarantined writers as the last read found them: writer -> {by, reason, ts}
        self.quarantined: dict[str, dict[str, Any]] = {}

    def held_writers(self) -> dict[str, str]:
        """The writers whose sagas recovery does not act on, each with why: broken (a
        record of its chain failed verification or cannot be read) or quarantined by an
        operator (``agent-saga wal quarantine``)."""
        held = {w: f"BROKEN: {why}" for w, why in self._reads.broken.items()}
        for w, q in self.quarantined.items():
            held[w] = (f"QUARANTINED by {q.get('by') or '?'}: {q.get('reason') or 'no reason given'} "
                       f"(`agent-saga wal quarantine --lift` ends it)")
        return held

    @abc.abstractmethod
    def _fetch_pages(self, from_start: bool) -> AsyncIterator[list[Item]]:
        """Raw ``(location, record-or-WALCorrupt)`` pairs appended since the last fetch (all
        of them if ``from_start``), ``page_size`` at a time; the read position moves with
        each page handed out. May raise ``Rescan`` (the log must be read whole)."""

    async def _confirm(self, from_start: bool, places: list[tuple[str, int]]) -> list[Any] | None:
        """After the last page: what was read is what the log keeps (see the module doc).
        May raise ``Rescan`` or ``LocationUnavailable``. Where the log can, the records at
        ``places`` are read in the same request and returned (``records_at``'s items);
        ``None``: not read (the caller reads them again itself)."""
        return None

    @abc.abstractmethod
    def _rewind(self) -> None:
        """Forget the read position: the next ``_fetch`` starts at the log's beginning."""

    async def read_pages(self, wanted: Wanted | None = None) -> AsyncIterator[LogRead]:
        """Records appended since the last read, verified, in log order, one page at a
        time (see the module doc). A page with ``from_start`` (and no records) opens a
        read of the whole log: the caller drops what it knew and starts over from the
        pages after it. Nothing read may be acted on before the iteration ends: what
        only the whole read shows (a gap accounted for, the anchors met, the records
        kept by the replicas) is checked after the last page.

        ``wanted`` (where ``rereads``): the sagas whose records the caller will read again
        right after this read (its claimed ones), asked for as the last page is done: their
        places are read with the read's confirmation, in one request, and ``reread`` uses
        what was there if it asks for the same places (``prefetched`` counts those)."""
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
                    # A long page is verified off the loop (claims are renewed meanwhile); a
                    # short one, what a running daemon mostly reads, costs less than the hop.
                    records = (self._reads.page(items) if len(items) <= _INLINE_PAGE
                               else await asyncio.to_thread(self._reads.page, items))
                    page = [decrypt_record(r, self.encryptor) for r in records]
                    if from_start:
                        yield LogRead(page, False)
                    else:
                        held.extend(page)
                asked = list(wanted()) if wanted is not None and self.rereads else []
                flat = [(w, g) for _s, places in asked for w, g, _h in places]
                got = await self._confirm(from_start, flat)
                self._reads.end(whole=from_start, last_try=whole_reads >= 2)
                fetched: Fetched = {}
                if got is not None and asked:
                    i = 0
                    for saga_id, places in asked:
                        fetched[saga_id] = (tuple(places), got[i:i + len(places)])
                        i += len(places)
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
            self._fetched.update(fetched)  # only from a read that ended well
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
        early = self._fetched.pop(saga_id, None)
        if early is not None and early[0] == tuple(places):
            got = early[1]  # read with the confirmation of the read that served the claim
            self.prefetched += 1
        else:
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

    def forget(self, saga_id: str) -> None:
        """Drop what was read ahead for ``saga_id`` (its claim ended without using it)."""
        self._fetched.pop(saga_id, None)

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
