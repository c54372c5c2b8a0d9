"""The escalations implied by a saga's own partial rollback.

A saga whose in-process rollback ended ``SAGA_ROLLBACK_PARTIAL`` is resolved (its caller got
``RollbackIncomplete``), so recovery never touches it; but the human queue must be
complete, so each step its report lists as not restored is queued, with the compensation
the saga's earlier records hold for it. Ids are deterministic: queueing twice is a no-op.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..idempotency import COMPENSATION_SCOPE, idempotency_key
from ..records import Record
from .ledger import Escalation, escalation_id
from .plan import step_compensations
from .recordtypes import EscalationKind
from .resolver import escalated_compensation

__all__ = ["owner_escalations"]

_OUTCOME_KIND = {
    "NOT_UNDOABLE": EscalationKind.IRREVERSIBLE,
    "FAILED": EscalationKind.COMPENSATION_FAILED,
    "ESCALATED": EscalationKind.ESCALATED_BEFORE,
}


def owner_escalations(
    rec: Record, source: str, daemon_id: str, earlier: Sequence[Record] = ()
) -> list[Escalation]:
    """The escalations a SAGA_ROLLBACK_PARTIAL written by the saga's owner implies: one
    per step its report lists as not restored (deterministic ids: queueing twice is a
    no-op), each with the compensation the saga's ``earlier`` records hold for the step."""
    out: list[Escalation] = []
    facts = step_compensations(earlier)
    steps = (rec.payload or {}).get("steps")
    for s in steps if isinstance(steps, list) else []:
        if not isinstance(s, dict):
            continue
        kind = _OUTCOME_KIND.get(str(s.get("outcome")))
        if kind is None:
            continue
        step = s.get("step") if isinstance(s.get("step"), str) else None
        semantics, desc = facts.get(step or "", ("?", None))
        out.append(Escalation(
            id=escalation_id(rec.saga, step), saga_id=rec.saga, step_id=step,
            tool=str(s.get("tool", "?")), semantics=str(s.get("semantics") or semantics), kind=kind.value,
            reason=f"the saga's own rollback left it {s.get('outcome')}: {s.get('error')}",
            outcome_unknown=False, source=source, daemon=daemon_id, ts=rec.ts / 1e6,
            compensation=escalated_compensation(
                desc, idempotency_key(rec.saga, step, COMPENSATION_SCOPE)
            ) if step else None,
        ))
    return out
