"""The writer machinery the server backends share: queue, private flusher, fences, fail-stop.

It is FileWAL's contract with the I/O left to a subclass (``_write_batch``):
- ``append`` only queues (under a lock, no I/O); over ``max_pending`` the RAISE policy
  raises ``WALBackpressure``, BLOCK waits up to ``stall_timeout`` then raises
  ``WALStalled``. Nothing is dropped silently.
- A private flusher thread takes up to ``max_batch`` queued records, seals them into the
  hash chain (one ``os.urandom`` for the batch's salts) and hands them to
  ``_write_batch`` as one unit: group commit, one server round trip per batch. The
  caller's event loop never does the I/O and a slow caller cannot starve the flusher.
- The flusher is woken by demand, not by every record: a ``barrier`` (or close, compact,
  a full batch) wakes it at once; the first record of a batch wakes it to start its
  ``linger``, so records nobody waits for (REVERSIBLE steps) are written within ``linger``
  seconds of the first of them. A burst of fast steps costs one wake-up per batch.
- A fence joins its event loop's list of waiting fences without a lock (one dict per
  writer, one list per loop); a completed batch hands each loop its whole list in one
  ``call_soon_threadsafe``, and a fence woken by a batch that ended before its record
  waits for the next. One watchdog thread per writer watches each loop's earliest
  deadline and stalls the writer when it passes (no timer per fence on the caller's
  loop), so a wedged device or server never hangs a caller past its bound (plus the
  watchdog's tick). Thread fences (``barrier_sync``) wait on an event in a heap.
- Fail-stop: a batch that fails fails the writer. Every waiter and every later caller gets
  ``WALError`` chained to the real error, with no password in any message. Whether the
  failed batch reached the server is unknown (in doubt); a new writer opened with the same
  writer id reads the server's tail and continues from what actually landed.
- A stall fails the writer too: the first fence that passes its bound (``barrier``,
  ``barrier_sync``, a BLOCK wait for room, ``close``) raises ``WALStalled`` and from then on
  every waiter, append and fence raises ``WALStalled`` at once, chained to that first one;
  nothing waits a second bound on a device already known to be wedged. Records still
  queued are never written; the batch the flusher is stuck in is in doubt (if the device
  comes back it lands, and fences up to it then return: they are true). ``close`` of a
  stalled writer returns at once; the flusher releases the file or connection when the
  write it is stuck in returns. (A compaction's own ``timeout`` is not a stall: it goes on.)
- A record whose payload cannot be encoded becomes a ``RECORD_REJECTED`` record under the
  same ``seq`` (no gap) and its waiters get the encoding error.
- ``compact()`` queues a request under the next ``seq``; the flusher runs it in log order,
  between batches, so a record appended meanwhile is written after the attestation.
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import dataclasses
import heapq
import itertools
import logging
import operator
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import Any

from .. import observe as _observe
from .._identity import process_identity
from ..chain import reject_record, seal, seal_batch
from ..errors import (
    ConfigurationError,
    WALBackpressure,
    WALClosed,
    WALCorrupt,
    WALError,
    WALStalled,
)
from ..records import GENESIS, Record
from .base import Backpressure, BaseWAL, FaultHook, WALStats
from .compaction import CompactionAborted, CompactionReport, CompactionRequest
from .prepared import PreparedPayload
from .urls import Scrubber

log = logging.getLogger("agent_saga.wal")
_Future = asyncio.Future
_running_loop = asyncio.get_running_loop
_monotonic = time.monotonic
_time_ns = time.time_ns
_new = object.__new__

# ``_queue`` builds each Record by setting every field's slot itself (a writer makes one
# per append: no ``__init__`` frame); it refuses to import if the fields or their checks
# change, so an update cannot leave a field unset.
_RECORD_FIELDS = ("type", "saga", "step", "payload", "seq", "ts", "salt", "digest", "prev", "hash",
                  "redacted", "extra", "encode")
if tuple(f.name for f in dataclasses.fields(Record)) != _RECORD_FIELDS or "__post_init__" in vars(Record):
    raise TypeError("Record's fields or checks changed: update BatchingWAL._queue, which builds it")

Sealed = list[tuple[Record, str]]  # records with their canonical payload text


class SealedLines(list[tuple[Record, str]]):
    """A sealed batch that also carries each record's line (``encode_line`` without its
    newline, as text), built as the batch was sealed: for a writer of lines
    (``BatchingWAL._writes_lines``)."""

    __slots__ = ("lines",)

    def __init__(self, sealed: Sealed, lines: list[str]) -> None:
        super().__init__(sealed)
        self.lines = lines


def default_writer_id() -> str:
    """``<host>-<pid>-<random>``: unique per process. Pass ``writer=`` to continue a chain."""
    return process_identity().unique_id()


class BatchingWAL(BaseWAL):
    """Base for backends whose durable step is one server round trip per batch."""

    backend = "?"
    #: ``_seal`` also builds each record's line, handed to ``_write_batch`` in a ``SealedLines``
    _writes_lines = False

    def __init__(
        self,
        *,
        name: str,
        scrub: Scrubber,
        max_pending: int,
        backpressure: Backpressure,
        stall_timeout: float,
        max_batch: int,
        fault_hook: FaultHook | None,
    ) -> None:
        if max_pending < 1:
            raise ConfigurationError(f"max_pending must be >= 1, got {max_pending}")
        if max_batch < 1:
            raise ConfigurationError(f"max_batch must be >= 1, got {max_batch}")
        if stall_timeout <= 0:
            raise ConfigurationError(f"stall_timeout must be > 0 seconds, got {stall_timeout}")
        self.name = name  # password-free: safe in messages and logs
        self._scrub = scrub
        self._max_pending = max_pending
        self._max_batch = max_batch
        self._backpressure = Backpressure(backpressure)
        self._stall_timeout = stall_timeout
        self._fault_hook = fault_hook

        self._lock = threading.Lock()
        self._work = _Bell(self._lock)  # the flusher sleeps here (see _Bell)
        self._space = _Room(self._lock)  # callers wait here for room (Backpressure.BLOCK)
        self._pending: deque[Record | CompactionRequest] = deque()
        self._closing = False
        self._closed = False
        self._failed: BaseException | None = None
        self._failed_msg = ""
        self._rejected: dict[int, BaseException] = {}
        self._current: CompactionRequest | None = None

        self._groups: dict[Any, _Waiters] = {}  # event loop -> its fences waiting now
        self._wlock = threading.Lock()  # thread fences (barrier_sync) only
        self._waiters: list[tuple[int, int, threading.Event]] = []
        self._wcount = itertools.count()
        self._compactions = 0  # compaction requests in self._pending (under self._lock)
        self._batches = 0
        self._head = ""
        self._next_seq = 1
        self._durable_seq = 0
        self._flusher: threading.Thread | None = None
        self._want = 0  # the highest seq a fence asked for: the flusher writes up to it now
        self._kick_loop: Any = None  # the loop with a flusher wake-up queued (see _ask)
        self._kick_seq = 0
        self._lone = False  # the last batch's fences were one fence of one loop (see _ask)
        self._linger = 0.005  # how long records nobody waits for may sit in the queue
        self._tick = min(1.0, stall_timeout / 4)  # the watchdog's period
        self._wd_wake = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._flusher_done = False  # the flusher returned (under self._lock)
        self._release_on_exit = False  # a stalled close() left the release to the flusher

    def _start(self, head: str, last_seq: int) -> None:
        """Begin after the subclass found the chain head (``last_seq`` 0 for a new chain)."""
        self._head = head
        self._next_seq = last_seq + 1
        self._durable_seq = last_seq
        self._flusher = threading.Thread(
            target=self._run, name=f"agent-saga-wal-flusher:{self.backend}", daemon=True
        )
        self._flusher.start()
        self._watchdog = threading.Thread(
            target=self._watch, name=f"agent-saga-wal-watchdog:{self.backend}", daemon=True
        )
        self._watchdog.start()
        _open_wals.add(self)

    def _start_from(self, tail: tuple[str, Record | WALCorrupt] | None) -> None:
        """``_start`` from the writer's last stored record (None: a new chain). A last record
        that cannot be read releases the connection and refuses the open: appending after
        an unknown head would hide the damage."""
        head, last_seq = GENESIS, 0
        if tail is not None:
            location, item = tail
            if isinstance(item, WALCorrupt):
                self._release()
                raise WALCorrupt(
                    f"{location} (the writer's last record) cannot be read: {item.message}. "
                    f"Run `agent-saga verify` on this log; a writer cannot continue a chain "
                    f"whose head it cannot read",
                    location=location,
                ) from item
            head, last_seq = item.hash, item.seq
        self._start(head, last_seq)

    # ------------------------------------------------------------------ for subclasses

    @abc.abstractmethod
    def _write_batch(self, sealed: Sealed) -> None:
        """Make ``sealed`` durable in one unit (flusher thread); raise on any failure."""

    @abc.abstractmethod
    def _compact_now(self, req: CompactionRequest, prev: str) -> tuple[CompactionReport, str]:
        """Run ``req`` (flusher thread): rewrite and write the attestation sealed on
        ``prev`` atomically; return the report and the attestation's hash. Raise
        ``CompactionAborted`` if nothing changed, anything else if the outcome is unknown."""

    @abc.abstractmethod
    def _release(self) -> None:
        """Close connections (after the flusher stopped)."""

    # ------------------------------------------------------------------ writing

    def _failure(self, what: str) -> WALError:
        """The error for ``what`` on a failed writer, of the class of the first failure
        (a stalled writer keeps raising ``WALStalled``), chained to it."""
        kind = WALStalled if isinstance(self._failed, WALStalled) else WALError
        err = kind(f"WAL {self.name}: {what}: {self._failed_msg}")
        err.__cause__ = self._failed
        return err

    def _refuse(self) -> None:
        # Called with self._lock held.
        if self._failed is not None:
            state = "stalled" if isinstance(self._failed, WALStalled) else "failed"
            how = (
                "close it and open a new FileWAL on the file" if self.backend == "file"
                else f"open a new {type(self).__name__} with the same writer id"
            )
            raise self._failure(
                f"{state} earlier and accepts no records; {how} to continue from what the "
                f"{'disk' if self.backend == 'file' else 'server'} holds"
            )
        if self._closing:
            raise WALClosed(f"WAL {self.name} is closed; open a new {type(self).__name__} to append")
        if len(self._pending) >= self._max_pending:
            self._wait_for_space()

    def append(
        self,
        type: str,
        saga: str,
        step: str | None = None,
        payload: dict[str, Any] | None = None,
    ) -> int:
        """Queue a record and return its ``seq``; never waits for the server."""
        return self._queue(type, saga, step, payload, None)

    def append_prepared(self, type: str, saga: str, step: str | None, prepared: PreparedPayload) -> int:
        """``append`` of a payload already encoded and scrubbed by its producer: the seal
        takes ``prepared.text()`` as the canonical payload (see ``wal.prepared``)."""
        return self._queue(type, saga, step, None, prepared.builder())  # built by the flusher, in _seal

    def _queue(self, type: str, saga: str, step: str | None = None, payload: dict[str, Any] | None = None,
               encode: Callable[[], str] | None = None) -> int:
        # ``append``'s signature and more: the engine calls this as its ``append``.
        with self._lock:
            pending = self._pending
            if self._failed is not None or self._closing or len(pending) >= self._max_pending:
                self._refuse()
                # A wait for room let the flusher take the queue as its batch (no copy):
                # append to the queue it left, never to the batch it is sealing.
                pending = self._pending
            seq = self._next_seq
            self._next_seq = seq + 1
            # = Record(type, saga, step, payload, seq, ts, encode=encode), its slots set
            # here without the dataclass's __init__ frame (pinned: see _RECORD_FIELDS).
            rec = _new(Record)
            rec.type = type
            rec.saga = saga
            rec.step = step
            rec.payload = payload
            rec.seq = seq
            rec.ts = _time_ns() // 1000
            rec.salt = None
            rec.digest = rec.prev = rec.hash = ""
            rec.redacted = False
            rec.extra = {}
            rec.encode = encode
            pending.append(rec)
            n = len(pending)
            if n == 1 or n >= self._max_batch:
                # The first record of a batch starts the flusher's linger (on an empty queue
                # it sleeps with no clock to keep); a full batch goes now. Otherwise nothing:
                # a fence asks for its record, the linger writes the rest.
                self._work.notify()
        return seq

    def _wait_for_space(self) -> None:
        # Called with self._lock held.
        if self._backpressure is Backpressure.RAISE:
            raise WALBackpressure(
                f"WAL {self.name} has {len(self._pending)} records waiting to be written "
                f"(max_pending={self._max_pending}); the server is not keeping up. Slow the "
                f"caller, raise max_pending, or choose Backpressure.BLOCK"
            )
        deadline = time.monotonic() + self._stall_timeout
        while len(self._pending) >= self._max_pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stall = WALStalled(
                    f"WAL {self.name}: no room for a record within {self._stall_timeout}s "
                    f"(max_pending={self._max_pending}); the server may be wedged"
                )
                reqs = self._stall_locked(stall)
                if reqs is not None:  # lock order _lock -> _wlock is the only one used
                    self._fail_requests(reqs)
                    self._wake(None)
                raise stall
            self._space.wait(remaining)
            if self._failed is not None:
                raise self._failure("failed while this record waited for room")

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._lock:
                self._flusher_done = True
                release = self._release_on_exit
            if release:
                self._release_quietly()

    def _loop(self) -> None:
        while True:
            req: CompactionRequest | None = None
            batch: Sequence[Record] = ()
            with self._lock:
                while True:
                    if self._failed is not None:
                        return  # stalled meanwhile: fail-stop, nothing more is written
                    pending = self._pending
                    if not pending:
                        if self._closing:
                            return  # closing and drained
                        self._work.wait(self._linger * 20)
                        continue
                    if (
                        self._closing
                        or pending[0].seq <= self._want
                        or len(pending) >= self._max_batch
                        or not self._work.wait(self._linger)
                    ):
                        break
                if isinstance(pending[0], CompactionRequest):
                    req = pending.popleft()  # type: ignore[assignment]
                    self._compactions -= 1
                elif not self._compactions and len(pending) <= self._max_batch:
                    # The whole queue is one batch: hand it over without copying it
                    # record by record under the lock the callers' appends take.
                    batch = pending  # type: ignore[assignment]
                    self._pending = deque()
                else:
                    part: list[Record] = []
                    while pending and len(part) < self._max_batch:
                        item = pending[0]
                        if isinstance(item, CompactionRequest):
                            break
                        part.append(item)
                        pending.popleft()
                    batch = part
                self._space.notify_all()
            try:
                if req is not None:
                    self._run_compaction(req)
                else:
                    self._flush(batch)
            except BaseException as exc:  # noqa: BLE001 - fail-stop, the error goes to every waiter
                self._fail(exc)
                return

    def _flush(self, batch: Sequence[Record]) -> None:
        self._head = self._commit(batch)
        self._batches += 1
        self._durable_seq = batch[-1].seq
        self._wake(self._durable_seq)

    def _commit(self, batch: Sequence[Record]) -> str:
        """Seal ``batch`` onto ``self._head`` and make it durable (flusher thread); return
        the new head. Records it rejects are in ``self._rejected`` when it returns. (A
        writer that seals elsewhere, FileWAL's sealer process, overrides this.)"""
        sealed = self._seal(batch)
        hook = self._fault_hook
        if hook is not None:
            hook("before_write")
        self._write_batch(sealed)
        if hook is not None:
            hook("after_write")
        return batch[-1].hash

    def _seal(self, batch: Sequence[Record]) -> Sealed:
        if not self._writes_lines:
            return seal_batch(batch, self._head, self._reject)
        lines: list[str] = []
        return SealedLines(seal_batch(batch, self._head, self._reject, lines), lines)

    def _reject(self, rec: Record, exc: Exception) -> None:
        # Keep the seq and the chain: say in the log that this record was rejected.
        self._rejected[rec.seq] = exc
        reject_record(rec, exc)

    def _run_compaction(self, req: CompactionRequest) -> None:
        self._current = req
        hook = self._fault_hook
        if hook is not None:
            hook("before_compact")
        try:
            report, head = self._compact_now(req, self._head)
        except CompactionAborted as exc:
            # Nothing changed: say so in the log under the reserved seq, and carry on.
            rec = req.failed_record(self._scrub(str(exc)))
            canonical = seal(rec, self._head)
            self._write_batch([(rec, canonical)])
            self._batches += 1
            self._head = rec.hash
            self._durable_seq = req.seq
            self._current = None
            req.future.set_exception(exc)
            self._wake(req.seq)
            log.warning("WAL %s: compaction aborted, log unchanged: %s", self.name, self._scrub(str(exc)))
            return
        self._batches += 1
        self._head = head
        self._durable_seq = req.seq
        self._current = None
        req.future.set_result(report)
        self._wake(req.seq)

    def _fail(self, exc: BaseException) -> None:
        msg = self._scrub(f"{type(exc).__name__}: {exc}")
        with self._lock:
            if self._failed is not None:
                # Already stalled: the write it was stuck in ended badly. The first cause stays.
                log.error("WAL %s: the write in doubt since the stall failed: %s", self.name, msg)
                return
            reqs = self._mark_failed_locked(exc, msg)
        self._fail_requests(reqs)
        log.error("WAL %s failed, refusing further records: %s", self.name, msg)
        self._wake(None)

    def _mark_failed_locked(self, exc: BaseException, msg: str) -> list[CompactionRequest]:
        """Fail-stop (called with ``self._lock`` held): refuse from now on, drop the queue,
        return the compaction requests to fail."""
        self._failed = exc
        self._failed_msg = msg
        obs = _observe.current
        if obs is not None:  # a counter's increment: quick enough to make under the lock
            _observe.safely(obs.wal_failed, self.name, "stalled" if isinstance(exc, WALStalled) else "failed")
        reqs = [x for x in self._pending if isinstance(x, CompactionRequest)]
        if self._current is not None:
            reqs.append(self._current)
        self._pending.clear()
        self._compactions = 0
        self._space.notify_all()
        return reqs

    def _fail_requests(self, reqs: list[CompactionRequest]) -> None:
        err = self._failure("failed")
        for r in reqs:
            if not r.future.done():
                r.future.set_exception(err)

    def _stall(self, stall: WALStalled) -> None:
        """A fence passed its bound: the device or server is wedged. Fail-stop, so every
        other waiter and every later call raises at once instead of waiting its own bound."""
        with self._lock:
            reqs = self._stall_locked(stall)
        if reqs is not None:
            self._fail_requests(reqs)
            self._wake(None)

    def _stall_locked(self, stall: WALStalled) -> list[CompactionRequest] | None:
        if self._failed is not None:
            return None
        msg = self._scrub(str(stall))
        own = f"WAL {self.name}: "
        reqs = self._mark_failed_locked(stall, msg[len(own):] if msg.startswith(own) else msg)
        log.error(
            "WAL %s stalled, refusing further records (%d durable, the batch in flight is in "
            "doubt): %s", self.name, self._durable_seq, self._failed_msg,
        )
        return reqs

    def _wake(self, durable: int | None) -> None:
        """Wake the fences after a batch (``durable`` its last seq; None: all of them, to
        raise). Called after ``_durable_seq`` or ``_failed`` changed. Every loop's fences
        of this moment are handed over in one list and one ``call_soon_threadsafe``
        (``_resolve`` sorts them on the loop). Notes whether that was one fence alone,
        which makes the next fence ask at once (see ``_ask``)."""
        groups = self._groups
        if groups:
            loops = list(groups)  # (empty if a _wake of another thread took them meanwhile)
            if len(loops) == 1:
                only = groups.get(loops[0])
                self._lone = only is not None and len(only.fences) == 1
            else:
                self._lone = False
            for loop in loops:
                group = groups.pop(loop, None)
                if group is None:
                    continue
                try:
                    loop.call_soon_threadsafe(self._resolve, loop, group, durable is None)
                except RuntimeError:
                    pass  # the loop is closed: nobody is waiting any more
        if self._waiters:
            with self._wlock:
                w = self._waiters
                while w and (durable is None or w[0][0] <= durable):
                    heapq.heappop(w)[2].set()

    def _resolve(self, loop: asyncio.AbstractEventLoop, group: _Waiters, everyone: bool) -> None:
        """On ``loop``, after a batch: settle the fences of ``group`` whose outcome is known
        (durable, rejected; all of them if ``everyone``: the writer failed or closed) and
        put the others back with the loop's fences waiting now, so no fence is woken before
        its record is durable. A fence's future gets its own outcome: ``None``, or the error
        its ``barrier`` raises."""
        durable = self._durable_seq
        if group.top <= durable and not self._rejected:
            for fence in group.fences:  # the usual case: the batch covered every fence
                fut = fence[1]
                if not fut.done():  # else cancelled meanwhile
                    fut.set_result(None)
            return
        everyone = everyone or self._failed is not None or self._closed
        clean = not self._rejected
        later: list[Fence] = []
        for fence in group.fences:
            fut = fence[1]
            if fut.done():
                continue  # cancelled meanwhile
            if fence[0] <= durable and clean:
                fut.set_result(None)
            elif everyone or fence[0] <= durable:
                self._settle(fence)
            else:
                later.append(fence)
        if not later:
            return
        groups = self._groups
        again = groups.get(loop)
        if again is None:
            again = groups.setdefault(loop, _Waiters())
        # = again.add(fence) for each, in C: the highest seq, and the first of the
        # earliest deadline when it is earlier than the group's.
        again.fences.extend(later)
        top = max(later, key=_SEQ_OF)[0]
        if top > again.top:
            again.top = top
        first = min(later, key=_DEADLINE_OF)
        if first[2] < again.deadline:
            again.deadline, again.seq, again.limit = first[2], first[0], first[3]
        # A batch that ended meanwhile may have taken ``again`` before these joined it.
        durable = self._durable_seq
        failed = self._failed is not None or self._closed
        if failed or min(later, key=_SEQ_OF)[0] <= durable:
            for fence in later:
                if (failed or fence[0] <= durable) and not fence[1].done():
                    self._settle(fence)

    def _settle(self, fence: Fence) -> None:
        """Give a fence whose outcome is known its outcome (on its loop)."""
        exc = self._outcome(fence[0], fence[2], fence[3])
        if exc is None:
            fence[1].set_result(None)
        else:
            fence[1].set_exception(exc)

    def _outcome(self, seq: int, deadline: float, limit: float) -> BaseException | None:
        """What a fence for ``seq`` (bounded by ``limit``, until ``deadline``) returns once
        woken: None (durable) or the error to raise."""
        durable = self._durable_seq
        failed = self._failed
        if self._rejected or failed is not None:
            if isinstance(failed, WALStalled) and seq > durable and _monotonic() >= deadline:
                return self._stalled(seq, limit)  # this fence is one that passed its bound
            err = self._checked(seq)
            if err is not None:
                return err
        if seq > durable and failed is None:
            # Woken by close() with this seq never written (one that was not appended):
            # never report it durable.
            return WALClosed(
                f"WAL {self.name} closed before seq {seq} was durable (durable up to {durable})"
            )
        return None

    # ------------------------------------------------------------------ fences

    def _check(self, seq: int) -> None:
        err = self._checked(seq)
        if err is not None:
            raise err

    def _checked(self, seq: int) -> WALError | None:
        """The error a fence for ``seq`` raises now it was woken: its record was rejected,
        or the writer failed before writing it; else None."""
        exc = self._rejected.get(seq)
        if exc is not None:
            err = WALError(f"WAL {self.name}: record seq {seq} was rejected: {exc}")
            err.__cause__ = exc
            return err
        if self._failed is not None and seq > self._durable_seq:
            return self._failure(f"seq {seq} is not durable and will not be written")
        return None

    def _stalled(self, seq: int, timeout: float) -> WALStalled:
        return WALStalled(
            f"WAL {self.name}: seq {seq} not durable within {timeout}s (durable up to "
            f"{self._durable_seq}, {len(self._pending)} queued); the "
            f"{'disk' if self.backend == 'file' else 'server'} may be wedged or unreachable"
        )

    async def barrier(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """Return once every record up to ``seq`` is durable in this backend's class."""
        # This class's fence, not ``self.fence``: a subclass that overrides ``barrier`` has
        # its ``barrier`` as its fence (``BaseWAL.fence``), and calls this one.
        waiter = BatchingWAL.fence(self, self._next_seq - 1 if seq is None else seq, timeout)
        if waiter is not None:
            await waiter

    def fence(self, seq: int, timeout: float | None = None) -> Awaitable[None] | None:
        """``barrier`` without its coroutine (the engine awaits this directly): None if
        ``seq`` is durable already, else what to await, the fence's own future, which
        ``_resolve`` settles with this fence's outcome (durable: None; rejected, failed,
        stalled past this fence's bound, closed: the error). Raises at once what it can
        tell now (rejected, or a failed writer). The future is this fence's alone:
        ``Task.cancel`` cancels the future its task awaits, so a future shared by several
        fences would let one cancelled step wake every other one."""
        if seq <= self._durable_seq:
            if self._rejected:
                self._check(seq)
            return None
        if self._failed is not None:
            self._check(seq)
        loop = _running_loop()
        if seq > self._want:
            if self._kick_loop is loop:  # = self._ask(loop, seq), inline: asked this turn
                if seq > self._kick_seq:
                    self._kick_seq = seq
            else:
                self._ask(loop, seq)
        limit = self._stall_timeout if timeout is None else timeout
        if limit < self._tick * 4:
            self._tighten(limit)
        deadline = _monotonic() + limit
        # Join this loop's fences first, then look: a batch that completes in between
        # either sees this fence in the list or left its seq durable. The waiter is a
        # C ``asyncio.Future``, built without ``loop.create_future``'s Python frame.
        fut: asyncio.Future[None] = _Future(loop=loop)
        fence: Fence = (seq, fut, deadline, limit)
        groups = self._groups
        group = groups.get(loop)
        if group is None:
            group = groups.setdefault(loop, _Waiters())
        group.fences.append(fence)  # = group.add, inline
        if seq > group.top:
            group.top = seq
        if deadline < group.deadline:
            group.deadline, group.seq, group.limit = deadline, seq, limit
        if seq > self._durable_seq and self._failed is None and not self._closed:
            obs = _observe.current
            return fut if obs is None else self._timed(fut, obs)
        # Durable, failed or closed meanwhile: settled here (a later ``_resolve`` skips it).
        fut.set_result(None)
        err = self._outcome(seq, deadline, limit)
        if err is not None:
            raise err
        return None

    async def _timed(self, fut: asyncio.Future[None], obs: Any) -> None:
        t0 = _monotonic()  # when this fence began to wait
        try:
            await fut
        finally:
            _observe.safely(obs.fence_waited, _monotonic() - t0)

    def _ask(self, loop: asyncio.AbstractEventLoop, seq: int) -> None:
        """Ask the flusher for ``seq`` once per turn of ``loop``, not once per fence: the
        fences of every task that runs in this turn wake the flusher once, and go in one
        batch. A fence of another loop meanwhile asks directly. (A lost ask can only delay
        a write by ``linger``; it never makes a fence return early.)

        A fence that follows a batch which held one fence alone (one saga stepping, say)
        asks at once instead: its flusher wakes while the loop ends its turn rather than
        after. If more fences come in that turn they ask too and the next batch, holding
        several, puts the fences back on the once-per-turn ask."""
        kick = self._kick_loop
        if kick is None:
            if self._lone:
                self._demand(seq)
                return
            self._kick_loop = loop
            self._kick_seq = seq
            loop.call_soon(self._kick)
        elif kick is loop:
            if seq > self._kick_seq:
                self._kick_seq = seq
        else:
            self._demand(seq)

    def _kick(self) -> None:
        seq = self._kick_seq
        self._kick_loop = None
        if seq > self._want:
            self._demand(seq)

    def _demand(self, seq: int) -> None:
        """Ask the flusher to write up to ``seq`` now."""
        with self._lock:
            if seq > self._want:
                self._want = seq
                self._work.notify()

    def _tighten(self, limit: float) -> None:
        """Make the watchdog tick often enough for a fence bounded by ``limit`` seconds."""
        self._tick = max(0.005, min(self._tick, limit / 4))
        self._wd_wake.set()

    def _watch(self) -> None:
        """Expire fences past their deadline with ``WALStalled`` (the flusher may be stuck)."""
        while not self._closed:
            self._wd_wake.wait(self._tick)
            self._wd_wake.clear()
            now = time.monotonic()
            # A loop's fences expire together: the first one past its bound stalls the
            # writer (fail-stop), which wakes every fence to raise (see ``barrier``).
            for group in list(self._groups.values()):
                if group.deadline <= now and group.seq > self._durable_seq:
                    self._stall(self._stalled(group.seq, group.limit))
                    break

    def barrier_sync(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """``barrier`` for threads and synchronous code."""
        if seq is None:
            seq = self._next_seq - 1
        if seq > self._want:
            self._demand(seq)
        ev = threading.Event()
        with self._wlock:
            # The thread bounds its own wait; the watchdog leaves it alone.
            heapq.heappush(self._waiters, (seq, next(self._wcount), ev))
        if seq <= self._durable_seq or self._failed is not None:
            ev.set()  # durable (or failed) before the flusher could see this waiter
        limit = self._stall_timeout if timeout is None else timeout
        if not ev.wait(limit):
            stall = self._stalled(seq, limit)
            self._stall(stall)
            raise stall
        self._check(seq)

    # ------------------------------------------------------------------ compaction

    async def compact(
        self, keep_sagas: Collection[str] | None = None, *, timeout: float | None = None
    ) -> CompactionReport:
        """See ``BaseWAL.compact``; runs on the flusher, in log order."""
        with self._lock:
            self._refuse()
            req = CompactionRequest(self._next_seq, keep_sagas)
            self._next_seq += 1
            self._pending.append(req)
            self._compactions += 1
            self._want = max(self._want, req.seq)
            self._work.notify()
        fut = asyncio.wrap_future(req.future)
        if timeout is None:
            return await fut
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            fut.add_done_callback(_consume)
            raise WALStalled(
                f"WAL {self.name}: compaction (seq {req.seq}) did not finish within {timeout}s; "
                f"it goes on in the background and its attestation will be seq {req.seq}"
            ) from None

    # ------------------------------------------------------------------ lifecycle

    def stats(self) -> WALStats:
        """Counters of this WAL (appends, batches, fences, pending)."""
        return WALStats(
            backend=self.backend,
            durability=self.durability,
            appended_seq=self._next_seq - 1,
            durable_seq=self._durable_seq,
            pending=len(self._pending),
            batches=self._batches,
            syncs=self._batches,
            failed=None if self._failed is None else self._failed_msg,
        )

    @property
    def closed(self) -> bool:
        """True once ``close`` completed."""
        return self._closed

    @property
    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last durable record of this writer's chain."""
        return self._durable_seq, self._head

    def close(self, *, timeout: float = 10.0) -> None:
        """Write what is queued (bounded by ``timeout``), then release the connections.

        Raises ``WALStalled`` if the queue could not be written in time (the flusher keeps
        trying in the background) and ``WALError`` if the writer failed.
        """
        if self._closed:
            return
        with self._lock:
            self._closing = True
            self._work.notify()
            if isinstance(self._failed, WALStalled) and not self._flusher_done:
                # Stuck in a write on a wedged device: do not wait a second bound. The
                # flusher releases the file or connection when that write returns.
                self._release_on_exit = True
                self._closed = True
        if self._closed:
            self._wd_wake.set()
            _open_wals.discard(self)
            self._wake(None)
            raise self._failure("stalled before close; nothing queued was written")
        if self._flusher is not None:
            self._flusher.join(timeout)
            if self._flusher.is_alive():
                stall = WALStalled(
                    f"WAL {self.name}: close() could not write {len(self._pending)} queued "
                    f"records within {timeout}s; the server may be wedged"
                )
                self._stall(stall)
                with self._lock:
                    if not self._flusher_done:
                        self._release_on_exit = True
                        self._closed = True
                if self._closed:
                    self._wd_wake.set()
                    _open_wals.discard(self)
                    raise stall
        self._closed = True
        self._wd_wake.set()
        _open_wals.discard(self)
        try:
            self._release()
        finally:
            self._wake(None)
        if self._failed is not None:
            raise self._failure("failed before close")

    def _release_quietly(self) -> None:
        try:
            self._release()
        except Exception as exc:  # noqa: BLE001 - the flusher's last act: report, do not raise
            log.error("WAL %s: releasing after a stalled close failed: %s", self.name, self._scrub(str(exc)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class SharedLogReads:
    """Reads of a log many writers share (RedisWAL, PostgresWAL): every writer's records in
    ``gseq`` order, or one writer's chain, fetched a page at a time off the event loop.

    Needs ``self._log`` with ``pages_since(gseq, page_size)`` (an iterator of pages) and
    ``chain(writer, page_size)`` (``(location, record-or-WALCorrupt)`` pairs), and
    ``self.writer``.
    """

    _log: Any
    writer: str

    async def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every writer's records in ``gseq`` order (see ``read_since``)."""
        async for rec in self.read_since(0, page_size=page_size):
            yield rec

    async def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every writer's records with ``gseq > seq``, merged in ``gseq`` order, fetched
        ``page_size`` at a time off the event loop. ``seq`` is a cursor: pass the ``gseq``
        of the last record read (``BaseWAL.cursor``) to resume."""
        pages = self._log.pages_since(seq, page_size)
        while True:
            page = await asyncio.to_thread(next, pages, None)
            if page is None:
                return
            for rec in page:
                yield rec

    async def read_chain(self, writer: str | None = None, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """One writer's chain (default: this one) in ``seq`` order; raises ``WALCorrupt``."""
        items = self._log.chain(writer or self.writer, page_size)
        while True:
            pair = await asyncio.to_thread(next, items, None)
            if pair is None:
                return
            if isinstance(pair[1], WALCorrupt):
                raise pair[1]
            yield pair[1]


Fence = tuple[int, "asyncio.Future[None]", float, float]  # seq, future, deadline, bound
_SEQ_OF = operator.itemgetter(0)
_DEADLINE_OF = operator.itemgetter(2)


class _Waiters:
    """The fences of one event loop waiting for the next batch, their highest seq, and
    the earliest deadline among them with its fence's seq and bound (for the watchdog)."""

    __slots__ = ("deadline", "fences", "limit", "seq", "top")

    def __init__(self) -> None:
        self.fences: list[Fence] = []
        self.top = 0  # the highest seq among them
        self.deadline = float("inf")
        self.seq = 0
        self.limit = 0.0

    def add(self, fence: Fence) -> None:
        self.fences.append(fence)
        if fence[0] > self.top:
            self.top = fence[0]
        if fence[2] < self.deadline:
            self.deadline, self.seq, self.limit = fence[2], fence[0], fence[3]


class _Bell:
    """What the flusher sleeps on: ``threading.Condition``'s ``wait``/``notify`` for its one
    waiter, without a lock allocated per wait or a waiter list to walk per notify.

    Both are called with ``lock`` held, as a condition's are. ``wait`` releases ``lock``
    while it sleeps and holds it again when it returns: True if rung, False on timeout.
    ``notify`` rings only a sleeper; the flusher looks at the queue under ``lock`` before it
    sleeps, so a ring it does not hear was not needed. A ring that lands just after a wait
    timed out leaves the bell rung: the next wait returns at once, a spurious wake-up,
    which the flusher (like any condition's waiter) answers by looking again.
    """

    __slots__ = ("_bell", "_lock", "asleep")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._bell = threading.Lock()
        self._bell.acquire()  # held: not rung
        self.asleep = False

    def wait(self, timeout: float) -> bool:
        self.asleep = True
        self._lock.release()
        try:
            return self._bell.acquire(True, timeout)
        finally:
            self._lock.acquire()
            self.asleep = False

    def notify(self) -> None:
        if self.asleep:
            self.asleep = False  # one ring per sleep
            try:
                self._bell.release()
            except RuntimeError:
                pass  # still rung from a ring that came after a timed-out wait


class _Room(threading.Condition):
    """The condition a caller over ``max_pending`` waits on for room: ``notify_all`` with
    nobody waiting (every batch the flusher takes, unless the queue is full) returns at
    once instead of taking the condition's Python path."""

    def notify_all(self) -> None:
        if self._waiters:  # type: ignore[attr-defined]  # threading.Condition's own list
            super().notify_all()


_open_wals: weakref.WeakSet[BatchingWAL] = weakref.WeakSet()


@atexit.register
def _close_open_wals() -> None:
    # A normal interpreter exit writes what was queued (REVERSIBLE records wait for nobody).
    for wal in list(_open_wals):
        try:
            wal.close(timeout=5.0)
        except Exception as exc:  # noqa: BLE001 - at exit, report and keep closing the rest
            log.error("closing WAL %s at exit failed: %s", wal.name, exc)


def _consume(fut: asyncio.Future[CompactionReport]) -> None:
    # A compaction the caller stopped waiting for: its outcome is logged, not lost unread.
    if not fut.cancelled():
        fut.exception()
