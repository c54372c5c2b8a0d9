"""What recovery will do for one orphaned saga, decided from its records alone.

A saga whose owner died without a terminal record never reached its commit point, so it
is rolled back: every step whose effect happened or may have happened is undone last-in
first-out, exactly as the engine's own rollback would have, and each gets one action:

    ALREADY          resolved before the crash (or by an earlier daemon): nothing to run
    COMPENSATE       committed with a replayable compensation: run the named handler
    RESUME           a compensation was started and never finished (in doubt): run it
                     again with the same idempotency key, unless the ledger says it is done
    RECONCILE        the outcome is unknown and the tool has a reconciler: ask it
    NOTHING_TO_UNDO  a REVERSIBLE step with no compensation
    ESCALATE         anything else: IRREVERSIBLE, unknown outcome, a handler this process
                     has not imported, a compensation that cannot be replayed or that
                     failed. Handed to a human, never guessed

Steps that did not happen (STEP_FAILED, STEP_REFUSED, or a gate verdict only) are not part
of the rollback, as in the engine.

Invariants:
- ``plan_saga`` reads nothing but the records it is given and the two registries; it is
  pure, so a dry run shows exactly what a real run would do.
- A record the plan depends on that is malformed (a compensation descriptor that is not
  ``{handler, kwargs}``, a key that is not the deterministic one), and a record of a type
  this version does not know (``records.is_known_type``), raise ``RecoveryHalted``:
  unreadable state is never acted on.
- An escalated step carries the compensation the log recorded for it (handler, kwargs,
  description; the resolver adds the idempotency key) whenever there is one, so the human
  knows exactly what to run.
- Order is the engine's: by the position of each step's outcome record (its intent for a
  dangling step) in the log, newest first.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..compensation import registered_compensators
from ..idempotency import COMPENSATION_SCOPE, FORWARD_SCOPE, idempotency_key
from ..records import Record, RecordType, is_known_type
from ..rollback import RollbackOutcome
from .errors import RecoveryHalted
from .reconcilers import registered_reconcilers
from .recordtypes import RECOVERED_BY, STEP_RECONCILED, EscalationKind
from .scan import SagaView, where

__all__ = ["Action", "SagaPlan", "StepPlan", "plan_saga"]

R = RecordType
_OUTCOMES = {
    R.STEP_COMMITTED.value: "COMMITTED",
    R.STEP_FAILED.value: "FAILED",
    R.STEP_UNKNOWN.value: "UNKNOWN",
    R.STEP_REFUSED.value: "REFUSED",
}
_ROLLBACK = {
    R.COMPENSATION_STARTED.value: "STARTED",
    R.COMPENSATION_DONE.value: "DONE",
    R.COMPENSATION_FAILED.value: "FAILED",
    R.COMPENSATION_SKIPPED.value: "SKIPPED",
    R.ESCALATED.value: "ESCALATED",
}


class Action(enum.StrEnum):
    """What recovery does for one step (see the module doc)."""

    ALREADY = "ALREADY"
    COMPENSATE = "COMPENSATE"
    RESUME = "RESUME"
    RECONCILE = "RECONCILE"
    NOTHING_TO_UNDO = "NOTHING_TO_UNDO"
    ESCALATE = "ESCALATE"


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step's action. ``outcome`` is what the rollback report will say if it goes as
    planned (for ESCALATE and ALREADY it is final)."""

    step_id: str
    tool: str
    semantics: str
    action: Action
    outcome: RollbackOutcome
    key: str  # the compensation idempotency key (the recovery token)
    compensation: dict[str, Any] | None = None
    kind: EscalationKind | None = None
    reason: str = ""
    outcome_unknown: bool = False
    policy_args: dict[str, Any] | None = None  # RECONCILE
    forward_key: str | None = None  # RECONCILE
    enqueue: bool = False  # ALREADY escalated: put it in the human queue (idempotent)

    def describe(self) -> str:
        """One line for a human: what will be done to the step."""
        handler = (self.compensation or {}).get("handler")
        text = f"{self.step_id} ({self.tool}, {self.semantics}): {self.action.value}"
        if self.action in (Action.COMPENSATE, Action.RESUME):
            text += f" via {handler}"
        if self.kind is not None:
            text += f" [{self.kind.value}]"
        if self.reason:
            text += f" - {self.reason}"
        return text


@dataclass(frozen=True, slots=True)
class SagaPlan:
    """The actions for one saga, newest step first."""

    saga_id: str
    steps: tuple[StepPlan, ...]

    @property
    def escalations(self) -> tuple[StepPlan, ...]:
        """The steps a human must resolve."""
        return tuple(s for s in self.steps if s.action is Action.ESCALATE or s.enqueue)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON (``agent-saga recover --dry-run --json``)."""
        return {
            "saga": self.saga_id,
            "steps": [
                {
                    "step": s.step_id, "tool": s.tool, "semantics": s.semantics,
                    "action": s.action.value, "outcome": s.outcome.value,
                    "handler": (s.compensation or {}).get("handler"),
                    "kind": s.kind.value if s.kind else None, "reason": s.reason,
                }
                for s in self.steps
            ],
        }


class _Facts:
    __slots__ = (
        "commit", "commit_rec", "descriptor", "intent", "order", "outcome", "reconciled",
        "rollback", "rollback_rec", "semantics", "step_id", "tool",
    )

    def __init__(self, step_id: str, order: int) -> None:
        self.step_id = step_id
        self.order = order
        self.tool = "?"
        self.semantics = "?"
        self.intent: dict[str, Any] | None = None
        self.outcome: str | None = None
        self.commit: dict[str, Any] | None = None
        self.commit_rec: Record | None = None
        self.rollback: str | None = None
        self.rollback_rec: Record | None = None
        self.reconciled: Record | None = None
        self.descriptor: dict[str, Any] | None = None  # the newest compensation recorded


def _collect(records: Sequence[Record]) -> list[_Facts]:
    steps: dict[str, _Facts] = {}
    for i, rec in enumerate(records):
        if rec.step is None:
            continue
        f = steps.get(rec.step)
        if f is None:
            f = steps[rec.step] = _Facts(rec.step, i)
        p = rec.payload or {}
        tool = p.get("tool")
        if isinstance(tool, str):
            f.tool = tool
        sem = p.get("semantics")
        if isinstance(sem, str):
            f.semantics = sem
        comp = p.get("compensation")
        if isinstance(comp, dict):
            f.descriptor = comp
        t = rec.type
        if t == R.STEP_INTENT.value:
            f.intent = p
            f.order = i
        elif t in _OUTCOMES:
            f.outcome = _OUTCOMES[t]
            f.order = i
            if t == R.STEP_COMMITTED.value:
                f.commit, f.commit_rec = p, rec
        elif t in _ROLLBACK:
            f.rollback, f.rollback_rec = _ROLLBACK[t], rec
        elif t == STEP_RECONCILED:
            f.reconciled = rec
    return sorted(steps.values(), key=lambda f: f.order, reverse=True)


def _descriptor(value: object, rec: Record) -> dict[str, Any] | None:
    """A compensation descriptor checked for shape; ``None`` stays ``None``."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("handler"), str | None)
        or not isinstance(value.get("kwargs"), dict | None)
    ):
        raise RecoveryHalted(
            f"{where(rec)}: the compensation descriptor {value!r} is not "
            f"{{handler, kwargs, description}}; the sweep stopped without acting. Run "
            f"`agent-saga verify` on the log and resolve this saga by hand",
            location=where(rec), saga_id=rec.saga, step_id=rec.step,
        )
    return value


def plan_saga(
    view: SagaView,
    *,
    has_handler: Callable[[str], bool] | None = None,
    has_reconciler: Callable[[str], bool] | None = None,
) -> SagaPlan:
    """Decide every step's action for the orphaned saga ``view`` (see the module doc).

    ``has_handler`` / ``has_reconciler`` default to this process's registries. Raises
    ``RecoveryHalted`` for a malformed record the plan depends on.
    """
    for rec in view.records:
        if not is_known_type(rec.type):
            raise RecoveryHalted(
                f"{where(rec)}: record type {rec.type!r} is not one this version of agent-saga "
                f"knows, so what it says about the saga cannot be read; recovery does not act on "
                f"a saga it cannot fully read, and stopped without acting. Upgrade agent-saga "
                f"where recovery runs (it must be at least as new as the agents writing the log)",
                location=where(rec), saga_id=rec.saga, step_id=rec.step,
            )
    if has_handler is None:
        handlers = registered_compensators()
        has_handler = handlers.__contains__
    if has_reconciler is None:
        recs = registered_reconcilers()
        has_reconciler = recs.__contains__
    out: list[StepPlan] = []
    for f in _collect(view.records):
        plan = _plan_step(view.saga_id, f, has_handler, has_reconciler)
        if plan is not None:
            out.append(plan)
    return SagaPlan(view.saga_id, tuple(out))


def _plan_step(
    saga_id: str,
    f: _Facts,
    has_handler: Callable[[str], bool],
    has_reconciler: Callable[[str], bool],
) -> StepPlan | None:
    key = idempotency_key(saga_id, f.step_id, COMPENSATION_SCOPE)
    base: dict[str, Any] = {"step_id": f.step_id, "tool": f.tool, "semantics": f.semantics, "key": key}
    unknown = f.outcome != "COMMITTED"

    def escalate(
        kind: EscalationKind,
        reason: str,
        outcome: RollbackOutcome = RollbackOutcome.ESCALATED,
        desc: dict[str, Any] | None = None,
    ) -> StepPlan:
        return StepPlan(
            **base, action=Action.ESCALATE, outcome=outcome, kind=kind, reason=reason,
            outcome_unknown=unknown, compensation=desc if desc is not None else f.descriptor,
        )

    def compensate(desc: dict[str, Any] | None, action: Action, source: str) -> StepPlan:
        if desc is None or desc.get("handler") is None or desc.get("kwargs") is None:
            why = (desc or {}).get("in_process_only") or "it names no handler (fn= only)"
            return escalate(
                EscalationKind.NOT_REPLAYABLE,
                f"the compensation {source} cannot be replayed by another process: {why}",
                desc=desc,
            )
        handler = desc["handler"]
        if not has_handler(handler):
            return escalate(
                EscalationKind.HANDLER_NOT_REGISTERED,
                f"compensation handler {handler!r} is not registered in the recovery process: "
                f"import the module that declares @compensator({handler!r}) (--import)",
                RollbackOutcome.FAILED,
                desc=desc,
            )
        return StepPlan(
            **base, action=action, outcome=RollbackOutcome.COMPENSATED, compensation=desc,
            outcome_unknown=unknown,
        )

    rb = f.rollback
    if rb is not None:
        rec = f.rollback_rec
        assert rec is not None
        p = rec.payload or {}
        if rb == "DONE":
            return StepPlan(**base, action=Action.ALREADY, outcome=RollbackOutcome.COMPENSATED)
        if rb == "SKIPPED":
            if p.get("outcome") == RollbackOutcome.NOTHING_TO_UNDO.value:
                return StepPlan(**base, action=Action.ALREADY, outcome=RollbackOutcome.NOTHING_TO_UNDO)
            return escalate(
                EscalationKind.IRREVERSIBLE,
                str(p.get("reason") or "IRREVERSIBLE: no automated undo exists"),
                RollbackOutcome.NOT_UNDOABLE,
            )
        if rb == "FAILED":
            return escalate(
                EscalationKind.COMPENSATION_FAILED,
                f"the compensation ran and raised {p.get('error_type', '?')}: {p.get('message', '?')}",
                RollbackOutcome.FAILED,
            )
        if rb == "ESCALATED":
            kind = str(p.get("kind"))
            outcome = str(p.get("outcome"))
            return StepPlan(
                **base, action=Action.ALREADY,
                outcome=RollbackOutcome(outcome) if outcome in RollbackOutcome.__members__ else RollbackOutcome.ESCALATED,
                kind=EscalationKind(kind) if kind in EscalationKind.__members__ else EscalationKind.ESCALATED_BEFORE,
                reason=str(p.get("reason") or "escalated by the saga's own rollback"),
                enqueue=True, outcome_unknown=bool(p.get("outcome_unknown")),
                compensation=f.descriptor,
            )
        # STARTED with no outcome: in doubt. Replay it with the same key.
        if rec.redacted:
            return escalate(EscalationKind.NOT_REPLAYABLE, "the in-doubt compensation's record is redacted")
        logged_key = p.get("idempotency_key")
        if logged_key is not None and logged_key != key:
            raise RecoveryHalted(
                f"{where(rec)}: idempotency_key {logged_key!r} is not the deterministic key of "
                f"this step; the sweep stopped without acting (replaying under another key "
                f"could refund twice)",
                location=where(rec), saga_id=saga_id, step_id=f.step_id,
            )
        return compensate(_descriptor(p.get("compensation"), rec), Action.RESUME, "in doubt")

    if f.outcome in ("FAILED", "REFUSED") or (f.outcome is None and f.intent is None):
        return None  # it did not happen

    if f.outcome == "COMMITTED":
        rec = f.commit_rec
        assert rec is not None and f.commit is not None
        if f.semantics == "IRREVERSIBLE":
            return escalate(EscalationKind.IRREVERSIBLE, "IRREVERSIBLE: no automated undo exists", RollbackOutcome.NOT_UNDOABLE)
        if rec.redacted:
            return escalate(EscalationKind.NOT_REPLAYABLE, "the commit record is redacted: its compensation is gone")
        desc = _descriptor(f.commit.get("compensation"), rec)
        if desc is None:
            err = f.commit.get("compensation_error")
            if err is None and f.semantics == "REVERSIBLE":
                return StepPlan(**base, action=Action.NOTHING_TO_UNDO, outcome=RollbackOutcome.NOTHING_TO_UNDO)
            why = err.get("message", "?") if isinstance(err, dict) else "no compensation was recorded"
            return escalate(EscalationKind.NOT_REPLAYABLE, f"no replayable compensation: {why}")
        return compensate(desc, Action.COMPENSATE, "recorded at commit")

    # The outcome is unknown: the process died in the forward call, or it timed out.
    if f.reconciled is not None:
        p = f.reconciled.payload or {}
        if not p.get("happened") or p.get("reversed") is True:
            return StepPlan(
                **base, action=Action.NOTHING_TO_UNDO, outcome=RollbackOutcome.NOTHING_TO_UNDO,
                reason="a reconciler found that it did not happen" if not p.get("happened") else "a reconciler found it already reversed",
                outcome_unknown=True,
            )
        if f.semantics == "IRREVERSIBLE":
            return escalate(EscalationKind.IRREVERSIBLE, "IRREVERSIBLE and it happened (reconciled)", RollbackOutcome.NOT_UNDOABLE)
        return compensate(_descriptor(p.get("compensation"), f.reconciled), Action.COMPENSATE, "found by the reconciler")
    what = "timed out" if f.outcome == "UNKNOWN" else "was interrupted by the owner's death"
    if has_reconciler(f.tool):
        intent = f.intent or {}
        args = intent.get("policy_args")
        return StepPlan(
            **base, action=Action.RECONCILE, outcome=RollbackOutcome.COMPENSATED,
            reason=f"the forward call {what}: asking the {f.tool!r} reconciler",
            outcome_unknown=True, policy_args=args if isinstance(args, dict) else None,
            forward_key=str(intent.get("idempotency_key") or idempotency_key(saga_id, f.step_id, FORWARD_SCOPE)),
        )
    return escalate(
        EscalationKind.OUTCOME_UNKNOWN,
        f"the forward call {what}: it may have happened, and without its result no inverse "
        f"can be derived (register a @reconciler({f.tool!r}) to resolve such steps)",
    )


def step_compensations(records: Sequence[Record]) -> dict[str, tuple[str, dict[str, Any] | None]]:
    """``{step_id: (semantics, newest compensation descriptor or None)}`` of a saga's
    records, for escalations raised from its terminal record (nothing is checked here)."""
    return {f.step_id: (f.semantics, f.descriptor) for f in _collect(records)}


def is_daemon_record(rec: Record) -> bool:
    """True if a recovery daemon wrote ``rec``."""
    return RECOVERED_BY in (rec.payload or {})
