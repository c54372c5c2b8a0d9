"""The recovery ledger: the daemon's journal of what it ran, and the human escalation queue.

Recovery decides "is this compensation already done?" from two sources, read together:
the crashed process's own WAL (a COMPENSATION_DONE there is final) and this journal,
which a daemon writes *before* its WAL record: a daemon killed between the two leaves the
journal saying "done", so the next daemon skips the call instead of repeating it. The key
of an entry is the recovery token ``idempotency_key(saga_id, step_id, "compensate")``,
the same key the engine passes to the handler, so an engine/daemon overlap is absorbed by
the handler's own idempotency as well.

    FileLedger(path)     one JSON line per entry, fsync'ed, flock'ed: one host
    RedisLedger(url)     HASH/SET indexes in Redis: a fleet (``agent_saga.recovery.redis``)

A node-local ledger behind a shared WAL lets two daemons on different hosts miss each
other's successes; ``RecoveryDaemon`` warns when it sees that combination.

Journal lines (schema ``v`` = 1)::

    {"v":1,"kind":"attempt"|"done"|"failed"|"saga","token":T,"saga":S,"step":P,"daemon":D,"ts":E,...}
    {"v":1,"kind":"escalated", ...Escalation fields...}
    {"v":1,"kind":"escalation_resolved","id":I,"by":B,"note":N,"ts":E}

Invariants:
- An entry is durable (fsync) before ``record`` / ``escalate`` returns.
- "Already compensated?" is a set lookup, never a scan of history; compaction of the WAL
  never touches this index (losing it would re-open the double-compensation window).
- A journal that cannot be written or opened (a read-only mount, a full disk) raises
  ``LocationUnavailable`` naming the file; its directory is created on the first write.
- Fail-closed: a complete line that cannot be read raises ``LedgerCorrupt``; an
  unterminated final fragment (a writer killed mid-append, never acknowledged) is moved
  to a ``.torn-<ns>`` sidecar by the next writer and never read as an entry.
- Escalation ids are deterministic per (saga, step): recording one twice is a no-op.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import json
import os
import threading
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..idempotency import idempotency_key
from .errors import LedgerCorrupt, location_error

__all__ = [
    "Escalation",
    "FileLedger",
    "LedgerEntry",
    "LedgerKind",
    "RecoveryLedger",
    "escalation_id",
]

SCHEMA = 1

_FIX = (
    "Give recovery a writable journal: FileLedger(path) / --ledger FILE on a writable "
    "disk, or a ledger shared through Redis (RedisLedger / --redis-url)"
)


class LedgerKind(enum.StrEnum):
    """What a journal entry says about a recovery token."""

    ATTEMPT = "attempt"  # the handler is about to be called
    DONE = "done"  # the handler returned: the token is complete
    FAILED = "failed"  # the handler raised
    SAGA = "saga"  # the saga's terminal record is written (token = saga id)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One journal entry. ``detail`` is free JSON (handler, outcome, error)."""

    kind: LedgerKind
    token: str
    saga_id: str
    step_id: str | None
    daemon: str
    ts: float = field(default_factory=time.time)
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": SCHEMA, "kind": self.kind.value, "token": self.token, "saga": self.saga_id,
            "step": self.step_id, "daemon": self.daemon, "ts": self.ts, **self.detail,
        }


def escalation_id(saga_id: str, step_id: str | None) -> str:
    """The deterministic id of the escalation of ``step_id`` (or of the saga as a whole)."""
    return "esc-" + idempotency_key(saga_id, step_id or "-", "escalate")[:20]


@dataclass(frozen=True, slots=True)
class Escalation:
    """A step handed to a human: what, why, and (once a human acted) who closed it."""

    id: str
    saga_id: str
    step_id: str | None
    tool: str
    semantics: str
    kind: str
    reason: str
    outcome_unknown: bool
    source: str  # the log it came from (never with a password)
    daemon: str
    ts: float
    compensation: dict[str, Any] | None = None
    resolved_by: str | None = None
    resolved_ts: float | None = None
    note: str = ""

    @property
    def open(self) -> bool:
        return self.resolved_by is None

    def to_json(self) -> dict[str, Any]:
        return {"v": SCHEMA, "kind": "escalated", **{k: v for k, v in asdict(self).items() if k != "kind"}, "escalation_kind": self.kind}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Escalation:
        return cls(
            id=str(d["id"]), saga_id=str(d["saga_id"]), step_id=d.get("step_id"),
            tool=str(d.get("tool", "?")), semantics=str(d.get("semantics", "?")),
            kind=str(d.get("escalation_kind", "?")), reason=str(d.get("reason", "")),
            outcome_unknown=bool(d.get("outcome_unknown", False)), source=str(d.get("source", "")),
            daemon=str(d.get("daemon", "")), ts=float(d.get("ts", 0.0)),
            compensation=d.get("compensation"), resolved_by=d.get("resolved_by"),
            resolved_ts=d.get("resolved_ts"), note=str(d.get("note", "")),
        )

    def resolved(self, by: str, note: str, ts: float) -> Escalation:
        return Escalation(**{**asdict(self), "resolved_by": by, "resolved_ts": ts, "note": note})


@runtime_checkable
class RecoveryLedger(Protocol):
    """Where recovery journals what it ran and queues what it escalated."""

    description: str
    #: True if daemons on other hosts see this ledger (a fleet needs it).
    shared: bool

    async def completed(self, tokens: Collection[str]) -> set[str]:
        """The subset of ``tokens`` journaled as done."""
        ...

    async def record(self, entry: LedgerEntry) -> None:
        """Journal ``entry`` durably."""
        ...

    async def escalate(self, escalation: Escalation) -> bool:
        """Queue ``escalation``; False if its id is already queued (idempotent)."""
        ...

    async def escalations(self, *, include_resolved: bool = False) -> list[Escalation]:
        """The queue, oldest first (open ones only unless ``include_resolved``)."""
        ...

    async def resolve_escalation(self, escalation_id: str, *, by: str, note: str = "") -> bool:
        """Close an escalation (a human acted); False if unknown or already closed."""
        ...

    async def close(self) -> None: ...


class FileLedger:
    """A journal file on local disk (see the module doc). Several processes on one host may
    share it: appends are serialised by ``flock`` and each reader catches up on the lines
    others wrote before answering.

    Raises ``LedgerCorrupt`` (from any method) if a complete line cannot be read.
    """

    shared = False

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.description = f"file {self.path}"
        self._lock = threading.Lock()
        self._offset = 0
        self._ino: int | None = None
        self._line = 0
        self._done: set[str] = set()
        self._attempts: dict[str, int] = {}
        self._escalations: dict[str, Escalation] = {}

    # ------------------------------------------------------------------ reading

    def _catch_up(self) -> None:
        """Read lines appended since the last call (caller holds ``self._lock``)."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise location_error(exc, self.path, "its journal", _FIX, verb="read") from exc
        with f:
            st = os.fstat(f.fileno())
            if self._ino is not None and (st.st_ino != self._ino or st.st_size < self._offset):
                self._reset()
            self._ino = st.st_ino
            f.seek(self._offset)
            for line in f:
                if not line.endswith(b"\n"):
                    break  # torn final fragment: never acknowledged, never an entry
                self._line += 1
                self._offset += len(line)
                self._apply(line, f"{self.path} line {self._line}")

    def _reset(self) -> None:
        self._offset = 0
        self._line = 0
        self._done.clear()
        self._attempts.clear()
        self._escalations.clear()

    def _apply(self, line: bytes, location: str) -> None:
        try:
            d = json.loads(line)
            if not isinstance(d, dict) or d.get("v") != SCHEMA:
                raise ValueError(f"not a v={SCHEMA} journal entry")
            kind = d["kind"]
            if kind == "escalated":
                esc = Escalation.from_json(d)
                self._escalations.setdefault(esc.id, esc)
            elif kind == "escalation_resolved":
                known = self._escalations.get(str(d["id"]))
                if known is not None and known.open:
                    self._escalations[known.id] = known.resolved(str(d["by"]), str(d.get("note", "")), float(d["ts"]))
            elif kind == LedgerKind.DONE.value:
                self._done.add(str(d["token"]))
            elif kind == LedgerKind.ATTEMPT.value:
                t = str(d["token"])
                self._attempts[t] = self._attempts.get(t, 0) + 1
            elif kind not in (LedgerKind.FAILED.value, LedgerKind.SAGA.value):
                raise ValueError(f"unknown entry kind {kind!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerCorrupt(
                f"{location}: the recovery journal entry cannot be read ({exc}); recovery "
                f"stopped without acting, because it can no longer tell which compensations "
                f"already ran. Repair the line by hand (do not delete it) and restart",
                location=location,
            ) from exc

    # ------------------------------------------------------------------ writing

    def _append(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode()
        try:
            self._append_bytes(data)
        except OSError as exc:
            raise location_error(exc, self.path, "its journal", _FIX) from exc

    def _append_bytes(self, data: bytes) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                self._move_fragment(fd, size)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the flock

    def _move_fragment(self, fd: int, size: int) -> None:
        """A writer died mid-append: keep its fragment aside, cut it from the journal."""
        start = max(0, size - (1 << 20))
        tail = os.pread(fd, size - start, start)
        nl = tail.rfind(b"\n")
        cut = start + nl + 1 if nl >= 0 else 0
        sidecar = f"{self.path}.torn-{time.time_ns()}"
        with open(sidecar, "wb") as f:
            f.write(os.pread(fd, size - cut, cut))
            f.flush()
            os.fsync(f.fileno())
        os.ftruncate(fd, cut)

    # ------------------------------------------------------------------ API (sync)

    def completed_sync(self, tokens: Collection[str]) -> set[str]:
        with self._lock:
            self._catch_up()
            return {t for t in tokens if t in self._done}

    def attempts_sync(self, token: str) -> int:
        """How many attempts the journal holds for ``token`` (diagnostics, tests)."""
        with self._lock:
            self._catch_up()
            return self._attempts.get(token, 0)

    def record_sync(self, entry: LedgerEntry) -> None:
        with self._lock:
            self._append(entry.to_json())
            self._catch_up()

    def escalate_sync(self, escalation: Escalation) -> bool:
        with self._lock:
            self._catch_up()
            if escalation.id in self._escalations:
                return False
            self._append(escalation.to_json())
            self._catch_up()
            return True

    def escalations_sync(self, *, include_resolved: bool = False) -> list[Escalation]:
        with self._lock:
            self._catch_up()
            items = [e for e in self._escalations.values() if include_resolved or e.open]
        return sorted(items, key=lambda e: (e.ts, e.id))

    def resolve_escalation_sync(self, escalation_id: str, *, by: str, note: str = "") -> bool:
        with self._lock:
            self._catch_up()
            esc = self._escalations.get(escalation_id)
            if esc is None or not esc.open:
                return False
            self._append({"v": SCHEMA, "kind": "escalation_resolved", "id": escalation_id, "by": by, "note": note, "ts": time.time()})
            self._catch_up()
            return True

    # ------------------------------------------------------------------ API (async)

    async def completed(self, tokens: Collection[str]) -> set[str]:
        return await asyncio.to_thread(self.completed_sync, tokens)

    async def record(self, entry: LedgerEntry) -> None:
        await asyncio.to_thread(self.record_sync, entry)

    async def escalate(self, escalation: Escalation) -> bool:
        return await asyncio.to_thread(self.escalate_sync, escalation)

    async def escalations(self, *, include_resolved: bool = False) -> list[Escalation]:
        return await asyncio.to_thread(lambda: self.escalations_sync(include_resolved=include_resolved))

    async def resolve_escalation(self, escalation_id: str, *, by: str, note: str = "") -> bool:
        return await asyncio.to_thread(lambda: self.resolve_escalation_sync(escalation_id, by=by, note=note))

    async def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"<FileLedger {self.path}>"
