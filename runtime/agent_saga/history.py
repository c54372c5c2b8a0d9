"""Fold a log's records into the state of each saga and each step, in one pass.

This is the read model shared by ``agent-saga inspect``, certification and recovery: it
never guesses. A saga with no terminal record is IN_FLIGHT (its owner is running, or died);
a step with an intent and no outcome is DANGLING (it may have happened).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .records import ExtensionType, Record, RecordType

R = RecordType
_TORN_TAIL = ExtensionType.WAL_TORN_TAIL.value

# Step states, in the order a step can move through them.
INTENT = "INTENT"  # intent durable, no outcome: may have happened (dangling)
COMMITTED = "COMMITTED"
FAILED = "FAILED"  # the forward raised: did not complete
UNKNOWN = "UNKNOWN"  # timed out: may have happened
REFUSED = "REFUSED"  # a control refused it: did not happen
COMPENSATING = "COMPENSATING"  # compensation started, no outcome yet
COMPENSATED = "COMPENSATED"
COMPENSATION_FAILED = "COMPENSATION_FAILED"
SKIPPED = "SKIPPED"  # nothing to undo, or not undoable (see the record's reason)
ESCALATED = "ESCALATED"

_STEP_STATE = {
    R.STEP_INTENT.value: INTENT,
    R.STEP_COMMITTED.value: COMMITTED,
    R.STEP_FAILED.value: FAILED,
    R.STEP_UNKNOWN.value: UNKNOWN,
    R.STEP_REFUSED.value: REFUSED,
    R.COMPENSATION_STARTED.value: COMPENSATING,
    R.COMPENSATION_DONE.value: COMPENSATED,
    R.COMPENSATION_FAILED.value: COMPENSATION_FAILED,
    R.COMPENSATION_SKIPPED.value: SKIPPED,
    R.ESCALATED.value: ESCALATED,
}

# Saga statuses.
IN_FLIGHT = "IN_FLIGHT"
COMPLETED = "COMPLETED"
ROLLED_BACK = "ROLLED_BACK"
ROLLBACK_PARTIAL = "ROLLBACK_PARTIAL"

#: The saga status each terminal record type sets (public: the debugger's index uses it).
SAGA_STATUS = {
    R.SAGA_COMPLETED.value: COMPLETED,
    R.SAGA_ROLLED_BACK.value: ROLLED_BACK,
    R.SAGA_ROLLBACK_PARTIAL.value: ROLLBACK_PARTIAL,
}
_SAGA_STATUS = SAGA_STATUS


@dataclass(slots=True)
class StepState:
    """What the log says about one step."""

    step_id: str
    tool: str = "?"
    semantics: str = "?"
    state: str = INTENT
    compensation: dict[str, Any] | None = None
    error: str | None = None
    first_seq: int = 0
    last_seq: int = 0


@dataclass(slots=True)
class SagaState:
    """What the log says about one saga."""

    saga_id: str
    name: str | None = None
    status: str = IN_FLIGHT
    started_ts: int = 0
    last_ts: int = 0
    first_seq: int = 0
    last_seq: int = 0
    steps: dict[str, StepState] = field(default_factory=dict)

    @property
    def dangling(self) -> list[StepState]:
        """Steps whose effect may be standing with no recorded resolution."""
        return [s for s in self.steps.values() if s.state in (INTENT, UNKNOWN, COMPENSATING)]


def fold(records: Iterable[Record]) -> dict[str, SagaState]:
    """Reduce records (in log order) to saga states, keyed by saga id, in first-seen order."""
    sagas: dict[str, SagaState] = {}
    for rec in records:
        if rec.type == _TORN_TAIL or rec.saga == "wal":
            continue
        saga = sagas.get(rec.saga)
        if saga is None:
            saga = sagas[rec.saga] = SagaState(rec.saga, started_ts=rec.ts, first_seq=rec.seq)
        saga.last_ts = rec.ts
        saga.last_seq = rec.seq
        p = rec.payload or {}
        if rec.type == R.SAGA_STARTED.value:
            saga.name = p.get("name")
            continue
        status = _SAGA_STATUS.get(rec.type)
        if status is not None:
            saga.status = status
            continue
        state = _STEP_STATE.get(rec.type)
        if state is None or rec.step is None:
            continue
        step = saga.steps.get(rec.step)
        if step is None:
            step = saga.steps[rec.step] = StepState(rec.step, first_seq=rec.seq)
        step.last_seq = rec.seq
        step.tool = p.get("tool", step.tool)
        step.semantics = p.get("semantics", step.semantics)
        if rec.type == R.STEP_COMMITTED.value:
            step.compensation = p.get("compensation")
        err = p.get("message") or p.get("reason") or p.get("error")
        if err and state in (FAILED, UNKNOWN, COMPENSATION_FAILED, ESCALATED, SKIPPED):
            step.error = str(err)
        step.state = state
    return sagas


def saga_states(records: Iterable[Record]) -> dict[str, SagaState]:
    """What the log says about each saga: its status and every step's state, keyed by saga
    id in first-seen order (``records`` in log order, e.g. ``r for _, r in read_log(path)``).

    Never guesses: a saga with no terminal record is ``IN_FLIGHT``; a step with an intent
    and no outcome is ``INTENT`` (it may have happened)."""
    return fold(records)
