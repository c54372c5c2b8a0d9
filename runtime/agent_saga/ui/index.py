"""The debugger's index of a log: built once, in one pass, in the background; pages after.

The index never holds the records. Per saga it keeps a summary (status, tools, tags, the
status changes with the record that made each); per record, the number of its saga (4
bytes) and, for a FileWAL file, its byte offset (8 bytes), so one saga or one page of the
log is read again with seeks, not a scan. Every record is read through the WAL readers
(``scan_file_records``, ``LogReader.records``) and the chain is checked while indexing with
the ``ChainVerifier`` that ``agent-saga verify`` uses.

A *position* is a record's ordinal in log order (for a file: its line number - 1, damaged
lines included). "As of position p" is the log cut after record p: a saga's status as of
p is the last change at or before p, so time travel over every saga costs no re-read.
"""

from __future__ import annotations

import itertools
import threading
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..chain import ChainVerifier, VerifyResult, verify_records
from ..errors import WALCorrupt
from ..history import IN_FLIGHT, SAGA_STATUS
from ..records import ExtensionType, Record, RecordType, is_known_type
from ..wal.file import scan_file_records
from ..wal.readers import FileLogReader, LogReader

QUARANTINED = "QUARANTINED"
_QUARANTINE, _LIFTED = ExtensionType.SAGA_QUARANTINED.value, ExtensionType.SAGA_QUARANTINE_LIFTED.value
_STARTED = RecordType.SAGA_STARTED.value
RESERVED_SAGA = "wal"  # the WAL's and the controls' own records (kill switch, breaker)
PAGE = 200  # records per page of the log
_MAX_TOOLS = 16


class SagaEntry:
    """What the index keeps about one saga: a summary, no record contents (about 0.4 KB)."""

    __slots__ = ("changes", "count", "first_pos", "last_pos", "last_ts", "name", "number", "saga_id",
                 "started_ts", "tags", "tools", "unknown")

    def __init__(self, number: int, saga_id: str, pos: int, ts: int) -> None:
        self.number = number  # its number in ``LogIndex.saga_of``
        self.saga_id = saga_id
        self.name: str | None = None
        self.tags: tuple[str, ...] = ()
        self.tools: tuple[str, ...] = ()
        self.started_ts = ts
        self.last_ts = ts
        self.first_pos = pos
        self.last_pos = pos
        self.count = 0
        self.changes: tuple[Any, ...] = ()  # (position, status from then on, ...) after IN_FLIGHT
        self.unknown = 0

    def status(self, asof: int | None = None) -> str | None:
        """The saga's status as of position ``asof`` (None: it had not started)."""
        if asof is not None and asof < self.first_pos:
            return None
        out = IN_FLIGHT
        for i in range(0, len(self.changes), 2):
            if asof is not None and self.changes[i] > asof:
                break
            out = self.changes[i + 1]
        return out

    def change_positions(self) -> list[int]:
        """The positions at which the saga's status changed (after it started)."""
        return list(self.changes[0::2])


@dataclass(frozen=True, slots=True)
class Damage:
    """A record the chain check stopped at: where, why, and the saga it claims (if readable)."""

    position: int
    location: str
    reason: str
    saga: str | None


class LogIndex:
    """An index of one log, filled by ``build`` (run it on a thread; the API reads meanwhile)."""

    def __init__(self, reader: LogReader) -> None:
        self.reader = reader
        self.description = reader.description
        self.is_file = isinstance(reader, FileLogReader)
        self.sagas: dict[str, SagaEntry] = {}
        self.order: list[SagaEntry] = []  # first-seen order; appended only (safe to snapshot)
        self.saga_of = array("i")  # per position: the number of its saga (-1: none, or the WAL's)
        self.offsets = array("q")  # per position: its byte offset (a file only)
        self.events = array("q")  # positions of the reserved saga's records (switch, breaker)
        self._shared: dict[Any, Any] = {}  # one copy of each tools/tags tuple and name
        self.count = 0
        self.done = False
        self.error: str | None = None
        self.chains: list[tuple[str, VerifyResult]] = []
        self.damage: Damage | None = None
        self.torn_tail = 0
        self.started = time.monotonic()
        self.seconds: float | None = None
        self._lock = threading.Lock()  # one reader of the file at a time per index

    # ------------------------------------------------------------------ building

    def build(self) -> None:
        """Read the whole log once; the index is usable (and growing) while this runs."""
        try:
            if self.is_file:
                self._build_file()
            else:
                self._build_shared()
            self.torn_tail = self.reader.torn_tail_bytes()
        except Exception as exc:  # noqa: BLE001 - on a thread: the page must say why it stopped
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.seconds = time.monotonic() - self.started
            self.done = True

    def _build_file(self) -> None:
        path = self.reader.description
        verifier = ChainVerifier()
        for offset, location, item in scan_file_records(path):
            pos = self.count
            failure = verifier.feed(location, item)
            if failure is not None and self.damage is None:
                self._damaged(pos, location, item, failure)
            self.offsets.append(offset)
            self._add(pos, item)
            self.count = pos + 1
        self.chains = [(path, verifier.result())]
        if self.damage is None and not self.chains[0][1].ok:  # a gap no attestation explained
            self._damaged(self.count - 1, "", None, self.chains[0][1])

    def _build_shared(self) -> None:
        for pos, rec in enumerate(self.reader.records()):
            self._add(pos, rec)
            self.count = pos + 1
        self.chains = [(name, verify_records(self.reader.chain(name))) for name in self.reader.chains()]
        bad = next((r for _, r in self.chains if not r.ok), None)
        if bad is not None:
            self.damage = Damage(-1, bad.location or "", bad.reason or "", None)

    def _damaged(self, pos: int, location: str, item: Record | WALCorrupt | None, failure: VerifyResult) -> None:
        where = failure.location or location
        if " line " in where:  # the failure may name an earlier gap no attestation explains
            pos = int(where.rsplit(" line ", 1)[1]) - 1
        saga = item.saga if isinstance(item, Record) and where == location else None
        self.damage = Damage(pos, where, failure.reason or "", saga)

    def _one(self, value: Any) -> Any:
        """The shared copy of ``value`` (a name, a tools or tags tuple): sagas repeat them."""
        return self._shared.setdefault(value, value)

    def _add(self, pos: int, rec: Record | WALCorrupt) -> None:
        if not isinstance(rec, Record) or rec.saga == RESERVED_SAGA:
            self.saga_of.append(-1)
            if isinstance(rec, Record):
                self.events.append(pos)
            return
        entry = self.sagas.get(rec.saga)
        if entry is None:
            entry = self.sagas[rec.saga] = SagaEntry(len(self.order), rec.saga, pos, rec.ts)
            self.order.append(entry)
        self.saga_of.append(entry.number)
        entry.count += 1
        entry.last_pos = pos
        entry.last_ts = rec.ts
        if not is_known_type(rec.type):
            entry.unknown += 1
        p = rec.payload if isinstance(rec.payload, dict) else {}
        if rec.type == _STARTED:
            name, tags = p.get("name"), p.get("tags")
            entry.name = self._one(name) if isinstance(name, str) else None
            entry.tags = self._one(tuple(str(t) for t in tags[:_MAX_TOOLS])) if isinstance(tags, list) else ()
        tool = p.get("tool")
        if isinstance(tool, str) and tool not in entry.tools and len(entry.tools) < _MAX_TOOLS:
            entry.tools = self._one((*entry.tools, tool))
        status = SAGA_STATUS.get(rec.type)
        current = entry.changes[-1] if entry.changes else IN_FLIGHT
        if status is None and rec.type == _QUARANTINE and current == IN_FLIGHT:
            status = QUARANTINED
        elif status is None and rec.type == _LIFTED and current == QUARANTINED:
            status = IN_FLIGHT
        if status is not None and status != current:
            entry.changes = (*entry.changes, pos, status)

    # ------------------------------------------------------------------ reading

    def records_upto(self, entry: SagaEntry, asof: int | None = None) -> int:
        """How many of the saga's records are at or before ``asof``."""
        if asof is None or asof >= entry.last_pos:
            return entry.count
        if asof < entry.first_pos:
            return 0
        return self.saga_of[entry.first_pos : asof + 1].count(entry.number)

    def positions(self, entry: SagaEntry, asof: int | None = None) -> list[int]:
        """The positions of the saga's records, up to ``asof`` (found at C speed)."""
        stop = entry.last_pos + 1 if asof is None else min(entry.last_pos, asof) + 1
        out: list[int] = []
        i = entry.first_pos
        find = self.saga_of.index
        while i < stop:
            try:
                i = find(entry.number, i, stop)
            except ValueError:
                break
            out.append(i)
            i += 1
        return out

    def saga_records(self, entry: SagaEntry, asof: int | None = None) -> list[tuple[int, Record]]:
        """``(position, record)`` of one saga, up to ``asof``, read again from the log."""
        wanted = self.positions(entry, asof)
        if self.is_file:
            return list(zip(wanted, self._read_at([self.offsets[p] for p in wanted], wanted), strict=True))
        keep = set(wanted)
        return [(p, r) for p, r in self.all_records() if p in keep]

    def page(self, number: int) -> list[tuple[int, Record | WALCorrupt]]:
        """Page ``number`` of the log: ``(position, record or damage)``, ``PAGE`` of them."""
        start = number * PAGE
        if number < 0 or start >= max(self.count, 1):
            return []
        if self.is_file:
            if start >= len(self.offsets):
                return []
            with self._lock:
                it = scan_file_records(self.reader.description, self.offsets[start], start + 1)
                return [(start + i, item) for i, (_o, _l, item) in enumerate(itertools.islice(it, PAGE))]
        return [(p, r) for p, r in itertools.islice(self.all_records(), start, start + PAGE)]

    def events_upto(self, asof: int | None, limit: int = 500) -> list[tuple[int, Record]]:
        """The kill switch's, the breaker's and the WAL's own records (the reserved saga)."""
        positions = set([p for p in self.events if asof is None or p <= asof][-limit:])
        out: list[tuple[int, Record]] = []
        for number in sorted({p // PAGE for p in positions}):
            out.extend((p, r) for p, r in self.page(number) if p in positions and isinstance(r, Record))
        return out

    def _read_at(self, offsets: list[int], positions: list[int]) -> Iterator[Record]:
        from ..records import decode_line

        path = self.reader.description
        with self._lock, open(path, "rb") as f:
            for off, pos in zip(offsets, positions, strict=True):
                f.seek(off)
                yield decode_line(f.readline(), f"{path} line {pos + 1}")

    def all_records(self) -> Iterator[tuple[int, Record]]:
        """Every record of the log in order, read again (raises ``WALCorrupt`` on damage)."""
        with self._lock:
            yield from enumerate(self.reader.records())

    def to_status(self) -> dict[str, Any]:
        """The index's progress and the chain's state."""
        chains = [
            {"writer": name, "ok": r.ok, "records": r.records, "head": r.head, "last_seq": r.last_seq,
             "first_bad_seq": r.first_bad_seq, "location": r.location, "reason": r.reason,
             "attested": r.attested}
            for name, r in self.chains
        ]
        d = self.damage
        return {
            "log": self.description,
            "records": self.count,
            "sagas": len(self.order),
            "events": len(self.events),
            "indexed": self.done,
            "index_seconds": self.seconds,
            "error": self.error,
            "chains": chains,
            "verified": bool(self.done and chains and all(c["ok"] for c in chains)),
            "damage": None if d is None else {"position": d.position, "location": d.location,
                                              "reason": d.reason, "saga": d.saga},
            "torn_tail_bytes": self.torn_tail,
            "page_size": PAGE,
        }
