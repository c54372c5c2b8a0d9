"""Quarantine: a frozen saga is skipped by recovery; a human decides what happens to it.

Quarantine is explicitly not a rollback: during an incident, automatically reversing a
hundred sagas can be far worse than leaving them still. Two sources say a saga is frozen,
and recovery honours either:

- the log itself: a ``SAGA_QUARANTINED`` record (lifted by ``SAGA_QUARANTINE_LIFTED``),
  read in the same single pass as everything else (``quarantine_saga`` writes one);
- any ``QuarantineSource`` passed as ``RecoveryDaemon(quarantine=...)``: the kill switch
  implements it over its fleet-wide store.

Invariants:
- A source that cannot answer (it raises) counts as "quarantined" for this sweep: the
  daemon does not act on a saga while the control that may have frozen it is unreadable.
- Checked twice: when the sweep classifies the saga and again after it is claimed, so a
  quarantine that lands mid-sweep stops the daemon before it writes anything.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

from ..wal.base import BaseWAL
from .recordtypes import SAGA_QUARANTINE_LIFTED, SAGA_QUARANTINED

__all__ = ["QuarantineSource", "ask_quarantine", "lift_quarantine", "quarantine_saga"]


@runtime_checkable
class QuarantineSource(Protocol):
    """Answers whether a saga is frozen. ``is_quarantined`` may be sync or async."""

    def is_quarantined(self, saga_id: str) -> bool | Awaitable[bool]:
        """True if recovery must leave ``saga_id`` alone."""
        ...


async def ask_quarantine(source: QuarantineSource, saga_id: str) -> bool:
    """``source``'s answer, awaited if it is async. Exceptions propagate (the caller
    treats them as "quarantined")."""
    answer = source.is_quarantined(saga_id)
    if inspect.isawaitable(answer):
        answer = await answer
    return bool(answer)


def quarantine_saga(wal: BaseWAL, saga_id: str, *, reason: str, by: str) -> int:
    """Append ``SAGA_QUARANTINED`` for ``saga_id`` to ``wal``; returns its seq (call
    ``barrier`` to make it durable)."""
    return wal.append(SAGA_QUARANTINED, saga_id, None, {"reason": reason, "by": by})


def lift_quarantine(wal: BaseWAL, saga_id: str, *, reason: str, by: str) -> int:
    """Append ``SAGA_QUARANTINE_LIFTED`` for ``saga_id``; returns its seq."""
    return wal.append(SAGA_QUARANTINE_LIFTED, saga_id, None, {"reason": reason, "by": by})
