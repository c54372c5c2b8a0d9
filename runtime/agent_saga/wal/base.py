"""BaseWAL: the write-ahead log interface every backend implements.

Contract (each backend keeps all of it, and documents its durability class):
- ``append`` never blocks on I/O and never drops a record: it assigns the next ``seq``
  and queues the record, or raises (``WALBackpressure`` under the RAISE policy,
  ``WALClosed``, or the ``WALError`` that failed an earlier batch).
- ``barrier(seq)`` returns only when every record up to ``seq`` is durable in the
  backend's class (FileWAL: written and fsynced). It raises ``WALStalled`` after its bound
  rather than hanging, and the real write error (chained) if the batch failed.
- Records are sealed into the hash chain by the writer, off the caller's hot path.
- Reads page through the log (``read_all``) or resume from a cursor (``read_since``).
- ``compact`` is part of the interface: a backend that cannot compact raises rather than
  silently doing nothing.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..errors import SagaError
from ..records import Record


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

    @abc.abstractmethod
    async def barrier(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """Wait until every record up to ``seq`` (default: the last appended) is durable."""

    @abc.abstractmethod
    def barrier_sync(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        """``barrier`` for synchronous callers (threads, CLI)."""

    @abc.abstractmethod
    def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every record in log order, fetched ``page_size`` at a time."""

    @abc.abstractmethod
    def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every record with a sequence greater than ``seq`` (a cursor), in log order."""

    @abc.abstractmethod
    def stats(self) -> WALStats:
        """The writer's current state."""

    @abc.abstractmethod
    def close(self, *, timeout: float = 10.0) -> None:
        """Flush what is queued (bounded by ``timeout``) and release the backend."""

    async def compact(self, keep_sagas: frozenset[str]) -> int:
        """Drop records of sagas not in ``keep_sagas``, writing a chained attestation.

        Backends that cannot compact raise ``SagaError``: never a silent no-op.
        """
        raise SagaError(
            f"{type(self).__name__} does not implement compact(); the log was not changed"
        )

    async def __aenter__(self) -> BaseWAL:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
