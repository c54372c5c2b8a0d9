"""The gate's answer, with everything an auditor needs to re-derive it.

``PreFlightDecision`` is a ``GateDecision`` (the engine's protocol type) that also carries
``stage`` (which control decided), the ``approval`` outcome if a human was asked, and
``detail``: a JSON object naming every limit the call was charged against (window key,
amount, use before the call, maximum), every rule that objected, and the debit id.

Invariants:
- ``decided_by`` names the control that decided, as ``limit:<name>``, ``rule:<name>``,
  ``limit-store``, ``approval`` (a provider that failed), ``<check name>`` for a kill
  switch or breaker, or ``PreFlightGate`` for an ALLOW no control objected to.
- ``detail`` is plain JSON (no NaN, str keys): it is written to the WAL as is.
- ``detail["debited"]`` says whether the call's spend is counted after this decision:
  true exactly when the call is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ...gates import GateDecision, StepRequest
from ...records import RecordType
from ...wal.base import BaseWAL
from ..approvals import ApprovalOutcome

__all__ = ["PreFlightDecision", "Stage", "write_verdict"]

Stage = Literal["kill_switch", "breaker", "limits", "rules", "approval", "allow"]

#: The order in which the gate consults its controls; the first refusal ends it.
STAGES: tuple[Stage, ...] = ("kill_switch", "breaker", "limits", "rules", "approval")


@dataclass(frozen=True, slots=True)
class PreFlightDecision(GateDecision):
    """A ``GateDecision`` plus which stage decided, the approval, and the audit detail."""

    stage: Stage = "allow"
    approval: ApprovalOutcome | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def quarantined(self) -> bool:
        """True when a kill-switch QUARANTINE refused the step: the engine then raises
        ``SagaQuarantined`` and the saga is frozen instead of rolled back."""
        return self.stage == "kill_switch" and self.detail.get("quarantined") is True

    def wal_fields(self) -> dict[str, Any]:
        """What this decision adds to the engine's GATE_VERDICT payload: ``stage`` and
        ``detail`` (JSON)."""
        return {"stage": self.stage, "detail": dict(self.detail)}

    def to_payload(self, request: StepRequest) -> dict[str, Any]:
        """The GATE_VERDICT payload: the engine's fields plus ``stage`` and ``detail``."""
        return {
            "tool": request.tool,
            "semantics": str(getattr(request.semantics, "value", request.semantics)),
            "verdict": self.verdict,
            "allowed": self.allowed,
            "reason": self.reason,
            "decided_by": self.decided_by,
            "stage": self.stage,
            "detail": dict(self.detail),
        }


def write_verdict(wal: BaseWAL, request: StepRequest, decision: PreFlightDecision) -> int:
    """Append ``decision`` as a GATE_VERDICT record of ``request``'s saga and step."""
    return wal.append(RecordType.GATE_VERDICT.value, request.saga_id, request.step_id, decision.to_payload(request))
