"""Redaction for erasure requests: destroy a record's payload and salt; the chain still verifies.

What survives a redaction is the record's header (``seq``, ``ts``, ``type``, ``saga``,
``step``), its content ``digest`` and its chain links: proof that the record existed,
when, in what order and of what type. Its contents are unrecoverable, including by
whoever holds the log: the digest is salted, and the salt is destroyed with the payload.
A redacted record keeps its ``hash``, so published audit roots and signed checkpoints
stay valid.

Invariants:
- Only a FileWAL file at rest is rewritten: ``redact_records`` takes the file's ``flock``
  without waiting and refuses while a writer holds it ("stop the writer first").
- The log must verify before the rewrite and the rewritten log is verified before it
  replaces the old one (temp file, fsync, ``os.replace``, directory fsync): the file on
  disk is the old log or the new one, never a mix.
- Compaction attestations and other records of the reserved saga ``wal`` are never
  redacted: an attestation without its payload explains no gap.
- Unless ``note=False``, one chained ``REDACTION`` record (saga ``wal``) is appended
  naming the sequences erased and the caller's reason, so the log says when it was
  erased. The reason should be a ticket reference, never personal data.
- Copies made before the rewrite (exports, backups, freed disk blocks) are not touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..chain import RESERVED_SAGA, VerifyResult, seal, verify_records
from ..errors import ConfigurationError, WALCorrupt, WALError
from ..records import ExtensionType, Record, decode_line, encode_line
from ..wal.file import iter_file_records

REDACTION_TYPE = ExtensionType.REDACTION.value


@dataclass(frozen=True, slots=True)
class RedactionReport:
    """What ``redact_records`` did: sequences newly redacted, already redacted, the note."""

    path: str
    redacted: tuple[int, ...]
    already: tuple[int, ...]
    note_seq: int | None
    head: str

    def describe(self) -> str:
        """One line for a human: what was redacted."""
        parts = [f"redacted {len(self.redacted)} record(s) in {self.path}"]
        if self.redacted:
            parts.append(f"seq {', '.join(map(str, self.redacted))}")
        if self.already:
            parts.append(f"already redacted: {', '.join(map(str, self.already))}")
        if self.note_seq is not None:
            parts.append(f"noted as REDACTION record seq {self.note_seq}")
        return "; ".join(parts) + "; the chain verifies"


def redacted(rec: Record) -> Record:
    """The redacted form of ``rec``: payload and salt destroyed, everything hashed kept."""
    return Record(rec.type, rec.saga, rec.step, None, rec.seq, rec.ts, None, rec.digest,
                  rec.prev, rec.hash, True, dict(rec.extra))


def _lock(path: str) -> int:
    """Open ``path`` and take its writer lock without waiting; the fd holds it."""
    for _attempt in range(100):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ConfigurationError(f"WAL file {path!r} does not exist; check --wal-path") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ConfigurationError(f"{path!r} is not a regular file; only a FileWAL file can be redacted")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigurationError(
                    f"WAL {path!r} is open for writing (a FileWAL holds its lock): stop the "
                    f"writer first, then redact; a rewrite under a live writer would lose its records"
                ) from None
            if os.stat(path).st_ino == st.st_ino:
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # a compaction swapped the file between open and lock: lock the new one
    raise WALError(f"WAL {path!r} keeps being replaced; cannot lock it")


def _lines(fd: int, path: str) -> Iterator[tuple[str, bytes, Record | WALCorrupt]]:
    with open(os.dup(fd), "rb") as f:
        f.seek(0)
        for lineno, line in enumerate(f, 1):
            location = f"{path} line {lineno}"
            if not line.endswith(b"\n"):
                raise ConfigurationError(
                    f"{location}: the log ends in a torn fragment (a crashed write); open it once "
                    f"with FileWAL, which moves the fragment aside, then redact"
                )
            try:
                yield location, line, decode_line(line, location)
            except WALCorrupt as exc:
                yield location, line, exc


def redact_records(
    path: str | os.PathLike[str],
    seqs: Iterable[int],
    *,
    reason: str | None = None,
    note: bool = True,
) -> RedactionReport:
    """Redact the records ``seqs`` of the FileWAL file ``path`` in one atomic rewrite.

    Raises ``ConfigurationError`` if a writer holds the file, a sequence is not in the log
    (never written, or compacted away) or belongs to the reserved saga ``wal``; ``WALError``
    if the log does not verify before the rewrite. Re-redacting a record is a no-op.
    """
    p = os.fspath(path)
    wanted = sorted(set(seqs))
    if not wanted:
        raise ConfigurationError("name at least one record to redact (--seq N or --saga ID)")
    fd = _lock(p)
    tmp = f"{p}.redact-{time.time_ns()}"
    out = -1
    try:
        before = verify_records((loc, item) for loc, _line, item in _lines(fd, p))
        if not before.ok:
            raise WALError(
                f"WAL {p!r} does not verify ({before.describe()}); a rewrite would bury the "
                f"damage, so nothing was redacted"
            )
        found: dict[int, Record] = {}
        for _loc, _line, item in _lines(fd, p):
            assert isinstance(item, Record)
            if item.seq in wanted:
                found[item.seq] = item
        missing = [s for s in wanted if s not in found]
        if missing:
            raise ConfigurationError(
                f"no record with seq {', '.join(map(str, missing))} in {p!r} (never written, or "
                f"removed by compaction); nothing was redacted"
            )
        reserved = [s for s in wanted if found[s].saga == RESERVED_SAGA]
        if reserved:
            raise ConfigurationError(
                f"seq {', '.join(map(str, reserved))} belong to the WAL's own saga {RESERVED_SAGA!r} "
                f"(attestations, notes): they hold no personal data and explain the log's gaps, "
                f"so they are never redacted"
            )
        already = tuple(s for s in wanted if found[s].redacted)
        todo = tuple(s for s in wanted if not found[s].redacted)
        if not todo:
            return RedactionReport(p, (), already, None, before.head)
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                      stat.S_IMODE(os.fstat(fd).st_mode))
        fcntl.flock(out, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the lock moves with the file
        note_seq: int | None = None
        with open(out, "wb", closefd=False) as w:
            for _loc, line, item in _lines(fd, p):
                assert isinstance(item, Record)
                w.write(encode_line(redacted(item)) if item.seq in todo else line)
            if note:
                payload: dict[str, Any] = {"seqs": list(todo), "reason": reason}
                rec = Record(REDACTION_TYPE, RESERVED_SAGA, None, payload, before.last_seq + 1,
                             time.time_ns() // 1000)
                w.write(encode_line(rec, seal(rec, before.head)))
                note_seq = rec.seq
        after = _verify_file(tmp)
        if not after.ok:  # pragma: no cover - a bug here must not replace the log
            raise WALError(f"redaction produced a log that does not verify ({after.describe()}); "
                           f"the original is unchanged")
        os.fsync(out)
        os.replace(tmp, p)
        _fsync_dir(p)
        return RedactionReport(p, todo, already, note_seq, after.head)
    finally:
        if out >= 0:
            os.close(out)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.close(fd)


def redact_record(
    path: str | os.PathLike[str], seq: int, *, reason: str | None = None, note: bool = True
) -> RedactionReport:
    """Redact one record (see ``redact_records``)."""
    return redact_records(path, [seq], reason=reason, note=note)


def saga_seqs(path: str | os.PathLike[str], saga_id: str) -> list[int]:
    """The sequences of every record of ``saga_id`` in the FileWAL file ``path``."""
    out: list[int] = []
    for _loc, item in iter_file_records(path):
        if isinstance(item, Record) and item.saga == saga_id:
            out.append(item.seq)
    return out


def _verify_file(path: str) -> VerifyResult:
    return verify_records(iter_file_records(path))


def _fsync_dir(path: str) -> None:
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
