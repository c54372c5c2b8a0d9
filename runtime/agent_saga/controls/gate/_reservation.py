"""``Reservation``: what the gate debited for one call, until the verdict is final.

The limits stage prices a call against every applicable limit and debits all of them in
one store call; from then on the debit is a reservation. A refusal (a rule, the
approver, no approver, anything failing) hands it back; an allowed call keeps it for
good (a failed, timed-out or compensated step keeps its debit). ``Reservation`` carries
that state, so the stages after the limits pass one object instead of its parts, and
``refuse`` is the one place a refusal hands the reservation back.

The texts of the limits' refusals are built here too (``over_reason``, ``store_reason``,
``charges_doc``): they describe charges.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ...gates import StepRequest
from ..approvals import ApprovalOutcome
from ..limits import Charge, DebitResult, LimitStore, LimitStoreUnavailable, display_amount
from ._verdicts import PreFlightDecision, Stage

__all__ = ["Reservation", "charges_doc", "new_debit_id", "over_reason", "store_reason"]

log = logging.getLogger("agent_saga.controls")

GATE = "PreFlightGate"

# Debit ids: unique across processes (random token + pid, so a fork cannot repeat one)
# and cheap (no uuid4 on the hot path). Uniqueness matters: the stores are idempotent on
# the id, so a repeated id would silently not be counted.
_TOKEN = os.urandom(6).hex()
_counter = itertools.count(1)


def new_debit_id() -> str:
    """A debit id never used before, in any process."""
    return f"{_TOKEN}.{os.getpid():x}.{next(_counter):x}"


@dataclass(slots=True)
class Reservation:
    """The charges of one call and, once ``reserved``, the debit ``debit_id`` made in
    ``store``. ``escalated``: indices of charges over their limit that escalate to a
    human (nothing is debited for the call while a human decides). ``detail`` is the
    verdict's audit detail, filled in as the stages run."""

    charges: list[Charge] = field(default_factory=list)
    store: LimitStore | None = None
    debit_id: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    reserved: bool = False
    escalated: tuple[int, ...] = ()

    async def refund(self) -> None:
        """Hand back the debit, if one is reserved. A store that cannot take it back is
        noted (``detail["refund_failed"]``) and logged: the amount stays counted until its
        window passes, which errs on the safe side (never under-counted)."""
        if not self.reserved or self.store is None:
            return
        try:
            await self.store.refund(self.charges, self.debit_id)
        except BaseException as exc:
            self.detail["refund_failed"] = f"{type(exc).__name__}: {exc}"
            log.warning(
                "could not hand back debit %s of a refused call to %s (%s: %s): the amount stays "
                "counted until its window passes (never under-counted)",
                self.debit_id, self.store.describe(), type(exc).__name__, exc,
            )
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def refuse(
        self,
        verdict: Literal["BLOCK", "REQUIRE_APPROVAL"],
        stage: Stage,
        decided_by: str,
        reason: str,
        approval: ApprovalOutcome | None = None,
    ) -> PreFlightDecision:
        """The refusal: the reservation handed back, ``detail["debited"]`` saying whether
        the spend is still counted (only if the refund failed)."""
        await self.refund()
        if self.charges:
            self.detail["debited"] = bool(self.detail.get("refund_failed"))
        return PreFlightDecision(verdict, reason, decided_by, False, stage, approval, self.detail)

    def allow(self, verdict: Literal["ALLOW", "REQUIRE_APPROVAL"] = "ALLOW", reason: str = "no limit or rule objected",
              decided_by: str = GATE, stage: Stage = "allow", approval: ApprovalOutcome | None = None,
              ) -> PreFlightDecision:
        """The call may run: its debit is permanent from here on."""
        if self.charges:
            self.detail["debited"] = True
        return PreFlightDecision(verdict, reason, decided_by, True, stage, approval, self.detail)

    async def debit_escalated(self, request: StepRequest, approver: str,
                              outcome: ApprovalOutcome) -> PreFlightDecision | None:
        """A human approved spend over an escalating limit: debit it, forced over those
        limits (it is authorised spend) but not over the others. Returns the refusal if
        that debit cannot be made, ``None`` once it is."""
        if not self.escalated:
            return None
        assert self.store is not None
        store = self.store
        try:
            result = await store.debit(self.charges, self.debit_id, force=frozenset(self.escalated))
        except Exception as exc:  # noqa: BLE001
            self.detail["debited"] = False
            return PreFlightDecision("BLOCK", f"approved by {approver}, but {store_reason(store, exc)}",
                                     "limit-store", False, "approval", outcome, self.detail)
        self.detail["charges"] = charges_doc(self.charges, result, forced=self.escalated)
        if not result.ok:
            i = result.over[0]
            self.detail["debited"] = False
            return PreFlightDecision(
                "BLOCK", f"approved by {approver}, but meanwhile "
                + over_reason(self.charges[i], result.used[i], request),
                "limit:" + self.charges[i].limit, False, "approval", outcome, self.detail)
        return None


def store_reason(store: LimitStore, exc: BaseException) -> str:
    """Why a call is refused when ``store`` failed with ``exc`` (budgets fail closed)."""
    if isinstance(exc, LimitStoreUnavailable):
        what = exc.message
        extra = (" (the request may have reached the store; if it did, the amount stays counted)"
                 if exc.outcome_unknown else "; nothing was debited")
    else:
        what = f"limit store {store.describe()} failed ({type(exc).__name__}: {exc})"
        extra = ""
    return f"{what}. Budgets fail closed: the call is refused{extra}"


def over_reason(c: Charge, used: float, request: StepRequest) -> str:
    """Why charge ``c`` does not fit its window, which held ``used`` before the call."""
    scope = "" if c.key == "*" else f" for {c.key}"
    window = _window_text(c.window)
    if c.kind == "rate":
        return f"rate limit {c.limit}{scope} reached: {display_amount(used)} of {display_amount(c.max_total)} calls in the last {window}"
    return (f"limit {c.limit}{scope} would be exceeded: {display_amount(used)} of {display_amount(c.max_total)} used in the last "
            f"{window}, this call needs {display_amount(c.amount)}")


def _window_text(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def charges_doc(charges: Sequence[Charge], result: DebitResult | None, forced: Sequence[int] = ()) -> list[dict[str, Any]]:
    """The charges as the verdict's detail lists them (JSON)."""
    out = []
    for i, c in enumerate(charges):
        doc: dict[str, Any] = {
            "limit": c.limit, "kind": c.kind, "scope": c.key, "amount": c.amount,
            "max_total": c.max_total, "window": c.window,
        }
        if result is not None:
            if i < len(result.used):
                doc["used"] = result.used[i]
            doc["over"] = i in result.over
        if i in forced:
            doc["forced"] = True
        out.append(doc)
    return out
