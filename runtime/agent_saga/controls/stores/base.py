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

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from ...errors import SagaError

__all__ = [
    "Charge",
    "DebitResult",
    "LimitKind",
    "LimitSpec",
    "LimitStore",
    "LimitStoreUnavailable",
    "LimitUsage",
    "format_amount",
]

LimitKind = Literal["budget", "rate"]

SPEC_VERSION = 1


class LimitStoreUnavailable(SagaError):
    """The limit store could not be read or written; budgets fail closed (BLOCK).

    ``store`` names the store (``RedisLimitStore(redis://host:6379/0)``);
    ``outcome_unknown`` is True when a request may have reached the store before the
    connection failed (a timeout): such a debit stays counted, never under-counted.
    """

    def __init__(self, message: str, *, store: str, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.store = store
        self.outcome_unknown = outcome_unknown


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """A limit's definition as a store and ``agent-saga status`` see it (JSON, ``v`` = 1)."""

    name: str
    kind: LimitKind
    max_total: float
    window: float
    scope: str = "global"
    arg: str | None = None
    escalate_to_human: bool = False
    tools: tuple[str, ...] | None = None

    def to_doc(self) -> dict[str, Any]:
        return {
            "v": SPEC_VERSION,
            "name": self.name,
            "kind": self.kind,
            "arg": self.arg,
            "max_total": self.max_total,
            "window": self.window,
            "scope": self.scope,
            "escalate_to_human": self.escalate_to_human,
            "tools": list(self.tools) if self.tools is not None else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_doc(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> LimitSpec:
        if doc.get("v") != SPEC_VERSION:
            raise ValueError(f"limit definition schema v={doc.get('v')!r} is not supported")
        tools = doc.get("tools")
        kind = doc["kind"]
        if kind not in ("budget", "rate"):
            raise ValueError(f"limit kind {kind!r} is not budget or rate")
        return cls(
            name=str(doc["name"]),
            kind=kind,
            max_total=float(doc["max_total"]),
            window=float(doc["window"]),
            scope=str(doc.get("scope", "global")),
            arg=doc.get("arg"),
            escalate_to_human=bool(doc.get("escalate_to_human", False)),
            tools=tuple(tools) if tools is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Charge:
    """What one call costs against one limit: ``amount`` in the window ``key``."""

    limit: str
    key: str
    amount: float
    max_total: float
    window: float
    escalate_to_human: bool = False
    kind: LimitKind = "budget"


@dataclass(frozen=True, slots=True)
class DebitResult:
    """The answer to one ``debit``.

    ``ok``: every charge was debited. ``used``: each window's total *before* this call
    (after trimming); always given on a refusal, possibly empty when ok (the Redis store
    does not spend a reply on it). ``over``: indices of the charges that did not fit
    (empty when ok). ``replayed``: ``debit_id`` had already been debited by an earlier
    attempt of the same call; nothing was added.
    """

    ok: bool
    used: tuple[float, ...]
    over: tuple[int, ...] = ()
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """One window's use: ``used`` of ``max_total`` in the last ``window`` seconds.

    ``entries`` is the number of debits in the window; ``frees_in`` the seconds until the
    oldest one leaves it (None when the window is empty).
    """

    name: str
    kind: LimitKind
    key: str
    used: float
    max_total: float
    window: float
    entries: int
    frees_in: float | None

    @property
    def remaining(self) -> float:
        return max(0.0, self.max_total - self.used)

    def to_doc(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "scope_key": self.key,
            "used": self.used,
            "max_total": self.max_total,
            "remaining": self.remaining,
            "window": self.window,
            "entries": self.entries,
            "frees_in": self.frees_in,
        }


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


def format_amount(amount: float) -> str:
    """The exact text of an amount, as stored in a debit entry (``4200``, ``12.5``)."""
    if isinstance(amount, int) or amount.is_integer() and abs(amount) < 2**53:
        return str(int(amount))
    return repr(float(amount))
