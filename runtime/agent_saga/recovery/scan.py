"""One pass over a log: which sagas are unresolved, whose lease has expired, which are frozen.

``LogScan.feed`` takes records in log order, once each; a daemon feeds it the whole log on
its first sweep and only what is new after that (``read_since`` a cursor), so a sweep never
re-reads the log per saga.

Invariants:
- Memory is proportional to the records of unresolved sagas: a saga's records are dropped
  as soon as its terminal record is read, and a record that arrives for a saga already
  resolved (a late lease renewal) is ignored. With ``refs=True`` (a log that can read a
  record again by its place: a RedisWAL) a view keeps of each record only where it is
  (writer, gseq) and the hash the verifier checked, packed in 44 bytes, never its payload: the
  daemon reads a claimed saga's few records again and checks them against those hashes
  before planning (``LogSource.reread``). Otherwise a view keeps what a plan, an
  escalation and a location read of each record, not its chain fields (digest, prev,
  hash, salt: the verifier checked them before the scan saw the record).
- The lease rule is ``agent_saga.leases``'s: the owner's last record + the lease length
  last declared. Records a daemon wrote (payload ``recovered_by``) are not signs of life.
- A lease record that cannot be read halts (``RecoveryHalted``): it is the one fact that
  says whether a live process would be touched.
- Records of a type this version does not know are counted (``unknown_types``), never
  dropped: the plan refuses a saga holding one, the report names them.
- A saga's records count only from the writer it belongs to and from service writers
  (``wal.writers``): another agent identity's record of it (a forged completion, a forged
  compensation) is ignored and counted in ``foreign``, which the report names. A saga two
  identity writers both started (one of them back-dated its entries) is ``contested``:
  recovery acts for neither, even if one of them resolved it first.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..chain import RESERVED_SAGA
from ..leases import DEFAULT_LEASE_SECONDS
from ..records import KNOWN_TYPES, TERMINAL_SAGA_TYPES, Record, RecordType
from ..wal.writers import ForeignRecords, is_identity_writer
from .errors import RecoveryHalted
from .recordtypes import RECOVERED_BY, SAGA_QUARANTINE_LIFTED, SAGA_QUARANTINED

__all__ = ["LogScan", "Place", "SagaView", "where"]

#: Where a verified record is, to be read again: (writer, gseq, its hash as bytes).
Place = tuple[str, int, bytes]
_PLACE = struct.Struct(">QI32s")  # gseq, writer number, hash: one record in a view's ``refs``

_LEASE = RecordType.SAGA_LEASE.value
_TYPE_NAMES = {t: t for t in KNOWN_TYPES}  # one string object per type, not one per record
_PARTIAL = RecordType.SAGA_ROLLBACK_PARTIAL.value
_STARTED = RecordType.SAGA_STARTED.value


def where(rec: Record) -> str:
    """A human location for a record: its writer (fleet logs) and sequence numbers."""
    w = rec.extra.get("writer")
    g = rec.extra.get("gseq")
    parts = [f"writer {w}"] if w else []
    parts.append(f"seq {rec.seq}")
    if g is not None:
        parts.append(f"gseq {g}")
    return f"record of saga {rec.saga} ({', '.join(parts)}, type {rec.type})"


@dataclass(slots=True)
class SagaView:
    """What the log holds about one unresolved saga."""

    saga_id: str
    records: list[Record] = field(default_factory=list)
    refs: bytes = b""  # with LogScan(refs=True), instead of records: their places (LogScan.places)
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    owner_last_ts: int = 0  # µs, the owner's last sign of life
    first_ts: int = 0
    quarantine: dict[str, Any] | None = None  # the SAGA_QUARANTINED payload while frozen
    #: the writer the saga belongs to (``wal.writers``): its first agent identity writer,
    #: else the writer of its first record; None in a file log (one writer)
    owner: str | None = None
    #: why recovery must not act on it: two agent identity writers both started it
    contested: str | None = None

    @property
    def lease_until(self) -> float:
        """Epoch seconds at which the owner's lease runs out."""
        return self.owner_last_ts / 1e6 + self.lease_seconds

    def lease_expired(self, now: float, grace: float) -> bool:
        """True once ``now`` (epoch seconds) is past the lease plus ``grace`` (clock skew)."""
        return now > self.lease_until + grace


class LogScan:
    """The running result of reading a log once, in order (see the module doc)."""

    def __init__(self, *, refs: bool = False) -> None:
        self.refs = refs
        self.writers: list[str] = []  # the writer ids the views' places are numbered by
        self._writer_number: dict[str, int] = {}
        self.in_flight: dict[str, SagaView] = {}
        self.resolved: dict[str, int] = {}  # saga -> ts (µs) of its terminal record
        #: saga -> the agent identity writer that owned it, of resolved sagas (to tell a
        #: later start by another writer: ``_contest_resolved``)
        self.resolved_by: dict[str, str] = {}
        #: SAGA_ROLLBACK_PARTIAL records written by a saga's own (in-process) rollback, not
        #: yet queued for a human, each with the saga's earlier records (whose compensation
        #: descriptors the escalations carry; with ``refs``, their places): the daemon
        #: drains this list into the queue.
        self.owner_partials: list[tuple[Record, list[Record] | bytes]] = []
        self.records_read = 0
        #: record types this version does not know: type -> (count, where the first is)
        self.unknown_types: dict[str, tuple[int, str]] = {}
        #: records of sagas their writer does not own, ignored (``wal.writers``)
        self.foreign = ForeignRecords()

    def feed_all(self, records: Iterable[Record]) -> None:
        """``feed`` every record of ``records``, in log order."""
        for rec in records:
            self.feed(rec)

    def feed(self, rec: Record) -> None:
        """Take one record, in log order."""
        self.records_read += 1
        if rec.type not in KNOWN_TYPES:
            n, first = self.unknown_types.get(rec.type, (0, where(rec)))
            self.unknown_types[rec.type] = (n + 1, first)
        saga_id = rec.saga
        if saga_id == RESERVED_SAGA:
            return
        if saga_id in self.resolved and (rec.type != _STARTED or not self._contest_resolved(rec)):
            return
        view = self.in_flight.get(saga_id)
        w = rec.extra.get("writer")
        if view is not None and w != view.owner and self._foreign(view, rec, w):
            return  # another agent's record of this saga: it says nothing about it
        if rec.type in TERMINAL_SAGA_TYPES:
            done = self.in_flight.pop(saga_id, None)
            self.resolved[saga_id] = rec.ts
            owner = w if done is None else done.owner
            if isinstance(owner, str) and is_identity_writer(owner):
                self.resolved_by[saga_id] = owner
            if rec.type == _PARTIAL and RECOVERED_BY not in (rec.payload or {}):
                earlier = [] if done is None else done.refs if self.refs else done.records
                self.owner_partials.append((rec, earlier))
            return
        if view is None:
            view = self.in_flight[saga_id] = SagaView(saga_id, first_ts=rec.ts, owner=w)
        payload = rec.payload or {}
        if self.refs:
            self._keep_ref(view, rec)
        else:
            # Verified already: the chain fields are not needed again; shared strings for the rest.
            rec.digest = rec.prev = rec.hash = ""
            rec.salt = None
            rec.type = _TYPE_NAMES.get(rec.type, rec.type)
            rec.saga = view.saga_id
            view.records.append(rec)
        if rec.type == SAGA_QUARANTINED:
            view.quarantine = dict(payload) or {"reason": "(redacted)"}  # small: kept either way
            return
        if rec.type == SAGA_QUARANTINE_LIFTED:
            view.quarantine = None
            return
        if RECOVERED_BY in payload:
            return  # a daemon's record: not a sign of the owner's life
        if rec.type == _LEASE:
            if rec.redacted:
                raise RecoveryHalted(
                    f"{where(rec)}: the lease record is redacted, so whether its owner is alive "
                    f"cannot be read; the sweep stopped without acting. Quarantine or resolve "
                    f"this saga by hand",
                    location=where(rec), saga_id=saga_id,
                )
            value = payload.get("lease_seconds")
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise RecoveryHalted(
                    f"{where(rec)}: lease_seconds={value!r} is not a positive number; the sweep "
                    f"stopped without acting (a lease it cannot read could hide a live owner)",
                    location=where(rec), saga_id=saga_id,
                )
            view.lease_seconds = float(value)
        if rec.ts > view.owner_last_ts:
            view.owner_last_ts = rec.ts

    def _foreign(self, view: SagaView, rec: Record, w: object) -> bool:
        """True if ``rec`` (written by ``w``, not the saga's owner) does not count: an
        agent identity writer's record of a saga another identity owns (``wal.writers``).
        A service writer's (recovery's) counts; the first identity writer to write a saga
        a service writer began owns it."""
        if not isinstance(w, str) or not is_identity_writer(w):
            return False
        if view.owner is None or not is_identity_writer(view.owner):
            view.owner = w
            return False
        self.foreign.add(w, rec.saga, view.owner, where(rec))
        if rec.type == _STARTED and view.contested is None:
            # An owner's first record is its SAGA_STARTED: another writer's start means one
            # of the two is forged (entry ids are the writers' own: either may be the
            # back-dated one). Recovery acts for neither; a human decides.
            view.contested = f"started by writer {view.owner} and by writer {w} ({where(rec)})"
        return True

    def _contest_resolved(self, rec: Record) -> bool:
        """A SAGA_STARTED of a saga already resolved: True (and the saga open again, held
        as contested) if another agent identity writer than the one that resolved it wrote
        it: the resolution may be the forgery (back-dated before the real start)."""
        w = rec.extra.get("writer")
        owner = self.resolved_by.get(rec.saga)
        if not isinstance(w, str) or not is_identity_writer(w) or owner is None or owner == w:
            return False
        del self.resolved[rec.saga]
        del self.resolved_by[rec.saga]
        self.foreign.add(owner, rec.saga, w, f"the records that resolved it, before {where(rec)}")
        view = self.in_flight[rec.saga] = SagaView(rec.saga, first_ts=rec.ts, owner=w)
        view.contested = f"resolved by writer {owner}'s records, then started by writer {w} ({where(rec)})"
        return True

    def places(self, refs: bytes) -> list[Place]:
        """The places packed in a view's ``refs``, in log order."""
        return [(self.writers[n], g, h) for g, n, h in _PLACE.iter_unpack(refs)]

    def _keep_ref(self, view: SagaView, rec: Record) -> None:
        w, g = rec.extra.get("writer"), rec.extra.get("gseq")
        if not isinstance(w, str) or not isinstance(g, int):
            raise RecoveryHalted(
                f"{where(rec)}: the record has no writer and gseq, so it cannot be read again "
                f"before recovery acts on it; the sweep stopped without acting",
                location=where(rec), saga_id=rec.saga,
            )
        n = self._writer_number.get(w)
        if n is None:
            n = self._writer_number[w] = len(self.writers)
            self.writers.append(w)
        view.refs += _PLACE.pack(g, n, bytes.fromhex(rec.hash))
