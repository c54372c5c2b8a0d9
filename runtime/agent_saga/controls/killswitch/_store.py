"""Where kill-switch levers live: the ``SwitchStore`` protocol, ``SwitchView`` and the error.

``FileSwitchStore`` (one process, ``_local``) and ``RedisSwitchStore`` (a fleet,
``_redis``) implement it.

Every store answers ``view()`` on the hot path from memory (no I/O): a ``SwitchView``
holding the levers last read, whether they may still be trusted, and a ``version`` that
changes only when they do, so a ``KillSwitch`` recompiles its matcher only on change.

Failure modes, deliberately different from every other control (see docs/killswitch.md):
- ``RedisSwitchStore`` watches the policy plane from a background thread: it subscribes
  to the change channel (a new halt is seen within milliseconds, no polling delay) and
  re-reads every ``heartbeat`` seconds (which heals a missed notification and proves
  the server answers). When Redis cannot be reached, the last known levers are honoured
  for ``grace`` seconds after the store lost it (or after its last confirmed contact,
  if the loss is silent), then the view becomes unusable and the switch refuses
  everything. ``grace=0`` refuses from the moment the loss is seen. With no known state
  at all (Redis down at start-up) everything is refused.
- ``FileSwitchStore`` keeps levers in memory, or in a JSON file that other processes on
  the same host (the CLI) may write; it logs a WARNING when created, because a kill
  switch that stops one process is not a kill switch for a fleet. A file that is deleted
  or cannot be read is an outage too: its last known levers are honoured for ``grace``
  seconds, then everything is refused (see ``_local``).

Invariants:
- ``view()`` never blocks and never raises; a view is immutable and swapped atomically.
- Writes (``engage``, ``lift``) publish a change notification; they raise
  ``SwitchStoreUnavailable`` naming the store when they cannot be made.
- A lever document that cannot be read is reported in ``SwitchView.unreadable``; the
  kill switch treats it as a global HALT (a switch nobody can read was meant to stop
  something).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ...errors import StoreUnavailable
from ._model import Lever, LeverAction, LeverUnreadable

__all__ = [
    "SwitchStore",
    "SwitchStoreUnavailable",
    "SwitchView",
]


class SwitchStoreUnavailable(StoreUnavailable):
    """A kill-switch store could not be read or written; ``store`` names it."""

    def __init__(self, message: str, *, store: str) -> None:
        super().__init__(message, store=store)


@dataclass(frozen=True, slots=True)
class SwitchView:
    """What a store knows right now. ``usable`` False: fail closed (``problem`` says why).

    ``degraded`` is set while the last known levers are honoured during a store outage.
    ``unreadable`` lists ``(lever id, message)`` for documents that could not be read.
    """

    version: int
    levers: tuple[Lever, ...] = ()
    unreadable: tuple[tuple[str, str], ...] = ()
    usable: bool = True
    problem: str | None = None
    degraded: str | None = None


@runtime_checkable
class SwitchStore(Protocol):
    """The interface ``KillSwitch`` uses (and the recovery daemon's quarantine source)."""

    def describe(self) -> str:
        """A name for messages and status (never a password)."""
        ...

    def start(self) -> None:
        """Begin watching (idempotent, may block for the first read)."""
        ...

    def view(self) -> SwitchView:
        """The current view, from memory (the hot path): never blocks, never raises."""
        ...

    def engage(self, lever: Lever) -> None:
        """Store ``lever`` (replacing one with its id) and notify every watcher."""
        ...

    def lift(self, lever_id: str) -> Lever | None:
        """Remove the lever ``lever_id``; return it (``None`` if it was not engaged)."""
        ...

    def levers(self) -> list[Lever]:
        """A fresh read of every stored lever (expired ones included)."""
        ...

    def is_quarantined(self, saga_id: str) -> bool:
        """True if ``saga_id`` is quarantined (or the store cannot tell: fail safe)."""
        ...

    def close(self) -> None:
        """Stop watching and release connections."""
        ...


def parse_levers(items: Iterator[tuple[str, Any]]) -> tuple[tuple[Lever, ...], tuple[tuple[str, str], ...]]:
    levers: list[Lever] = []
    bad: list[tuple[str, str]] = []
    for lever_id, raw in items:
        try:
            doc = json.loads(raw) if isinstance(raw, str | bytes) else raw
            levers.append(Lever.from_doc(lever_id, doc))
        except (ValueError, LeverUnreadable) as exc:
            bad.append((lever_id, str(exc)))
    levers.sort(key=lambda lv: lv.id)
    bad.sort()
    return tuple(levers), tuple(bad)


def quarantined(view: SwitchView, saga_id: str, now: float) -> bool:
    if not view.usable:
        return True
    return any(
        lv.action is LeverAction.QUARANTINE and lv.scope == f"saga:{saga_id}" and not lv.expired(now)
        for lv in view.levers
    )
