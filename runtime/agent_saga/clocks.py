"""The one clock of the runtime: every wait, timeout, TTL, lease and grace window.

``Clock`` is the time seam the engine (retry back-off), the controls (kill-switch TTLs
and grace, approval deadlines, the breaker's window), leases and recovery (lease expiry,
claim renewal) take as ``clock=``; the default is ``SYSTEM_CLOCK``. A test passes a
``ManualClock`` and moves time itself instead of sleeping.

A clock has two times: wall time (``time``: an instant other processes read, such as a
lever's TTL, an approval's deadline or a lease's expiry, so epoch seconds) and
monotonic time (``monotonic``: durations in this process, such as a grace window or a
back-off, which must not jump when the wall clock is stepped); and every wait goes
through ``sleep``.

Invariants:
- ``SYSTEM_CLOCK`` is ``time.time`` / ``time.monotonic`` / ``asyncio.sleep``.
- ``ManualClock`` only moves when told to (``advance``), or by exactly the requested
  amount when slept on, so a deadline is reached deterministically. It is safe to read
  from several threads (a background watcher reads it while a test advances it).
- A thread that waits for real (a policy-plane watcher, the lease renewer) paces itself
  on the system clock; what it decides (expiry, grace) is measured on the clock given.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = [
    "SYSTEM_CLOCK",
    "Clock",
    "ControlClock",
    "ManualClock",
    "SystemClock",
    "SystemControlClock",
    "as_clock",
    "format_instant",
    "parse_duration",
    "parse_instant",
]


@runtime_checkable
class Clock(Protocol):
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


#: The name the controls' signatures use; the same protocol.
ControlClock = Clock


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic`` and ``asyncio.sleep``."""

    __slots__ = ()

    def time(self) -> float:
        """``time.time()``."""
        return time.time()

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep(seconds)``."""
        await asyncio.sleep(seconds)


SystemControlClock = SystemClock
SYSTEM_CLOCK = SystemClock()


class _WallFunction:
    """A clock whose wall time is a function (``lambda: time.time() + 3600``)."""

    __slots__ = ("_time",)

    def __init__(self, wall: Callable[[], float]) -> None:
        self._time = wall

    def time(self) -> float:
        return float(self._time())

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def as_clock(clock: Clock | Callable[[], float] | None) -> Clock:
    """``clock`` as a ``Clock``: ``None`` is ``SYSTEM_CLOCK``; a bare function of no
    arguments is taken as the wall time (``time.time``-like), with the system's
    monotonic time and sleep."""
    if clock is None:
        return SYSTEM_CLOCK
    if isinstance(clock, Clock):
        return clock
    if callable(clock):
        return _WallFunction(clock)
    raise TypeError(f"clock must be a Clock (SYSTEM_CLOCK, ManualClock()) or a function returning epoch seconds, "
                    f"got {clock!r}")


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
        """The wall time it was set to (epoch seconds)."""
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        """The monotonic time (starts at 1000)."""
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
        """Advance by ``seconds`` (recorded in ``sleeps``) and yield to the loop once."""
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


_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?$")


def parse_duration(text: str) -> float:
    """Positive, finite seconds from ``600``, ``600s``, ``10m``, ``1h30m`` or ``7d``.

    Raises ``ValueError`` saying what to give (the caller names the option)."""
    t = text.strip()
    try:
        value = float(t)
    except ValueError:
        m = _DURATION.match(t)
        if not t or m is None:
            raise ValueError("give seconds (600) or a duration (10m, 1h30m, 7d)") from None
        d, h, mi, s = m.groups()
        value = int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi or 0) * 60 + float(s or 0)
    if not 0 < value < math.inf:
        raise ValueError("must be positive")
    return value
