"""The time seam of the controls (kill switch, approvals, breaker) and the policy plane.

These controls need two clocks: wall time (a lever's TTL and an approval's deadline are
instants other processes read, so they are epoch seconds) and monotonic time (the kill
switch's grace window, the breaker's window and cool-down, which must not jump when the
wall clock is stepped). Every wait goes through ``sleep``, so a test never sleeps to
wait for a deadline: it advances a ``ManualClock``.

Invariants:
- ``SYSTEM_CLOCK`` is ``time.time`` / ``time.monotonic`` / ``asyncio.sleep``.
- ``ManualClock`` only moves when told to (``advance``), or by exactly the requested
  amount when slept on, so a deadline is reached deterministically. It is safe to read
  from several threads (a background watcher reads it while a test advances it).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "ControlClock", "ManualClock", "SystemControlClock", "format_instant", "parse_instant"]


@runtime_checkable
class ControlClock(Protocol):
    """Wall time, monotonic time and an awaitable sleep. Inject a ``ManualClock`` in tests."""

    def time(self) -> float:
        """Seconds since the epoch (instants shared with other processes)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (durations in this process)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (cancellable)."""
        ...


class SystemControlClock:
    """The real clock."""

    __slots__ = ()

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemControlClock()


class ManualClock:
    """A clock that moves only when told to: ``advance(seconds)``, or by sleeping on it.

    ``sleep(s)`` advances the clock by ``s`` and yields to the event loop once, so a
    waiting loop (an approval's poll) reaches its deadline at once without real waiting.
    ``start`` is the initial wall time (epoch seconds).
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._lock = threading.Lock()
        self._wall = float(start)
        self._mono = 1_000.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._wall += seconds
            self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


def format_instant(epoch: float) -> str:
    """``epoch`` as RFC 3339 UTC with microseconds (``2025-06-01T03:00:00.000000Z``), the
    form policy-plane documents use (Kubernetes writes the same)."""
    import datetime as _dt

    return _dt.datetime.fromtimestamp(epoch, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_instant(value: object) -> float | None:
    """An instant from a document: RFC 3339 text or epoch seconds; ``None`` for null.

    Raises ``ValueError`` for anything else (the caller names the document)."""
    import datetime as _dt

    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"not an instant: {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        when = _dt.datetime.fromisoformat(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.UTC)
        return when.timestamp()
    raise ValueError(f"not an instant: {value!r}")
