"""Saga leases: a running saga says, in its own log, that its owner is alive.

A recovery daemon may take over a saga only once its lease has expired (a PID would lie,
a lease does not). The rule both sides share:

    lease_seconds  = the last SAGA_LEASE record's ``lease_seconds``, else DEFAULT_LEASE_SECONDS
    lease_until    = ts of the saga's last record written by its owner + lease_seconds

"Written by its owner" is every record of the saga except those a recovery daemon wrote
(their payload carries ``recovered_by``). SAGA_STARTED is the first grant, so a saga with
the default lease costs no extra record; ``saga_scope(lease_seconds=...)`` with another
value writes one SAGA_LEASE right after SAGA_STARTED.

While the saga runs, one process-wide daemon thread appends ``SAGA_LEASE
{"lease_seconds": L}`` every L/3 seconds for each live saga, so the lease outlives a long
step, a slow gate or a human approval. The step hot path is untouched: registering costs
one lock and one heap push when the saga starts, unregistering one dict removal when it
ends.

Invariants:
- Renewal runs on its own thread, not on the event loop: a busy loop does not make a live
  process look dead. A process that is gone renews nothing, whatever its PID.
- A renewal is a queued append (it is written with the next batch, never waited for); a
  WAL that refuses it is logged and the lease is left to lapse, which is the truth.
- After ``fork`` the child has no renewer thread and no registrations: a saga of the
  parent is not the child's to keep alive.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import weakref
from typing import Any, Final

from .clocks import SYSTEM_CLOCK, Clock
from .errors import ConfigurationError
from .records import RecordType

__all__ = ["DEFAULT_LEASE_SECONDS", "LeaseHandle", "check_lease_seconds", "open_sagas", "register", "unregister"]

log = logging.getLogger("agent_saga.leases")

DEFAULT_LEASE_SECONDS: Final = 30.0
_LEASE: Final = RecordType.SAGA_LEASE.value


def check_lease_seconds(value: object) -> float:
    """``value`` as a lease length in seconds; raises ``ConfigurationError`` unless it is a
    finite number of at least 0.05 seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0.05:
        raise ConfigurationError(
            f"lease_seconds must be a number of seconds >= 0.05, got {value!r}: it is how long "
            f"a recovery daemon waits after the owner's last sign of life before taking over"
        )
    return float(value)


class LeaseHandle:
    """One registered saga (opaque; pass it back to ``unregister``)."""

    __slots__ = ("_saga", "due", "key", "lease_seconds", "saga_id", "wal")

    def __init__(self, saga: Any, saga_id: str, wal: Any, lease_seconds: float) -> None:
        self._saga = weakref.ref(saga)
        self.key = 0
        self.saga_id = saga_id
        self.wal = wal
        self.lease_seconds = lease_seconds
        self.due = 0.0

    def alive(self) -> bool:
        """True while the saga is held and still running."""
        saga = self._saga()
        return saga is not None and saga.status == "RUNNING"


class _Renewer:
    """The process-wide renewer thread. It waits for real (a thread cannot sleep on a
    ``ManualClock``), so it paces itself on ``SYSTEM_CLOCK``; the expiry of a lease is
    decided by the reader's clock (``RecoveryDaemon(clock=...)``)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._live: dict[int, LeaseHandle] = {}
        self._heap: list[tuple[float, int]] = []  # (due, handle key); lazy deletion
        self._count = itertools.count(1)
        self._thread: threading.Thread | None = None

    def register(self, handle: LeaseHandle) -> None:
        with self._lock:
            handle.key = next(self._count)
            handle.due = self._clock.monotonic() + handle.lease_seconds / 3.0
            self._live[handle.key] = handle
            earliest = self._heap[0][0] if self._heap else math.inf
            heapq.heappush(self._heap, (handle.due, handle.key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agent-saga-lease-renewer", daemon=True)
                self._thread.start()
            elif handle.due < earliest:
                self._wake.notify()

    def unregister(self, handle: LeaseHandle) -> None:
        with self._lock:
            self._live.pop(handle.key, None)

    def _run(self) -> None:
        while True:
            due_now = self._wait_due()
            now = self._clock.monotonic()
            renewed: set[int] = set()
            for h in due_now:  # outside the lock: an append may block (BLOCK backpressure)
                if not h.alive():
                    continue
                try:
                    h.wal.append(_LEASE, h.saga_id, None, {"lease_seconds": h.lease_seconds})
                except Exception as exc:  # noqa: BLE001 - the lease lapses, which is the truth
                    log.warning("saga %s: lease renewal not written, it will lapse: %s", h.saga_id, exc)
                renewed.add(h.key)
            with self._lock:
                for h in due_now:
                    if h.key not in renewed:
                        self._live.pop(h.key, None)
                    elif h.key in self._live:
                        h.due = max(h.due + h.lease_seconds / 3.0, now)
                        heapq.heappush(self._heap, (h.due, h.key))

    def _wait_due(self) -> list[LeaseHandle]:
        with self._lock:
            heap = self._heap
            while True:
                while heap and heap[0][1] not in self._live:
                    heapq.heappop(heap)  # unregistered
                if not heap:
                    self._wake.wait()
                    continue
                wait = heap[0][0] - self._clock.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                now = self._clock.monotonic()
                out: dict[int, LeaseHandle] = {}
                while heap and heap[0][0] <= now:
                    _, key = heapq.heappop(heap)
                    h = self._live.get(key)
                    if h is not None:
                        out[key] = h
                return list(out.values())

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._live = {}
        self._heap = []
        self._thread = None


_renewer = _Renewer()
os.register_at_fork(after_in_child=_renewer.reset_after_fork)


def register(saga: Any, saga_id: str, wal: Any, lease_seconds: float) -> LeaseHandle:
    """Renew ``saga_id``'s lease in ``wal`` every ``lease_seconds / 3`` while ``saga`` runs.

    ``saga`` is held weakly and asked ``saga.status``; renewal stops by itself once it is
    no longer ``"RUNNING"`` (a rollback in progress counts as running). Returns the handle
    for ``unregister``.
    """
    handle = LeaseHandle(saga, saga_id, wal, lease_seconds)
    _renewer.register(handle)
    return handle


def open_sagas(wal: Any = None) -> list[str]:
    """The ids of the sagas whose scope is still open in this process (rolling back
    included), those writing to ``wal`` only when it is given."""
    with _renewer._lock:
        handles = list(_renewer._live.values())
    return [h.saga_id for h in handles if (wal is None or h.wal is wal) and h.alive()]


def unregister(handle: LeaseHandle) -> None:
    """Stop renewing (idempotent)."""
    _renewer.unregister(handle)
