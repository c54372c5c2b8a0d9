"""FileWAL: the zero-dependency, fsync-durable write-ahead log (JSON lines on a local disk).

Invariants:
- One writer per file: an exclusive ``flock`` is held while open; a second writer is
  refused with a message naming the file. Readers (verify, inspect) need no lock.
- ``append`` only queues; a private flusher thread seals records into the hash chain,
  writes each batch with one ``write`` and one ``fdatasync`` (group commit: every record
  queued while the previous sync ran shares the next one), then wakes the waiters.
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
- ``compact()`` runs on the flusher, in log order: it writes the kept lines (byte for byte)
  and the attestation to a locked temp file, fsyncs it, ``os.replace``s it over the log and
  fsyncs the directory. The lock moves with the file (the temp file is locked before the
  swap), and an opener that raced the swap re-opens the new file, so there is never a
  second writer and no record is written to a replaced file.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import heapq
import itertools
import logging
import os
import stat
import threading
import time
import weakref
from collections.abc import AsyncIterator, Collection, Iterator
from typing import Any

from ..chain import SALT_BYTES, seal
from ..errors import (
    ConfigurationError,
    WALBackpressure,
    WALClosed,
    WALCorrupt,
    WALError,
    WALStalled,
)
from ..records import GENESIS, TERMINAL_SAGA_TYPES, Record, decode_line, encode_line
from .base import Backpressure, BaseWAL, FaultHook, WALStats
from .compaction import (
    CompactionAborted,
    CompactionPlan,
    CompactionReport,
    CompactionRequest,
)

log = logging.getLogger("agent_saga.wal")

_TAIL_CHUNK = 1 << 16


class FileWAL(BaseWAL):
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
            fault-injection point, e.g. to wedge the device).

    Raises ``ConfigurationError`` if another process holds the file, ``WALCorrupt`` if the
    last complete record cannot be read.
    """

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
    ) -> None:
        if max_pending < 1:
            raise ConfigurationError(f"max_pending must be >= 1, got {max_pending}")
        if stall_timeout <= 0:
            raise ConfigurationError(f"stall_timeout must be > 0 seconds, got {stall_timeout}")
        self.path = os.fspath(path)
        self._sync = sync
        self._max_pending = max_pending
        self._backpressure = Backpressure(backpressure)
        self._stall_timeout = stall_timeout
        self._fault_hook = fault_hook

        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # flusher waits for records
        self._space = threading.Condition(self._lock)  # BLOCK appenders wait for room
        self._pending: list[Record | CompactionRequest] = []
        self._compactions: list[CompactionRequest] = []  # queued or running
        self._closing = False
        self._closed = False
        self._failed: BaseException | None = None
        self._rejected: dict[int, BaseException] = {}

        self._wlock = threading.Lock()
        self._waiters: list[tuple[int, int, Any, Any]] = []  # (seq, n, loop|None, fut|event)
        self._wcount = itertools.count()

        self._batches = 0
        self._syncs = 0

        self._fd = self._open_locked()
        try:
            self._remove_stale_compactions()
            head, last_seq, torn = self._recover_tail()
        except BaseException:
            os.close(self._fd)
            raise
        self._head = head
        self._next_seq = last_seq + 1
        self._durable_seq = last_seq
        self._flusher = threading.Thread(
            target=self._run, name=f"agent-saga-wal-flusher:{os.path.basename(self.path)}", daemon=True
        )
        self._flusher.start()
        _open_wals.add(self)
        if torn is not None:
            nbytes, sidecar = torn
            log.warning(
                "WAL %s: a torn final fragment of %d bytes (never acknowledged) was moved to %s",
                self.path, nbytes, sidecar,
            )
            self.append("WAL_TORN_TAIL", "wal", None, {"bytes": nbytes, "sidecar": sidecar})

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
                    raise ConfigurationError(
                        f"WAL {self.path!r} is already open for writing by another process; "
                        f"give each process its own WAL file (or use a fleet backend)"
                    ) from exc
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

    # ------------------------------------------------------------------ writing

    def append(
        self,
        type: str,
        saga: str,
        step: str | None = None,
        payload: dict[str, Any] | None = None,
    ) -> int:
        """Queue a record and return its ``seq``; never waits for the disk."""
        with self._lock:
            if self._failed is not None:
                raise WALError(f"WAL {self.path!r} failed earlier and accepts no records: {self._failed}") from self._failed
            if self._closing:
                raise WALClosed(f"WAL {self.path!r} is closed; open a new FileWAL to append")
            if len(self._pending) >= self._max_pending:
                self._wait_for_space()
            seq = self._next_seq
            self._next_seq = seq + 1
            self._pending.append(Record(type, saga, step, payload, seq, time.time_ns() // 1000))
            self._work.notify()
        return seq

    def _wait_for_space(self) -> None:
        # Called with self._lock held.
        if self._backpressure is Backpressure.RAISE:
            raise WALBackpressure(
                f"WAL {self.path!r} has {len(self._pending)} records waiting to be written "
                f"(max_pending={self._max_pending}); the disk is not keeping up. Slow the "
                f"caller, raise max_pending, or choose Backpressure.BLOCK"
            )
        deadline = time.monotonic() + self._stall_timeout
        while len(self._pending) >= self._max_pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WALStalled(
                    f"WAL {self.path!r}: no room for a record within {self._stall_timeout}s "
                    f"(max_pending={self._max_pending}); the disk may be wedged"
                )
            self._space.wait(remaining)
            if self._failed is not None:
                raise WALError(f"WAL {self.path!r} failed: {self._failed}") from self._failed

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._work.wait()
                batch = self._pending
                if not batch:
                    return  # closing and drained
                self._pending = []
                self._space.notify_all()
            try:
                if self._compactions:
                    for part in _segments(batch):
                        if isinstance(part, CompactionRequest):
                            self._run_compaction(part)
                        else:
                            self._write_records(part)
                else:
                    self._write_records(batch)  # type: ignore[arg-type]
            except BaseException as exc:  # noqa: BLE001 - fail-stop, the error goes to every waiter
                self._fail(exc)
                return

    def _write_records(self, batch: list[Record]) -> None:
        data = self._seal(batch)
        hook = self._fault_hook
        if hook is not None:
            hook("before_write")
        self._write_all(data)
        if self._sync:
            if hook is not None:
                hook("before_sync")
            os.fdatasync(self._fd)
            self._syncs += 1
        self._batches += 1
        self._head = batch[-1].hash
        self._durable_seq = batch[-1].seq
        self._wake(self._durable_seq)

    def _seal(self, batch: list[Record]) -> bytes:
        prev = self._head
        out: list[bytes] = []
        salts = os.urandom(SALT_BYTES * len(batch))
        for i, rec in enumerate(batch):
            try:
                canonical = seal(rec, prev, salts[i * SALT_BYTES : (i + 1) * SALT_BYTES])
            except (TypeError, ValueError) as exc:
                # Keep the seq and the chain: say in the log that this record was rejected.
                self._rejected[rec.seq] = exc
                rec.payload = {"original_type": rec.type, "error": f"{type(exc).__name__}: {exc}"}
                rec.type = "RECORD_REJECTED"
                canonical = seal(rec, prev)
            out.append(encode_line(rec, canonical))
            prev = rec.hash
        return b"".join(out)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self._failed = exc
            self._pending = []
            self._space.notify_all()
            reqs, self._compactions = self._compactions, []
        log.error("WAL %s failed, refusing further records: %r", self.path, exc)
        err = WALError(f"WAL {self.path!r} failed: {exc}")
        err.__cause__ = exc
        for r in reqs:
            if not r.future.done():
                r.future.set_exception(err)
        self._wake(None)

    def _wake(self, durable: int | None) -> None:
        """Complete waiters up to ``durable`` (all of them with an error if None)."""
        by_loop: dict[Any, list[Any]] = {}
        with self._wlock:
            w = self._waiters
            while w and (durable is None or w[0][0] <= durable):
                _, _, loop, fut = heapq.heappop(w)
                if loop is None:
                    fut.set()
                else:
                    by_loop.setdefault(loop, []).append(fut)
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, futs)
            except RuntimeError:
                pass  # the loop is closed: nobody is waiting any more

    # ------------------------------------------------------------------ fences

    def _check(self, seq: int) -> None:
        exc = self._rejected.get(seq)
        if exc is not None:
            raise WALError(f"WAL {self.path!r}: record seq {seq} was rejected: {exc}") from exc
        if self._failed is not None and seq > self._durable_seq:
            raise WALError(
                f"WAL {self.path!r}: the write of seq {seq} failed: {self._failed}"
            ) from self._failed

    def _stalled(self, seq: int, timeout: float) -> WALStalled:
        return WALStalled(
            f"WAL {self.path!r}: seq {seq} not durable within {timeout}s (durable up to "
            f"{self._durable_seq}, {len(self._pending)} queued); the disk may be wedged or failing"
        )

    async def barrier(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """Return once every record up to ``seq`` is fdatasync'ed; see the class doc."""
        if seq is None:
            seq = self._next_seq - 1
        if seq <= self._durable_seq:
            if self._rejected:
                self._check(seq)
            return
        if self._failed is not None:
            self._check(seq)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._wlock:
            waiting = seq > self._durable_seq and self._failed is None
            if waiting:
                heapq.heappush(self._waiters, (seq, next(self._wcount), loop, fut))
        if waiting:
            limit = self._stall_timeout if timeout is None else timeout
            timer = loop.call_later(limit, _expire, fut, self._stalled(seq, limit))
            try:
                await fut
            finally:
                timer.cancel()
        self._check(seq)

    def barrier_sync(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """``barrier`` for threads and synchronous code."""
        if seq is None:
            seq = self._next_seq - 1
        ev = threading.Event()
        with self._wlock:
            if seq > self._durable_seq and self._failed is None:
                heapq.heappush(self._waiters, (seq, next(self._wcount), None, ev))
            else:
                ev.set()
        limit = self._stall_timeout if timeout is None else timeout
        if not ev.wait(limit):
            raise self._stalled(seq, limit)
        self._check(seq)

    # ------------------------------------------------------------------ compaction

    async def compact(
        self, keep_sagas: Collection[str] | None = None, *, timeout: float | None = None
    ) -> CompactionReport:
        """Rewrite the log keeping unresolved sagas, with a chained attestation of what left.

        See ``BaseWAL.compact``. Atomic: the log on disk is the old file or the new one,
        never a mix. Raises ``ConfigurationError`` for a log that is not a regular file.
        """
        if not self._regular:
            raise ConfigurationError(f"WAL {self.path!r} is not a regular file; it cannot be compacted")
        with self._lock:
            if self._failed is not None:
                raise WALError(f"WAL {self.path!r} failed earlier: {self._failed}") from self._failed
            if self._closing:
                raise WALClosed(f"WAL {self.path!r} is closed; open a new FileWAL to compact")
            if len(self._pending) >= self._max_pending:
                self._wait_for_space()
            req = CompactionRequest(self._next_seq, keep_sagas)
            self._next_seq += 1
            self._compactions.append(req)
            self._pending.append(req)
            self._work.notify()
        fut = asyncio.wrap_future(req.future)
        if timeout is None:
            return await fut
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            fut.add_done_callback(_consume)
            raise WALStalled(
                f"WAL {self.path!r}: compaction (seq {req.seq}) did not finish within {timeout}s; "
                f"it goes on in the background and its attestation will be seq {req.seq}"
            ) from None

    def _own_records(self) -> Iterator[tuple[int, str, bytes, Record]]:
        """``(lineno, location, line, record)`` of the open file, through our own fd."""
        with open(os.dup(self._fd), "rb") as f:
            f.seek(0)
            for lineno, line in enumerate(f, 1):
                if not line.endswith(b"\n"):
                    return
                location = f"{self.path} line {lineno}"
                yield lineno, location, line, decode_line(line, location)

    def _run_compaction(self, req: CompactionRequest) -> None:
        hook = self._fault_hook
        tmp = f"{self.path}.compact-{time.time_ns()}"
        fd = -1
        try:
            if hook is not None:
                hook("before_compact")
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
                att_line = encode_line(att, seal(att, self._head))
            else:
                fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                with open(fd, "wb", closefd=False) as out:
                    for _n, _loc, line, rec in self._own_records():
                        if plan.offer(rec):
                            out.write(line)
                    att = plan.attestation(req.seq)
                    att_line = encode_line(att, seal(att, self._head))
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
            self._compaction_aborted(req, exc)
            return
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
        self._batches += 1
        self._head = att.hash
        self._durable_seq = req.seq
        with self._lock:
            self._compactions.remove(req)
        req.future.set_result(plan.report(req.seq))
        self._wake(req.seq)

    def _compaction_aborted(self, req: CompactionRequest, exc: BaseException) -> None:
        """Nothing changed: write COMPACTION_FAILED under the reserved seq (no gap)."""
        log.warning("WAL %s: compaction aborted, log unchanged: %r", self.path, exc)
        rec = req.failed_record(f"{type(exc).__name__}: {exc}")
        self._write_records([rec])
        with self._lock:
            self._compactions.remove(req)
        err = CompactionAborted(f"WAL {self.path!r}: compaction failed, the log is unchanged: {exc}")
        err.__cause__ = exc
        req.future.set_exception(err)

    # ------------------------------------------------------------------ reading

    def iter_records(self) -> Iterator[Record]:
        """Every complete record on disk, in order; raises ``WALCorrupt`` on damage."""
        for _location, item in iter_file_records(self.path):
            if isinstance(item, WALCorrupt):
                raise item
            yield item

    async def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        async for rec in self.read_since(0, page_size=page_size):
            yield rec

    async def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        n = 0
        for rec in self.iter_records():
            if rec.seq > seq:
                yield rec
                n += 1
                if n % page_size == 0:
                    await asyncio.sleep(0)  # one page at a time: let other tasks run

    # ------------------------------------------------------------------ lifecycle

    def stats(self) -> WALStats:
        return WALStats(
            backend="file",
            durability=self.durability if self._sync else "none: sync=False (scratch log)",
            appended_seq=self._next_seq - 1,
            durable_seq=self._durable_seq,
            pending=len(self._pending),
            batches=self._batches,
            syncs=self._syncs,
            failed=None if self._failed is None else repr(self._failed),
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, *, timeout: float = 10.0) -> None:
        """Write what is queued (bounded by ``timeout``), then release the file.

        Raises ``WALStalled`` if the queue could not be written in time (the flusher keeps
        trying in the background; the file stays open) and ``WALError`` if it failed.
        """
        if self._closed:
            return
        with self._lock:
            self._closing = True
            self._work.notify()
        self._flusher.join(timeout)
        if self._flusher.is_alive():
            raise WALStalled(
                f"WAL {self.path!r}: close() could not write {len(self._pending)} queued "
                f"records within {timeout}s; the disk may be wedged"
            )
        self._closed = True
        _open_wals.discard(self)
        try:
            os.close(self._fd)  # releases the flock
        finally:
            self._wake(None)
        if self._failed is not None:
            raise WALError(f"WAL {self.path!r} failed before close: {self._failed}") from self._failed

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


def _segments(batch: list[Record | CompactionRequest]) -> Iterator[list[Record] | CompactionRequest]:
    """Split a batch at compaction requests, keeping the order."""
    run: list[Record] = []
    for item in batch:
        if isinstance(item, CompactionRequest):
            if run:
                yield run
                run = []
            yield item
        else:
            run.append(item)
    if run:
        yield run


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
    p = os.fspath(path)
    try:
        f = open(p, "rb")
    except FileNotFoundError as exc:
        raise ConfigurationError(f"WAL file {p!r} does not exist; check --wal-path") from exc
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                return  # torn final fragment: tolerated, never acknowledged
            location = f"{p} line {lineno}"
            if not line.strip():
                yield location, WALCorrupt(f"{location}: empty line inside the log", location=location)
                continue
            try:
                yield location, decode_line(line, location)
            except WALCorrupt as exc:
                yield location, exc


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


def _resolve(futs: list[asyncio.Future[None]]) -> None:
    for f in futs:
        if not f.done():
            f.set_result(None)


def _expire(fut: asyncio.Future[None], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


_open_wals: weakref.WeakSet[FileWAL] = weakref.WeakSet()


@atexit.register
def _close_open_wals() -> None:
    # A normal interpreter exit writes what was queued (REVERSIBLE records wait for nobody).
    for wal in list(_open_wals):
        try:
            wal.close(timeout=5.0)
        except Exception as exc:  # noqa: BLE001 - at exit, report and keep closing the rest
            log.error("closing WAL %s at exit failed: %r", wal.path, exc)


def _consume(fut: asyncio.Future[CompactionReport]) -> None:
    # A compaction the caller stopped waiting for: its outcome is logged, not lost unread.
    if not fut.cancelled():
        fut.exception()
