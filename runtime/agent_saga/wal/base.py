"""BaseWAL: the write-ahead log interface every backend implements.

Contract (each backend keeps all of it, and documents its durability class):
- ``append`` never blocks on I/O and never drops a record: it assigns the next ``seq``
  and queues the record, or raises (``WALBackpressure`` under the RAISE policy,
  ``WALClosed``, or the ``WALError`` that failed an earlier batch).
- ``barrier(seq)`` returns only when every record up to ``seq`` is durable in the
  backend's class (FileWAL: written and fsynced). It raises ``WALStalled`` after its bound
  rather than hanging, and the real write error (chained) if the batch failed.
- ``fence(seq)`` is ``barrier`` for a caller that awaits the result itself (the engine):
  ``None`` when there is nothing to wait for, else an awaitable with ``barrier``'s outcome.
- Records are sealed into the hash chain by the writer, off the caller's hot path.
- Reads page through the log (``read_all``) or resume from a cursor (``read_since``). The
  cursor of a record is ``BaseWAL.cursor(record)``: its ``seq`` in a single-writer log
  (FileWAL), its global sequence ``gseq`` in a fleet log (RedisWAL, PostgresWAL), where
  reads cover every writer's records in ``gseq`` order.
- ``compact`` is part of the interface: a backend that cannot compact raises rather than
  silently doing nothing. It keeps every unresolved saga, writes a chained attestation of
  what left (see ``agent_saga.chain``) and is atomic (see ``agent_saga.wal.compaction``).
- Messages, log lines and records never carry a server password.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._unawaited import runs_if_discarded
from ..errors import SagaError
from ..records import Record

if TYPE_CHECKING:
    from .compaction import CompactionReport
    from .prepared import PreparedPayload

#: A test seam called on the flusher thread with the name of a point in a batch's life
#: (``"before_write"``, ``"before_sync"``, ``"after_write"``, ``"before_compact"``): a
#: fault-injection point, e.g. to wedge the device or ``os._exit`` at a commit boundary.
FaultHook = Callable[[str], None]


class Backpressure(enum.StrEnum):
    """What ``append`` does when ``max_pending`` records are already waiting."""

    RAISE = "RAISE"  # raise WALBackpressure at once (default: never a silent drop)
    BLOCK = "BLOCK"  # block the caller up to ``stall_timeout``, then raise WALStalled


@dataclass(frozen=True, slots=True)
class WALStats:
    """A snapshot of a WAL writer's state, for status pages and benchmarks."""

    backend: str
    durability: str
    appended_seq: int
    durable_seq: int
    pending: int
    batches: int
    syncs: int
    failed: str | None


class BaseWAL(abc.ABC):
    """A hash-chained, append-only log with a durability fence."""

    #: Human statement of what ``barrier`` guarantees for this backend.
    durability: str = "unspecified"

    @abc.abstractmethod
    def append(
        self,
        type: str,
        saga: str,
        step: str | None = None,
        payload: dict[str, Any] | None = None,
    ) -> int:
        """Queue one record; return its ``seq``. Never blocks on I/O (see module doc)."""

    def append_prepared(self, type: str, saga: str, step: str | None, prepared: PreparedPayload) -> int:
        """``append`` with a payload whose canonical text its producer built and scrubbed
        (``wal.prepared``). A backend that seals records takes the text as it is; this
        default (wrappers, other backends) appends the decoded payload through ``append``."""
        return self.append(type, saga, step, prepared.payload)

    @abc.abstractmethod
    async def barrier(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """Wait until every record up to ``seq`` (default: the last appended) is durable."""

    def fence(self, seq: int, timeout: float | None = None) -> Awaitable[None] | None:
        """``barrier(seq)`` for a caller that awaits the result itself: ``None`` if nothing
        is left to wait for, else what to await. Raises what ``barrier`` raises, here if it
        is known at once. This default returns the ``barrier`` coroutine. A backend that
        can answer without a coroutine overrides ``fence`` and awaits it in ``barrier``
        (``BatchingWAL``); a subclass that overrides only ``barrier`` gets this default
        back, so ``fence`` always agrees with ``barrier``."""
        return self.barrier(seq, timeout=timeout)

    @abc.abstractmethod
    def barrier_sync(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """``barrier`` for synchronous callers (threads, CLI)."""

    @abc.abstractmethod
    def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every record in log order, fetched ``page_size`` at a time."""

    @abc.abstractmethod
    def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every record whose cursor (``BaseWAL.cursor``) is greater than ``seq``, in log order."""

    @staticmethod
    def cursor(rec: Record) -> int:
        """The position of ``rec`` for ``read_since``: ``gseq`` where stamped, else ``seq``."""
        g = rec.extra.get("gseq")
        return g if isinstance(g, int) else rec.seq

    @abc.abstractmethod
    def stats(self) -> WALStats:
        """The writer's current state."""

    @abc.abstractmethod
    def close(self, *, timeout: float = 10.0) -> None:
        """Flush what is queued (bounded by ``timeout``) and release the backend."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "compact" in cls.__dict__:  # every backend's compact(), as BaseWAL.compact
            cls.compact = runs_if_discarded(cls.__dict__["compact"])  # type: ignore[method-assign]
        if "barrier" in cls.__dict__ and "fence" not in cls.__dict__:  # fence = barrier, always
            cls.fence = BaseWAL.fence  # type: ignore[method-assign]

    @runs_if_discarded
    async def compact(
        self, keep_sagas: Collection[str] | None = None, *, timeout: float | None = None
    ) -> CompactionReport:
        """Remove the records of resolved sagas; append a chained attestation of what left.

        Await it. Called as a bare statement in a script (no event loop running), it runs
        to completion there; in async code without ``await`` it raises
        ``ConfigurationError`` (``agent_saga._unawaited``), never silently doing nothing.

        Every saga without a terminal record is kept whatever ``keep_sagas`` says;
        ``keep_sagas`` names resolved sagas to keep as well. Records of the reserved saga
        ``wal`` (earlier attestations included) are never removed. The rewrite and the
        attestation land atomically and in log order with concurrent appends. Returns a
        ``CompactionReport``; raises ``WALError`` if the writer failed (the log is then as
        before or as after, never in between), ``WALStalled`` if ``timeout`` passed first.
        Backends that cannot compact raise ``SagaError``: never a silent no-op.
        """
        raise SagaError(
            f"{type(self).__name__} does not implement compact(); the log was not changed"
        )

    async def __aenter__(self) -> BaseWAL:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class WrappedWAL(BaseWAL):
    """A ``BaseWAL`` that adds to another one (``inner``) and passes the rest through:
    appends, fences, reads, statistics, compaction and close are ``inner``'s unless a
    subclass overrides them (``EncryptedWAL`` encrypts, ``MeshWAL`` stamps)."""

    def __init__(self, inner: BaseWAL) -> None:
        self.inner = inner
        self.durability = inner.durability

    def append(
        self,
        type: str,
        saga: str,
        step: str | None = None,
        payload: dict[str, Any] | None = None,
    ) -> int:
        """The inner WAL's ``append``."""
        return self.inner.append(type, saga, step, payload)

    async def barrier(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """The inner WAL's ``barrier``."""
        await self.inner.barrier(seq, timeout=timeout)

    def barrier_sync(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """The inner WAL's ``barrier_sync``."""
        self.inner.barrier_sync(seq, timeout=timeout)

    async def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """The inner WAL's records."""
        async for rec in self.inner.read_all(page_size=page_size):
            yield rec

    async def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """The inner WAL's records after ``seq``."""
        async for rec in self.inner.read_since(seq, page_size=page_size):
            yield rec

    def stats(self) -> WALStats:
        """The inner WAL's statistics."""
        return self.inner.stats()

    def close(self, *, timeout: float = 10.0) -> None:
        """Close the inner WAL."""
        self.inner.close(timeout=timeout)

    async def compact(
        self, keep_sagas: Collection[str] | None = None, *, timeout: float | None = None
    ) -> CompactionReport:
        """The inner WAL's compaction."""
        return await self.inner.compact(keep_sagas, timeout=timeout)
