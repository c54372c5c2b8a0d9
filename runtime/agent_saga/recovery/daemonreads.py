"""How a recovery daemon reads its log: one shared, verified read at a time, into its scan.

``DaemonReads`` is the part of ``RecoveryDaemon`` that keeps the scan current: reads are
shared between the workers that wait for one (what a claimant needs is a read that began
after its claim), a whole re-read goes into a fresh scan that replaces the old one only
once it ended verified, and a claimed saga's records are read again where the scan kept
only their places. Anything not verified halts the daemon (``halted``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from ..errors import WALError
from .errors import RecoveryError, RecoveryHalted
from .scan import LogScan, Place, SagaView
from .sources import LogSource

__all__ = ["DaemonReads"]

log = logging.getLogger("agent_saga.recovery")


class DaemonReads:
    """The daemon's reading state (set up by ``RecoveryDaemon.__init__``)."""

    source: LogSource
    scan: LogScan
    halted: RecoveryHalted | None
    _read_lock: asyncio.Lock
    _reads_started: int
    _reads_done: int
    _unknown_seen: set[str]
    _want: set[str]  # claimed sagas whose records the next read reads again as it ends

    def _halt(self, exc: RecoveryHalted) -> None:
        if self.halted is None:
            self.halted = exc
            log.critical(
                "recovery of %s HALTED (fail-closed, nothing more is acted on until a human "
                "repairs the log and restarts the daemon): %s", self.source.description, exc.message,
            )

    async def _refresh(self, claimed: str | None = None) -> None:
        """Read what is new (verified: see ``recovery.verified``) into the scan. Raises
        ``RecoveryHalted`` for anything not verified or not readable as a record,
        ``LocationUnavailable`` if the log cannot be opened now.

        Reads are shared: a caller waiting while another read runs is served by the next
        read that starts after it asked, so the workers that claimed meanwhile pay one
        read of the log between them, not one each (what a claimant needs is a read that
        began after its claim).

        ``claimed``: a saga this caller holds the claim on and will read again right
        after (``_records_of``): the read that serves the call reads its records again
        with its own last request (``LogSource.read_pages(wanted=...)``)."""
        if claimed is not None:
            self._want.add(claimed)  # before the ticket: the read that serves this call sees it
        ticket = self._reads_started
        async with self._read_lock:
            if self._reads_done > ticket:
                return  # a read that began after this call asked has completed
            self._reads_started += 1
            number = self._reads_started
            await self._read_new()
            self._reads_done = number

    async def _read_new(self) -> None:
        """One read of what is new into the scan (under ``_read_lock``), page by page: the
        read holds one page of records at a time. A read of the whole log goes into a new
        scan, which replaces this one once the read has ended (verified whole)."""
        target = self.scan
        fresh: LogScan | None = None
        known = set(self.scan.unknown_types)
        want, self._want = self._want, set()

        def wanted() -> list[tuple[str, list[Place]]]:
            # Asked as the read's last page is done: the places the scan it fills knows.
            views = (target.in_flight.get(s) for s in want)
            return [(v.saga_id, target.places(v.refs)) for v in views if v is not None and v.refs]

        try:
            async for read in (self.source.read_pages(wanted) if want else self.source.read_pages()):
                if read.from_start:
                    fresh = target = LogScan(refs=self.source.rereads)
                    fresh.records_read = self.scan.records_read
                target.feed_all(read.records)
        except RecoveryError:
            raise
        except WALError as exc:
            # Unparseable, undecryptable or unreadable: never skipped.
            where = getattr(exc, "location", "") or self.source.description
            raise RecoveryHalted(
                f"{self.source.description}: the log cannot be read ({exc.message}); the sweep "
                f"stopped before acting on any saga",
                location=where,
            ) from exc
        if fresh is not None:
            if self.scan.records_read:
                # Records left the log since the last read (a compaction): start over from
                # the whole log, so no saga is judged on half of its records.
                log.info("%s: records left the log since the last read; read it whole again", self.source.description)
            self.scan = fresh
        for t in self.scan.unknown_types.keys() - known - self._unknown_seen:
            self._unknown_seen.add(t)
            log.warning(
                "%s holds records of type %s, which this version of agent-saga does not know; "
                "recovery will not act on a saga holding one (upgrade agent-saga): first at %s",
                self.source.description, t, self.scan.unknown_types[t][1],
            )

    async def _records_of(self, view: SagaView) -> SagaView:
        """``view`` with its records, read again and checked against what the scan
        verified where the scan kept only their places (``LogSource.reread``)."""
        if not view.refs:
            return view
        records = await self.source.reread(view.saga_id, self.scan.places(view.refs))
        return replace(view, records=records, refs=b"")
