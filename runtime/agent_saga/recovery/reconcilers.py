"""Reconcilers: ask the system of record what is true, instead of trusting the log.

A reconciler is registered under a handler or tool name and called with the same kwargs
that handler or tool was called with (plus ``idempotency_key=`` if it accepts one). It
returns an ``Observation`` - tri-state, so "I don't know" survives::

    @reconciler("stripe.refund")            # same name as @compensator("stripe.refund")
    async def observe_refund(*, charge_id, credential_ref=None, **kw):
        charge = await fetch_charge(charge_id, credential_ref)
        return Observation(reversed_=charge["refunded"], exists=True,
                           detail=charge["status"], amount=charge["amount"])

It is used twice:

- by ``agent-saga reconcile``, a later pass that re-reads every effect the log says was
  undone (the compensation handler's reconciler, over the compensation kwargs) or that
  ended in doubt (the tool's reconciler, over the forward kwargs);
- by recovery, for a step whose forward call died or timed out: the tool's reconciler says
  whether it landed (``exists``), whether it is already undone (``reversed_``) and, if it
  must be undone, how (``compensation``, since the forward result that would have derived
  it was never seen).

A reconciler must be authoritative: ``exists=False`` must mean "did not happen and never
will" (e.g. the provider refuses a replay of the same idempotency key). When it cannot
tell, it returns ``None`` for the field (or raises): the effect is *unverifiable*, which
is never counted as confirmed.

Invariants: ``@reconciler`` validates eagerly and returns the function unchanged; the
registry is process-local and thread-safe, like the compensation registry; one name has
one reconciler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .._registry import Registry
from ..compensation import Compensation, coerce_compensation, load_shipped_handlers
from ..credentials import redact_secrets
from ..errors import ConfigurationError

__all__ = [
    "Observation",
    "coerce_observation",
    "get_reconciler",
    "reconciler",
    "registered_reconcilers",
    "unregister_reconciler",
]

F = TypeVar("F", bound=Callable[..., Any])

_reconcilers = Registry(
    decorator="reconciler",
    bad_name="reconciler name {name!r} is not valid: use the handler's or tool's stable name, e.g. "
             "'stripe.refund' (1-128 characters from [A-Za-z0-9._:/-])",
    taken="{name!r} already has the reconciler {prev}; cannot register {new} as well: one name, one "
          "authority on what is true",
)

_DETAIL_MAX = 500


@dataclass(frozen=True, slots=True)
class Observation:
    """What the system of record says about one effect.

    Args:
        reversed_: ``True`` the effect is undone; ``False`` it is still standing; ``None``
            the system could not tell.
        exists: ``True`` the effect happened (the charge, the row, the write exists or
            existed); ``False`` it provably never happened; ``None`` unknown.
        detail: a short human-readable fact (a status, the values seen), kept in reports
            and the log with credentials redacted.
        amount: the amount involved, if any (minor units for money).
        compensation: for an effect that happened and still stands, how to undo it (a
            ``Compensation`` with a ``handler``, or its dict form): recovery runs it for a
            step whose forward call ended in doubt.

    Raises ``ConfigurationError`` for a field of the wrong type.
    """

    reversed_: bool | None = None
    exists: bool | None = None
    detail: str = ""
    amount: int | float | None = None
    compensation: Compensation | Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("reversed_", "exists"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigurationError(
                    f"Observation.{name} must be True, False or None (unknown), got {value!r}"
                )
        if not isinstance(self.detail, str):
            raise ConfigurationError(f"Observation.detail must be a string, got {type(self.detail).__name__}")
        if self.amount is not None and (isinstance(self.amount, bool) or not isinstance(self.amount, int | float)):
            raise ConfigurationError(f"Observation.amount must be a number or None, got {self.amount!r}")

    @property
    def verified(self) -> bool:
        """True if the system answered at least one of the two questions."""
        return self.exists is not None or self.reversed_ is not None

    def undo(self, tool: str) -> Compensation | None:
        """The compensation to run, or ``None``; raises ``CompensationError`` if malformed."""
        return coerce_compensation(self.compensation, tool)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (reports and the log): the detail is redacted and truncated."""
        return {
            "reversed": self.reversed_, "exists": self.exists,
            "detail": redact_secrets(self.detail)[:_DETAIL_MAX], "amount": self.amount,
        }


def coerce_observation(value: object, name: str) -> Observation:
    """Check a reconciler's return value; raises ``ConfigurationError`` naming the fix."""
    if isinstance(value, Observation):
        return value
    raise ConfigurationError(
        f"the reconciler {name!r} returned {type(value).__name__}, not an Observation: return "
        f"Observation(exists=..., reversed_=..., detail=...) (a reconciler written for the "
        f"older (policy_args, idempotency_key) -> None | Compensation contract must be "
        f"migrated: see docs/reconcile.md)"
    )


def reconciler(name: str) -> Callable[[F], F]:
    """Register the decorated function as the reconciler of ``name`` (see the module doc).

    ``name`` is a compensation handler's name (``"stripe.refund"``: did the undo take?) or
    a tool's (``"stripe.charge"``: did the forward call land?). Raises
    ``ConfigurationError`` at decoration time for an invalid name, a non-callable, or a
    name that already has a different reconciler.
    """
    register = _reconcilers.register(name)  # the name is checked first
    load_shipped_handlers(name)
    return register


def get_reconciler(name: str) -> Callable[..., Any] | None:
    """The reconciler registered for ``name``, or ``None``."""
    load_shipped_handlers()
    return _reconcilers.get(name)


def registered_reconcilers() -> dict[str, Callable[..., Any]]:
    """A snapshot of the registry: name -> function."""
    load_shipped_handlers()
    return _reconcilers.snapshot()


def unregister_reconciler(name: str) -> bool:
    """Remove ``name``'s reconciler (tests, plugin unloading); True if there was one."""
    return _reconcilers.unregister(name)
