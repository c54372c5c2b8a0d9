"""Snapshots: the before-image of what a step is about to change, kept until the saga is
resolved, so its compensation can put it back.

    snapshots = FileSnapshots("/var/lib/agent-saga/snapshots")   # durable: COMPENSABLE
    memory = InProcessSnapshots()                                 # this process: REVERSIBLE

    @compensator("config.restore")
    def restore(snapshot_id):
        config.write(FileSnapshots(DIR).load(snapshot_id).value)

    async with saga_scope(wal) as saga:
        snap = await snapshots.capture(saga, "config/web", config.read())   # durable first
        await saga.execute("config.write", ActionSemantics.COMPENSABLE, forward=...,
                           compensate=lambda r: Compensation(handler="config.restore", kwargs=snap.ref()))

Invariants:
- A COMPENSABLE step's snapshot must survive a crash, so only a durable store takes it:
  ``FileSnapshots.capture`` returns once the file and its directory entry are fsynced
  (written to a temporary file, then renamed: a reader sees a whole snapshot or none).
  ``InProcessSnapshots`` holds REVERSIBLE ones only (and refuses a COMPENSABLE one,
  naming the fix). An IRREVERSIBLE step has no undo to feed: refused too.
- Nothing secret is captured: the value is copied to plain JSON and every string is
  checked by the secret scrubber (``SecretDetected`` / ``NotSerializable`` name the key
  path); a snapshot is restored verbatim, so a redacted one would corrupt the entity.
- ``load`` verifies the stored digest; a missing or damaged snapshot raises
  ``SnapshotMissing``, never returns a guess.
- A saga's snapshots are discarded at its boundary only if it resolved cleanly
  (COMPLETED or ROLLED_BACK); after a partial rollback or a quarantine they stay for a
  human. ``FileSnapshots.gc`` collects those left by crashed processes, conservatively:
  a snapshot goes only when the log shows its saga ended cleanly after the snapshot was
  taken and after the saga's last start; a saga that is running, unresolved, partial,
  open in this process, or absent from the log keeps its snapshots.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import threading
import time
from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError
from ..leases import open_sagas
from ..payloads import snapshot as json_copy
from ..records import Record, RecordType, canonical_json, validate_id
from ..semantics import ActionSemantics, coerce_semantics
from .errors import SnapshotMissing

__all__ = ["FileSnapshots", "InProcessSnapshots", "Snapshot", "SnapshotGCReport"]

_VERSION = 1
_CLEAN = frozenset({RecordType.SAGA_COMPLETED.value, RecordType.SAGA_ROLLED_BACK.value})
_ENDS = frozenset({*_CLEAN, RecordType.SAGA_ROLLBACK_PARTIAL.value})
_CLEAN_STATUS = frozenset({"COMPLETED", "ROLLED_BACK"})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One captured before-image. ``ref()`` is what a compensation's kwargs carry."""

    snapshot_id: str
    saga_id: str
    key: str
    semantics: ActionSemantics
    value: Any
    digest: str
    captured_at: float
    durable: bool

    def ref(self) -> dict[str, str]:
        """``{"snapshot_id": ...}``: the JSON reference a compensation passes to its handler."""
        return {"snapshot_id": self.snapshot_id}


@dataclass(frozen=True, slots=True)
class SnapshotGCReport:
    """What one ``gc`` sweep did: ``collected`` ids, and how many were kept and why
    (``unresolved``, ``partial``, ``not_in_log``, ``open_here``, ``unreadable``)."""

    collected: tuple[str, ...]
    kept: dict[str, int] = field(default_factory=dict)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def _saga_id(saga: Any) -> str:
    saga_id = getattr(saga, "saga_id", None)
    if not isinstance(saga_id, str) or not callable(getattr(saga, "on_exit", None)):
        raise ConfigurationError(
            f"capture() takes the Saga of a saga_scope (async with saga_scope(...) as saga), got {saga!r}"
        )
    return saga_id


class _Store:
    durable = False

    def _new(self, saga: Any, key: str, value: Any, semantics: ActionSemantics | str) -> Snapshot:
        saga_id = _saga_id(saga)
        validate_id(key, "key")
        sem = coerce_semantics(semantics)
        if sem is ActionSemantics.IRREVERSIBLE:
            raise ConfigurationError(
                f"snapshot {key!r} is for an IRREVERSIBLE step, which has no undo to restore it: if the "
                f"snapshot makes it undoable, declare the step COMPENSABLE with a restore compensation"
            )
        if sem is ActionSemantics.COMPENSABLE and not self.durable:
            raise ConfigurationError(
                f"snapshot {key!r} is for a COMPENSABLE step, whose undo must survive a crash: capture it "
                f"in a durable store (FileSnapshots(directory)); InProcessSnapshots holds REVERSIBLE ones"
            )
        copied = json_copy(value, "value")
        snap = Snapshot(f"snap-{secrets.token_hex(12)}", saga_id, key, sem, copied, _digest(copied),
                        time.time(), self.durable)
        return snap

    def _discard_at_boundary(self, saga: Any, snapshot_id: str) -> None:
        def settle(done: Any) -> None:
            if getattr(done, "status", None) in _CLEAN_STATUS:
                self.discard(snapshot_id)

        saga.on_exit(settle)

    def discard(self, snapshot_id: str) -> bool:
        """Remove one snapshot; True if it was there."""
        raise NotImplementedError


class InProcessSnapshots(_Store):
    """Snapshots held in this process's memory, for REVERSIBLE steps (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Snapshot] = {}

    async def capture(self, saga: Any, key: str, value: Any,
                      semantics: ActionSemantics | str = ActionSemantics.REVERSIBLE) -> Snapshot:
        """Keep a JSON copy of ``value`` for ``saga`` until it resolves cleanly. Raises
        ``ConfigurationError`` for a COMPENSABLE or IRREVERSIBLE step or a bad key,
        ``NotSerializable`` / ``SecretDetected`` naming the key path."""
        snap = self._new(saga, key, value, semantics)
        with self._lock:
            self._held[snap.snapshot_id] = snap
        self._discard_at_boundary(saga, snap.snapshot_id)
        return snap

    def load(self, snapshot_id: str) -> Snapshot:
        """The snapshot ``snapshot_id``; ``SnapshotMissing`` if this process holds none."""
        with self._lock:
            snap = self._held.get(snapshot_id)
        if snap is None:
            raise SnapshotMissing(
                f"snapshot {snapshot_id!r} is not held by this process (in-process snapshots do not "
                f"survive it, and go once their saga resolved cleanly)", snapshot_id=snapshot_id)
        return snap

    def discard(self, snapshot_id: str) -> bool:
        """Drop one snapshot; True if it was held."""
        with self._lock:
            return self._held.pop(snapshot_id, None) is not None

    def __len__(self) -> int:
        return len(self._held)


class FileSnapshots(_Store):
    """Durable snapshots, one fsynced JSON file each in ``directory`` (see the module doc).
    Every process that may restore (the agent, the recovery daemon) opens the same one."""

    durable = True

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        if not isinstance(directory, str | os.PathLike) or not os.fspath(directory):
            raise ConfigurationError(f"FileSnapshots needs a directory path, got {directory!r}")
        self.directory = os.fspath(directory)

    def _path(self, snapshot_id: str) -> str:
        if not snapshot_id.startswith("snap-") or not snapshot_id[5:].isalnum():
            raise SnapshotMissing(f"{snapshot_id!r} is not a snapshot id (snap-<hex>, from Snapshot.ref())",
                                  snapshot_id=str(snapshot_id))
        return os.path.join(self.directory, snapshot_id + ".json")

    async def capture(self, saga: Any, key: str, value: Any,
                      semantics: ActionSemantics | str = ActionSemantics.COMPENSABLE) -> Snapshot:
        """Write a JSON copy of ``value`` for ``saga``, durable before this returns.

        Raises ``ConfigurationError`` for an IRREVERSIBLE step or a bad key,
        ``NotSerializable`` / ``SecretDetected`` naming the key path, ``OSError`` if the
        directory cannot be written (nothing captured: do not run the step)."""
        snap = self._new(saga, key, value, semantics)
        doc = {"v": _VERSION, "snapshot_id": snap.snapshot_id, "saga": snap.saga_id, "key": snap.key,
               "semantics": snap.semantics.value, "value": snap.value, "digest": snap.digest,
               "captured_at": snap.captured_at}
        await asyncio.to_thread(self._write, snap.snapshot_id, canonical_json(doc).encode())
        self._discard_at_boundary(saga, snap.snapshot_id)
        return snap

    def _write(self, snapshot_id: str, data: bytes) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        path = self._path(snapshot_id)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def load(self, snapshot_id: str) -> Snapshot:
        """The snapshot ``snapshot_id``, its digest verified; ``SnapshotMissing`` naming the
        file if it is not there or does not verify."""
        path = self._path(snapshot_id)
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read())
            snap = Snapshot(doc["snapshot_id"], doc["saga"], doc["key"], ActionSemantics(doc["semantics"]),
                            doc["value"], doc["digest"], float(doc["captured_at"]), True)
        except FileNotFoundError:
            raise SnapshotMissing(
                f"snapshot {snapshot_id!r} is not in {self.directory} (collected after its saga resolved, or "
                f"captured in another directory): the step cannot be restored from it", snapshot_id=snapshot_id,
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SnapshotMissing(f"snapshot file {path} cannot be read ({type(exc).__name__}: {exc})",
                                  snapshot_id=snapshot_id) from exc
        if snap.snapshot_id != snapshot_id or _digest(snap.value) != snap.digest:
            raise SnapshotMissing(f"snapshot file {path} does not verify (its digest differs): it was "
                                  f"altered or damaged; restore by hand", snapshot_id=snapshot_id)
        return snap

    def discard(self, snapshot_id: str) -> bool:
        """Delete one snapshot's file; True if it was there."""
        try:
            os.unlink(self._path(snapshot_id))
        except FileNotFoundError:
            return False
        return True

    def ids(self) -> list[str]:
        """The ids of the snapshots in the directory (none if it does not exist yet)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names if n.startswith("snap-") and n.endswith(".json"))

    async def gc(self, log: Any) -> SnapshotGCReport:
        """Collect the snapshots of sagas ``log`` shows ended cleanly (see the module doc).

        ``log`` is a ``BaseWAL`` (read with ``read_all``) or an iterable of ``Record``.
        Snapshots are listed before the log is read: one captured meanwhile is either
        in the listing with its saga unresolved, or not listed at all."""
        listed = await asyncio.to_thread(self.ids)
        ends = await _clean_ends(log)
        here = set(open_sagas())
        return await asyncio.to_thread(self._collect, listed, ends, here)

    def _collect(self, listed: list[str], ends: dict[str, tuple[str, int]], here: set[str]) -> SnapshotGCReport:
        collected: list[str] = []
        kept: dict[str, int] = {}
        for snapshot_id in listed:
            try:
                snap = self.load(snapshot_id)
            except SnapshotMissing:
                if os.path.exists(self._path(snapshot_id)):
                    kept["unreadable"] = kept.get("unreadable", 0) + 1
                continue
            verdict = "open_here" if snap.saga_id in here else ends.get(snap.saga_id, ("not_in_log", 0))
            if isinstance(verdict, tuple):
                state, ended_us = verdict
                if state == "clean" and snap.captured_at * 1e6 <= ended_us:
                    if self.discard(snapshot_id):
                        collected.append(snapshot_id)
                    continue
                verdict = "unresolved" if state == "clean" else state
            kept[verdict] = kept.get(verdict, 0) + 1
        return SnapshotGCReport(tuple(collected), kept)


async def _records(log: Any) -> AsyncIterable[Record]:
    read_all = getattr(log, "read_all", None)
    if callable(read_all):
        async for rec in read_all():
            yield rec
        return
    if not isinstance(log, Iterable):
        raise ConfigurationError(f"gc() reads a BaseWAL or an iterable of Record, got {log!r}")
    for item in log:
        rec = item[1] if isinstance(item, tuple) else item
        if isinstance(rec, Record):
            yield rec


async def _clean_ends(log: Any) -> dict[str, tuple[str, int]]:
    """saga id -> (``clean`` / ``partial`` / ``unresolved``, ts of its end in µs)."""
    out: dict[str, tuple[str, int]] = {}
    async for rec in _records(log):
        if rec.type == RecordType.SAGA_STARTED.value:
            out[rec.saga] = ("unresolved", 0)  # a (re)start reopens it
        elif rec.type in _ENDS:
            out[rec.saga] = ("clean" if rec.type in _CLEAN else "partial", rec.ts)
        else:
            out.setdefault(rec.saga, ("unresolved", 0))
    return out
