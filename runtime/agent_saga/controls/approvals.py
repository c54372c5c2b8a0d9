"""The approval hook: how the gate asks a named human, and what it accepts as a yes.

``ApprovalProvider`` is the seam; the durable ``ApprovalGateway`` (requests in a shared
store, escalation, expiry) implements it. The gate calls ``request_approval`` only after
the kill switch, the breaker, the limits and the rules have had their say, so a human is
never asked about a call that would be refused anyway.

Invariants (the gate enforces them whatever the provider does):
- Only ``ApprovalOutcome(approved=True, approver="<someone>")`` approves. An approval
  without a named approver proves nothing and is refused; so is a provider that raises
  or returns anything else. Every path that is not a named yes is a BLOCK.
- A denied (or failed) approval hands back any budget reserved for the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..gates import StepRequest

if TYPE_CHECKING:
    from .verdicts import PreFlightDecision

__all__ = ["ApprovalOutcome", "ApprovalProvider"]


@dataclass(frozen=True, slots=True)
class ApprovalOutcome:
    """A human's answer. ``approver`` names who (required for a yes); ``note`` why.

    ``request_id`` identifies the approval request in the provider's store;
    ``break_glass`` marks an emergency override (recorded distinctly, flagged for review).
    """

    approved: bool
    approver: str | None = None
    note: str = ""
    request_id: str | None = None
    break_glass: bool = False

    def to_doc(self) -> dict[str, Any]:
        return {
            "approved": self.approved,
            "approver": self.approver,
            "note": self.note,
            "request_id": self.request_id,
            "break_glass": self.break_glass,
        }


@runtime_checkable
class ApprovalProvider(Protocol):
    """Asks a human about one call and waits (with its own deadline) for the answer."""

    async def request_approval(self, request: StepRequest, verdict: PreFlightDecision) -> ApprovalOutcome:
        """Return the human's answer about ``request``; ``verdict`` says which rule or
        limit asked (``verdict.decided_by``) and why (``verdict.reason``). Expiry denies."""
        ...
