"""Compaction, shared by every backend: what leaves, and the attestation that says so.

``compact()`` keeps the records of every saga that is not resolved and drops the rest,
then appends one chained ``COMPACTION`` record (saga ``wal``) naming exactly which
sequences left and the digest of what they were (the format is in ``agent_saga.chain``).

Invariants:
- A saga is resolved when a terminal record (completed, rolled back, rollback partial)
  exists for it anywhere in the log the backend can see (every writer of a fleet log:
  a recovery daemon may have settled a saga another process started).
- An unresolved saga is never removed, whatever ``keep_sagas`` says: a compaction that
  dropped the intent of a charge that may have happened would erase the only evidence.
  ``keep_sagas`` names resolved sagas to keep as well (a grace period, an open audit).
- Records of the reserved saga ``wal`` (attestations, torn-tail notes) are never removed,
  so a gap once explained stays explained.
- The rewrite and the attestation land atomically (per backend: ``os.replace``, one Lua
  script, one transaction), serialised with the writer's flusher: a record appended
  while a compaction runs is written after the attestation, never lost.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from ..chain import ATTESTATION_TYPE, RESERVED_SAGA
from ..errors import WALError
from ..records import TERMINAL_SAGA_TYPES, ExtensionType, Record

COMPACTION_FAILED = ExtensionType.COMPACTION_FAILED.value


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """What one ``compact()`` did.

    ``removed`` records of ``sagas_removed`` sagas left the log in the sequence ``runs``;
    ``kept`` records stayed; the attestation is the record ``attestation_seq`` and
    ``digest`` is the SHA-256 it carries over the removed records' hashes.
    """

    removed: int
    kept: int
    sagas_removed: int
    attestation_seq: int
    runs: tuple[tuple[int, int], ...]
    digest: str


def resolved_sagas(records: Iterable[Record]) -> set[str]:
    """The sagas with a terminal record among ``records`` (any order, any writer)."""
    return {r.saga for r in records if r.type in TERMINAL_SAGA_TYPES}


class CompactionPlan:
    """Decide, record by record in log order, what stays; build the attestation.

    Feed every record of one writer's chain (older than the attestation) to ``offer``;
    it returns True for a record to keep.
    """

    def __init__(self, resolved: Collection[str], keep_sagas: Collection[str] | None) -> None:
        self._resolved = frozenset(resolved)
        self._keep = frozenset(keep_sagas or ())
        self._runs: list[list[Any]] = []  # [first, last, last_hash]
        self._digest = hashlib.sha256()
        self._sagas: set[str] = set()
        self.removed = 0
        self.kept = 0

    def removes_nothing(self) -> bool:
        """True if no saga can leave (every resolved saga is kept or reserved)."""
        return not (self._resolved - self._keep - {RESERVED_SAGA})

    def offer(self, rec: Record) -> bool:
        """Keep ``rec``? False: it belongs to a resolved saga that may go."""
        if (
            rec.saga == RESERVED_SAGA
            or rec.saga not in self._resolved
            or rec.saga in self._keep
        ):
            self.kept += 1
            return True
        self.removed += 1
        self._sagas.add(rec.saga)
        self._digest.update(rec.hash.encode("ascii") + b"\n")
        runs = self._runs
        if runs and runs[-1][1] == rec.seq - 1:
            runs[-1][1] = rec.seq
            runs[-1][2] = rec.hash
        else:
            runs.append([rec.seq, rec.seq, rec.hash])
        return False

    @property
    def digest(self) -> str:
        """The digest of the removed records (the attestation carries it)."""
        return self._digest.hexdigest()

    def payload(self) -> dict[str, Any]:
        """The attestation's payload."""
        return {
            "removed": [list(r) for r in self._runs],
            "count": self.removed,
            "digest": self.digest,
            "kept": self.kept,
            "sagas": len(self._sagas),
        }

    def attestation(self, seq: int) -> Record:
        """The (unsealed) attestation record for sequence ``seq``."""
        return Record(ATTESTATION_TYPE, RESERVED_SAGA, None, self.payload(), seq, _now_us())

    def report(self, seq: int) -> CompactionReport:
        """What the compaction did, as the report of ``seq``."""
        return CompactionReport(
            removed=self.removed,
            kept=self.kept,
            sagas_removed=len(self._sagas),
            attestation_seq=seq,
            runs=tuple((r[0], r[1]) for r in self._runs),
            digest=self.digest,
        )


class CompactionAborted(WALError):
    """A compaction failed before changing anything; the log is as it was.

    The writer then records a ``COMPACTION_FAILED`` record under the sequence it had
    reserved for the attestation (no gap in the chain) and keeps running.
    """


class CompactionRequest:
    """A compaction queued in a writer's pending list, under the sequence it reserved."""

    __slots__ = ("seq", "keep_sagas", "future")

    def __init__(self, seq: int, keep_sagas: Collection[str] | None) -> None:
        self.seq = seq
        self.keep_sagas = None if keep_sagas is None else frozenset(keep_sagas)
        self.future: concurrent.futures.Future[CompactionReport] = concurrent.futures.Future()

    def failed_record(self, reason: str) -> Record:
        """What the log says when this compaction aborted: no gap, and the reason."""
        return Record(COMPACTION_FAILED, RESERVED_SAGA, None, {"error": reason}, self.seq, _now_us())


def _now_us() -> int:
    return time.time_ns() // 1000
