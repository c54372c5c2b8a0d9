"""InProcessLimitStore: the zero-dependency default. Exact, fast, and local to one process.

Each window is a deque of debit entries in time order plus a running total; a check trims
the entries older than the window, compares, and appends. A ``threading.Lock`` makes
``debit`` atomic across threads and tasks (it never awaits while holding it).

What it does not do, stated rather than buried: the windows live in this process's
memory. Another process (a second pod, a gunicorn worker) has its own windows and grants
the full allowance again, and a restarted process starts every window fresh, so a
crash-looping agent can spend a daily budget once per restart. Use ``RedisLimitStore``
for anything that runs more than one process or must survive a restart.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from ...retry import SYSTEM_CLOCK, Clock
from ._model import Charge, DebitResult, LimitSpec, LimitUsage

__all__ = ["InProcessLimitStore"]

_SWEEP_EVERY = 4095  # forget idle windows once every 4,096 debits (amortised O(1))


class _Entry:
    __slots__ = ("amount", "debit_id", "ts")

    def __init__(self, ts: float, amount: float, debit_id: str) -> None:
        self.ts = ts
        self.amount = amount  # zeroed by a refund: the entry stays as a tombstone
        self.debit_id = debit_id


class _Window:
    __slots__ = ("entries", "ids", "total", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self.entries: deque[_Entry] = deque()
        self.ids: dict[str, _Entry] = {}
        self.total = 0.0

    def trim(self, cutoff: float) -> None:
        entries = self.entries
        while entries and entries[0].ts <= cutoff:
            e = entries.popleft()
            self.total -= e.amount
            self.ids.pop(e.debit_id, None)
        if not entries:
            self.total = 0.0  # no float residue once empty


class InProcessLimitStore:
    """Limit windows in this process's memory (see the module doc for what that means).

    ``clock`` is the time seam (``clock.monotonic()``, seconds, never going backwards;
    default: the system clock); tests pass a fake clock instead of sleeping.
    """

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock.monotonic
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], _Window] = {}
        self._specs: dict[str, LimitSpec] = {}
        self._debits = 0

    def describe(self) -> str:
        return "InProcessLimitStore"

    def __repr__(self) -> str:
        return "InProcessLimitStore()"

    async def debit(
        self, charges: Sequence[Charge], debit_id: str, force: frozenset[int] = frozenset()
    ) -> DebitResult:
        return self.debit_now(charges, debit_id, force)

    def debit_now(
        self, charges: Sequence[Charge], debit_id: str, force: frozenset[int] = frozenset()
    ) -> DebitResult:
        """``debit`` for synchronous callers (the same lock, the same semantics)."""
        windows = self._windows
        with self._lock:
            now = self._clock()
            if not charges:
                return DebitResult(True, ())
            wins: list[_Window] = []
            used: list[float] = []
            over: list[int] = []
            for i, c in enumerate(charges):
                k = (c.limit, c.key)
                w = windows.get(k)
                if w is None:
                    w = windows[k] = _Window(c.window)
                elif i == 0 and debit_id in w.ids:
                    return DebitResult(True, tuple(0.0 for _ in charges), (), True)
                w.trim(now - c.window)
                wins.append(w)
                t = w.total
                used.append(t)
                if t + c.amount > c.max_total and i not in force:
                    over.append(i)
            if over:
                return DebitResult(False, tuple(used), tuple(over))
            for w, c in zip(wins, charges, strict=True):
                entry = _Entry(now, c.amount, debit_id)
                w.entries.append(entry)
                w.ids[debit_id] = entry
                w.total += c.amount
            self._debits += 1
            if not self._debits & _SWEEP_EVERY:
                self._sweep(now)  # after the writes: the windows just debited are not idle
            return DebitResult(True, tuple(used))

    def _sweep(self, now: float) -> None:
        """Forget windows whose every entry has expired (idle scopes), under the lock."""
        for k in [k for k, w in self._windows.items() if not w.entries or w.entries[-1].ts <= now - w.window]:
            del self._windows[k]

    async def refund(self, charges: Sequence[Charge], debit_id: str) -> None:
        with self._lock:
            for c in charges:
                w = self._windows.get((c.limit, c.key))
                if w is None:
                    continue
                entry = w.ids.pop(debit_id, None)
                if entry is None:
                    continue
                w.total = max(0.0, w.total - entry.amount)
                entry.amount = 0.0

    async def declare(self, specs: Sequence[LimitSpec]) -> None:
        with self._lock:
            for s in specs:
                self._specs[s.name] = s

    async def usage(self, specs: Sequence[LimitSpec] | None = None) -> list[LimitUsage]:
        with self._lock:
            now = self._clock()
            wanted = list(self._specs.values()) if specs is None else list(specs)
            out: list[LimitUsage] = []
            for s in wanted:
                for (name, key), w in sorted(self._windows.items()):
                    if name != s.name:
                        continue
                    w.trim(now - s.window)
                    if not w.entries:
                        continue
                    oldest = w.entries[0].ts
                    out.append(LimitUsage(
                        s.name, s.kind, key, w.total, s.max_total, s.window, len(w.entries),
                        max(0.0, oldest + s.window - now),
                    ))
            return out
