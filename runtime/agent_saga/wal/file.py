"""FileWAL: the zero-dependency, fsync-durable write-ahead log (JSON lines on a local disk).

Invariants:
- One writer per file: an exclusive ``flock`` is held while open; a second writer is
  refused with a message naming the file. Readers (verify, inspect) need no lock.
- The writer machinery (queue, private flusher, group commit, fences, backpressure,
  fail-stop) is ``BatchingWAL``'s, shared with the server backends; a batch here is one
  ``write`` and one ``fdatasync``.
- Nothing is dropped silently: over ``max_pending`` the RAISE policy raises
  ``WALBackpressure``; a failed write fails the WAL (fail-stop) and every waiter and every
  later caller gets the real ``OSError`` chained; a record whose payload cannot be encoded
  is replaced, under the same ``seq``, by a ``RECORD_REJECTED`` record and its waiters get
  the encoding error, so the chain has no gap and the log says what happened.
- Reopening continues the sequence and the chain from the last complete record. A torn
  final fragment (power cut mid-write, never acknowledged) is moved to a ``.torn-<ns>``
  sidecar file, the file is truncated after the last complete line, and a
  ``WAL_TORN_TAIL`` record notes it. A damaged complete last line refuses the open.
- ``barrier`` raises ``WALStalled`` after ``stall_timeout`` instead of hanging.
- ``sealer="process"`` moves the seal, the write and the fdatasync to a child process
  (``wal.sealer``), the rest of the machinery stays here: the same log, the same fences,
  the same failures; the child's death fails the WAL like a failed write.
- ``compact()`` runs on the flusher, in log order: it writes the kept lines (byte for byte)
  and the attestation to a locked temp file, fsyncs it, ``os.replace``s it over the log and
  fsyncs the directory. The lock moves with the file (the temp file is locked before the
  swap), and an opener that raced the swap re-opens the new file, so there is never a
  second writer and no record is written to a replaced file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import stat
import time
import weakref
from collections.abc import AsyncIterator, Collection, Iterator, Sequence

from ..chain import seal
from ..errors import ConfigurationError, WALCorrupt, WALError
from ..records import GENESIS, TERMINAL_SAGA_TYPES, ExtensionType, Record, decode_line, encode_line
from .base import Backpressure, FaultHook, WALStats
from .batching import BatchingWAL, Sealed, SealedLines
from .compaction import CompactionAborted, CompactionPlan, CompactionReport, CompactionRequest
from .sealer import SealerProcess
from .urls import Scrubber

log = logging.getLogger("agent_saga.wal")

_TAIL_CHUNK = 1 << 16
#: The FileWALs this process holds open, so a second open of the same file can say so.
_OPEN_HERE: weakref.WeakSet[FileWAL] = weakref.WeakSet()


class FileWAL(BatchingWAL):
    """A hash-chained JSON-lines log on a local file; ``barrier`` means fdatasync'ed.

    Args:
        path: the log file (created with mode 0600 if absent).
        sync: fdatasync every batch (default). ``False`` is for scratch logs only:
            ``barrier`` then means "written to the OS", not durable.
        max_pending: records allowed to wait for the flusher before backpressure.
        backpressure: RAISE (default) or BLOCK (bounded by ``stall_timeout``).
        stall_timeout: the bound on ``barrier``, ``close`` and BLOCK, in seconds.
        fault_hook: test seam called with ``"before_write"``/``"before_sync"`` (and
            ``"before_compact"``/``"before_replace"``) on the flusher thread (a
            fault-injection point, e.g. to wedge the device). ``sealer="thread"`` only.
        sealer: where batches are sealed into the chain, written and fdatasync'ed.
            ``"thread"`` (default): the WAL's flusher thread, in this process.
            ``"process"``: a child process with its own interpreter lock, so the sealing
            runs on another CPU core instead of competing with the caller's event loop
            for this process's lock (more durable steps/s on a machine with a core to
            spare). The log, the fences and the failures are the same; the child dying
            fails the WAL (fail-stop, ``WALError`` naming how it ended), and it exits
            when this process does. ``compact()`` and ``fault_hook`` are refused.

    Raises ``ConfigurationError`` if another process holds the file, for an unknown
    ``sealer``, or for ``fault_hook`` with ``sealer="process"``; ``WALCorrupt`` if the last
    complete record cannot be read; ``WALError`` if the sealer process cannot start.
    """

    backend = "file"
    _writes_lines = True
    durability = "fsync: barrier returns after the batch is written and fdatasync'ed to local disk"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sync: bool = True,
        max_pending: int = 100_000,
        backpressure: Backpressure = Backpressure.RAISE,
        stall_timeout: float = 30.0,
        fault_hook: FaultHook | None = None,
        sealer: str = "thread",
    ) -> None:
        self.path = os.fspath(path)
        if sealer not in ("thread", "process"):
            raise ConfigurationError(
                f"FileWAL {self.path!r}: sealer must be 'thread' (the default) or 'process', got {sealer!r}"
            )
        if sealer == "process" and fault_hook is not None:
            raise ConfigurationError(
                f"FileWAL {self.path!r}: fault_hook is called on the flusher thread, but with "
                f"sealer='process' a child process seals and writes; drop fault_hook or use "
                f"sealer='thread'"
            )
        self.sealer = sealer
        self._sealer: SealerProcess | None = None
        super().__init__(
            name=repr(self.path), scrub=Scrubber(), max_pending=max_pending,
            backpressure=backpressure, stall_timeout=stall_timeout, max_batch=max_pending,
            fault_hook=fault_hook,
        )
        self._sync = sync
        self._syncs = 0
        self._fd = self._open_locked()
        try:
            self._remove_stale_compactions()
            head, last_seq, torn = self._recover_tail()
            if sealer == "process":
                self._sealer = SealerProcess(self._fd, head, sync=sync, start_timeout=stall_timeout)
        except BaseException:
            os.close(self._fd)
            raise
        _OPEN_HERE.add(self)
        self._start(head, last_seq)
        if torn is not None:
            nbytes, sidecar = torn
            log.warning(
                "WAL %s: a torn final fragment of %d bytes (never acknowledged) was moved to %s",
                self.path, nbytes, sidecar,
            )
            self.append(ExtensionType.WAL_TORN_TAIL.value, "wal", None, {"bytes": nbytes, "sidecar": sidecar})

    def _open_locked(self) -> int:
        """Open the log and take its lock; re-open if a compaction swapped the file meanwhile."""
        for _attempt in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                st = os.fstat(fd)
                self._regular = stat.S_ISREG(st.st_mode)
                if not self._regular:
                    return fd
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError as exc:
                    raise ConfigurationError(self._held_message()) from exc
                try:
                    same = os.stat(self.path).st_ino == st.st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # we locked a file that compaction replaced: open the new one
        raise WALError(f"WAL {self.path!r}: the file keeps being replaced; cannot open it")

    def _remove_stale_compactions(self) -> None:
        """Delete temp files of a compaction a crash interrupted before its swap.

        Only the lock holder gets here, and a temp file that was swapped in no longer has
        its temp name: what is left was never part of the log.
        """
        if not self._regular:
            return
        d = os.path.dirname(os.path.abspath(self.path))
        prefix = os.path.basename(self.path) + ".compact-"
        for name in os.listdir(d):
            if name.startswith(prefix) and name[len(prefix) :].isdigit():
                os.unlink(os.path.join(d, name))
                log.warning("WAL %s: removed %s, left by a compaction interrupted before its swap", self.path, name)

    # ------------------------------------------------------------------ BatchingWAL

    @property
    def sealer_pid(self) -> int | None:
        """The process id of the sealer process (``sealer="process"``), else None."""
        return None if self._sealer is None else self._sealer.pid

    def _commit(self, batch: Sequence[Record]) -> str:
        sealer = self._sealer
        if sealer is None:
            return super()._commit(batch)
        head, rejected = sealer.commit(batch, self._reject)
        for seq, exc in rejected:
            self._rejected[seq] = exc
        if self._sync:
            self._syncs += 1
        return head

    def _write_batch(self, sealed: Sealed) -> None:
        if sealed.__class__ is SealedLines:  # the lines built as the batch was sealed
            data = "\n".join([*sealed.lines, ""]).encode()
        else:
            data = b"".join([encode_line(rec, canonical) for rec, canonical in sealed])
        self._write_all(data)
        if self._sync:
            hook = self._fault_hook
            if hook is not None:
                hook("before_sync")
            os.fdatasync(self._fd)
            self._syncs += 1

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def _held_message(self) -> str:
        here = os.path.realpath(self.path)
        if any(os.path.realpath(w.path) == here for w in list(_OPEN_HERE)):
            return (
                f"WAL {self.path!r} is already open for writing in this process, by another FileWAL "
                f"(saga_scope() without a wal opens the default one, $AGENT_SAGA_WAL_PATH or "
                f"./agent-saga.wal): pass that FileWAL instead of opening the file again "
                f"(agent_saga.get_default_wal() returns the default), or close() it first"
            )
        return (
            f"WAL {self.path!r} is already open for writing by another process; "
            f"give each process its own WAL file (or use a fleet backend)"
        )

    def _release(self) -> None:
        _OPEN_HERE.discard(self)
        try:
            if self._sealer is not None:
                self._sealer.close()  # it exits on end of file, closing its copy of the fd
        finally:
            os.close(self._fd)  # releases the flock

    async def compact(
        self, keep_sagas: Collection[str] | None = None, *, timeout: float | None = None
    ) -> CompactionReport:
        """Rewrite the log keeping unresolved sagas, with a chained attestation of what left.

        See ``BaseWAL.compact``. Atomic: the log on disk is the old file or the new one,
        never a mix. Raises ``ConfigurationError`` for a log that is not a regular file.
        """
        if not self._regular:
            raise ConfigurationError(f"WAL {self.path!r} is not a regular file; it cannot be compacted")
        if self._sealer is not None:
            raise ConfigurationError(
                f"WAL {self.path!r} was opened with sealer='process', which does not compact: "
                f"close it and compact with FileWAL({self.path!r}) (sealer='thread', the "
                f"default), then reopen it with sealer='process'"
            )
        return await super().compact(keep_sagas, timeout=timeout)

    def _own_records(self) -> Iterator[tuple[int, str, bytes, Record]]:
        """``(lineno, location, line, record)`` of the open file, through our own fd."""
        with open(os.dup(self._fd), "rb") as f:
            f.seek(0)
            for lineno, line in enumerate(f, 1):
                if not line.endswith(b"\n"):
                    return
                location = f"{self.path} line {lineno}"
                yield lineno, location, line, decode_line(line, location)

    def _compact_now(self, req: CompactionRequest, prev: str) -> tuple[CompactionReport, str]:
        hook = self._fault_hook
        tmp = f"{self.path}.compact-{time.time_ns()}"
        fd = -1
        try:
            resolved: set[str] = set()
            total = 0
            for *_, rec in self._own_records():
                total += 1
                if rec.type in TERMINAL_SAGA_TYPES:
                    resolved.add(rec.saga)
            plan = CompactionPlan(resolved, req.keep_sagas)
            if plan.removes_nothing():
                # Every resolved saga of a file has records in it: none leaves, no rewrite.
                plan.kept = total
                att = plan.attestation(req.seq)
                att_line = encode_line(att, seal(att, prev))
            else:
                fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                with open(fd, "wb", closefd=False) as out:
                    for _n, _loc, line, rec in self._own_records():
                        if plan.offer(rec):
                            out.write(line)
                    att = plan.attestation(req.seq)
                    att_line = encode_line(att, seal(att, prev))
                    out.write(att_line)
                os.fsync(fd)
                if hook is not None:
                    hook("before_replace")
                os.replace(tmp, self.path)
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise CompactionAborted(
                f"WAL {self.path!r}: compaction failed, the log is unchanged: {exc}"
            ) from exc
        if fd < 0:
            # Nothing left: append the attestation to the log as it is.
            self._write_all(att_line)
            if self._sync:
                os.fdatasync(self._fd)
                self._syncs += 1
        else:
            # The new file is in place and locked by us: from here a failure is in doubt.
            old, self._fd = self._fd, fd
            os.close(old)
            dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            self._syncs += 2
        return plan.report(req.seq), att.hash

    # ------------------------------------------------------------------ reading

    def iter_records(self) -> Iterator[Record]:
        """Every complete record on disk, in order; raises ``WALCorrupt`` on damage."""
        for _location, item in iter_file_records(self.path):
            if isinstance(item, WALCorrupt):
                raise item
            yield item

    async def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every record, in log order."""
        async for rec in self.read_since(0, page_size=page_size):
            yield rec

    async def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every record after ``seq``, in log order."""
        n = 0
        for rec in self.iter_records():
            if rec.seq > seq:
                yield rec
                n += 1
                if n % page_size == 0:
                    await asyncio.sleep(0)  # one page at a time: let other tasks run

    # ------------------------------------------------------------------ lifecycle

    def stats(self) -> WALStats:
        """Counters of this WAL (appends, batches, fences, pending)."""
        base = super().stats()
        return WALStats(
            backend="file",
            durability=self.durability if self._sync else "none: sync=False (scratch log)",
            appended_seq=base.appended_seq,
            durable_seq=base.durable_seq,
            pending=base.pending,
            batches=base.batches,
            syncs=self._syncs,
            failed=base.failed,
        )

    # ------------------------------------------------------------------ opening

    def _recover_tail(self) -> tuple[str, int, tuple[int, str] | None]:
        """Find the chain head; move a torn final fragment aside. Returns (head, seq, torn)."""
        if not self._regular:
            return GENESIS, 0, None
        size = os.fstat(self._fd).st_size
        if size == 0:
            return GENESIS, 0, None
        tail, tail_start = _read_tail(self._fd, size)
        last_nl = tail.rfind(b"\n")
        torn: tuple[int, str] | None = None
        if last_nl != len(tail) - 1:
            fragment = tail[last_nl + 1 :]
            sidecar = f"{self.path}.torn-{time.time_ns()}"
            with open(sidecar, "wb") as f:
                f.write(fragment)
                f.flush()
                os.fsync(f.fileno())
            keep = tail_start + last_nl + 1
            os.ftruncate(self._fd, keep)
            os.fsync(self._fd)
            torn = (len(fragment), sidecar)
            if last_nl < 0:
                return GENESIS, 0, torn
            tail = tail[: last_nl + 1]
        prev_nl = tail.rfind(b"\n", 0, len(tail) - 1)
        last_line = tail[prev_nl + 1 :]
        rec = decode_line(last_line, f"{self.path} (last complete record)")
        return rec.hash, rec.seq, torn



def _read_tail(fd: int, size: int) -> tuple[bytes, int]:
    """Read enough of the file's end to hold its last two newlines (or all of it)."""
    chunk = _TAIL_CHUNK
    while True:
        start = max(0, size - chunk)
        data = os.pread(fd, size - start, start)
        body = data[:-1] if data.endswith(b"\n") else data
        if start == 0 or body.count(b"\n") >= 1:
            return data, start
        chunk *= 4


def iter_file_records(path: str | os.PathLike[str]) -> Iterator[tuple[str, Record | WALCorrupt]]:
    """Yield ``(location, record)`` for each line, or ``(location, WALCorrupt)`` for a damaged
    one. An unterminated final fragment (a torn write) is not yielded: it was never
    acknowledged. Used by verify, inspect and the readers of every backend's exports."""
    for _offset, location, item in scan_file_records(path):
        yield location, item


def scan_file_records(
    path: str | os.PathLike[str], offset: int = 0, lineno: int = 1
) -> Iterator[tuple[int, str, Record | WALCorrupt]]:
    """``iter_file_records`` with each line's byte offset: ``(offset, location, item)``,
    starting at byte ``offset`` (the start of line ``lineno``). What an index of the file
    remembers, to read one page of it again later without reading what comes before."""
    p = os.fspath(path)
    try:
        f = open(p, "rb")
    except FileNotFoundError as exc:
        raise ConfigurationError(f"WAL file {p!r} does not exist; check --wal-path") from exc
    with f:
        f.seek(offset)
        for n, line in enumerate(f, lineno):
            if not line.endswith(b"\n"):
                return  # torn final fragment: tolerated, never acknowledged
            location = f"{p} line {n}"
            if not line.strip():
                yield offset, location, WALCorrupt(f"{location}: empty line inside the log", location=location)
            else:
                try:
                    rec = decode_line(line, location)
                except WALCorrupt as exc:
                    yield offset, location, exc
                else:
                    if rec.extra:
                        # A file is one writer's chain: a "writer" or "gseq" stamp on a line
                        # is not covered by the chain, so nothing may read it (it could
                        # make a forged run of lines look like a chain of its own).
                        rec.extra.pop("writer", None)
                        rec.extra.pop("gseq", None)
                    yield offset, location, rec
            offset += len(line)


def torn_tail_bytes(path: str | os.PathLike[str]) -> int:
    """Size of an unterminated final fragment in ``path`` (0 if the file ends cleanly)."""
    with open(os.fspath(path), "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return 0
        tail, start = _read_tail(f.fileno(), size)
    nl = tail.rfind(b"\n")
    return len(tail) - nl - 1


def read_log(path: str | os.PathLike[str]) -> Iterator[tuple[str, Record | WALCorrupt]]:
    """The records of the FileWAL file at ``path``, in log order, each with its location
    (``file:line``): what ``verify_records`` checks and ``saga_states`` folds.

    A damaged line is yielded as a ``WALCorrupt`` naming it (never skipped); a torn final
    fragment (never acknowledged) is not yielded. Raises ``ConfigurationError`` if the
    file does not exist."""
    return iter_file_records(path)
