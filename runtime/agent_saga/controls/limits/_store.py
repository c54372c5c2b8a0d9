"""The limit-store interface: one atomic check-and-debit across every applicable limit.

A store keeps, for each (limit, scope key), a sliding-window log of debits
``(time, amount)`` and their running total. The gate hands it the *charges* of one call
(one per applicable limit) and a fresh debit id; the store answers for all of them at once.

Contract every store keeps:
- ``debit`` is atomic and all-or-nothing: it trims each window, and either every charge
  fits (``used + amount <= max_total``, or the charge is forced) and every one is debited,
  or nothing is written and ``over`` names each charge that did not fit.
- A debit id names one gate decision and is never reused. A repeat of a debit by the
  store itself (a retry after a lost reply) debits nothing more and answers ``ok``
  (``replayed``).
- ``refund`` hands back exactly the debit ``debit_id`` made, once; refunding twice or
  refunding a debit that never happened changes nothing. The gate refunds only refusals.
- Windows are sliding and exact: a debit counts until ``window`` seconds after it was
  made, then leaves the total. Nothing is approximated by buckets.
- A store that cannot answer raises ``LimitStoreUnavailable`` naming itself; the gate
  turns that into BLOCK (budgets fail closed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ...errors import StoreUnavailable
from ._model import Charge, DebitResult, LimitSpec, LimitUsage

__all__ = ["LimitStore", "LimitStoreUnavailable"]


class LimitStoreUnavailable(StoreUnavailable):
    """The limit store could not be read or written; budgets fail closed (BLOCK).

    ``store`` names the store (``RedisLimitStore(redis://host:6379/0)``);
    ``outcome_unknown`` is True when a request may have reached the store before the
    connection failed (a timeout): such a debit stays counted, never under-counted.
    """

    def __init__(self, message: str, *, store: str, outcome_unknown: bool = False) -> None:
        super().__init__(message, store=store)
        self.outcome_unknown = outcome_unknown


@runtime_checkable
class LimitStore(Protocol):
    """Where limit windows live. See the module doc for the contract."""

    def describe(self) -> str:
        """A name for messages: ``InProcessLimitStore`` or ``RedisLimitStore(redis://...)``."""
        ...

    async def debit(
        self, charges: Sequence[Charge], debit_id: str, force: frozenset[int] = frozenset()
    ) -> DebitResult:
        """Atomically check every charge and debit all of them, or none (see module doc).

        Charges whose index is in ``force`` are debited even over their maximum (a human
        approved the spend). Raises ``LimitStoreUnavailable``.
        """
        ...

    async def refund(self, charges: Sequence[Charge], debit_id: str) -> None:
        """Hand back what ``debit`` with the same id debited. Raises ``LimitStoreUnavailable``."""
        ...

    async def declare(self, specs: Sequence[LimitSpec]) -> None:
        """Record the limits' definitions so ``usage()`` and ``agent-saga status`` can show them."""
        ...

    async def usage(self, specs: Sequence[LimitSpec] | None = None) -> list[LimitUsage]:
        """Every non-empty window of ``specs`` (default: every declared limit)."""
        ...
