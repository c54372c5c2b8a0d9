"""In-process rollback: undo a saga's steps last-in first-out, and report honestly.

The engine hands over the steps whose effect happened (committed) or may have happened
(unknown outcome), in commit order; ``roll_back`` walks them in reverse and gives each one
exactly one outcome:

    COMPENSATED       the compensation ran and returned
    NOTHING_TO_UNDO   a REVERSIBLE step with nothing to undo (a read)
    NOT_UNDOABLE      an IRREVERSIBLE step that already happened (or may have)
    FAILED            the compensation ran and raised
    ESCALATED         no compensation could be run (none derivable, factory failed,
                      handler not registered): handed to a human, never guessed

Invariants:
- A failing step never stops the rollback of the steps before it.
- ``RollbackReport.clean`` is True only if every step is COMPENSATED or NOTHING_TO_UNDO
  and every rollback record reached the WAL; anything else is partial, never rounded up.
- WAL records per step: COMPENSATION_STARTED (durable before the call) then
  COMPENSATION_DONE / COMPENSATION_FAILED (durable); COMPENSATION_SKIPPED for nothing to
  undo and not undoable; ESCALATED when nothing can be run. Then SAGA_ROLLED_BACK or
  SAGA_ROLLBACK_PARTIAL with the report (durable).
- A WAL failure during rollback does not stop compensations from running (the undo
  matters more than its record); it makes the report not clean and is listed in it.
- Compensations run with the deterministic key ``idempotency_key(saga, step,
  "compensate")`` injected into callables that accept it, the same key a recovery daemon
  would use for the same step.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import observe as _observe
from .compensation import Compensation, coerce_compensation, get_compensator
from .context import step_id_var
from .errors import SagaError
from .executor import ToolExecutor
from .idempotency import COMPENSATION_SCOPE, idempotency_key
from .invoke import call
from .payloads import describe_error, error_text
from .records import RecordType
from .semantics import ActionSemantics
from .wal.base import BaseWAL

__all__ = ["RollbackOutcome", "RollbackReport", "StepOutcome"]

log = logging.getLogger("agent_saga.rollback")

class RollbackOutcome(enum.StrEnum):
    """What a rollback did for one step (see the module doc)."""

    COMPENSATED = "COMPENSATED"
    NOTHING_TO_UNDO = "NOTHING_TO_UNDO"
    NOT_UNDOABLE = "NOT_UNDOABLE"
    FAILED = "FAILED"
    ESCALATED = "ESCALATED"


_RESTORED = frozenset({RollbackOutcome.COMPENSATED, RollbackOutcome.NOTHING_TO_UNDO})


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """One step's line in a ``RollbackReport``; ``error`` says why it was not restored."""

    step_id: str
    tool: str
    semantics: ActionSemantics
    outcome: RollbackOutcome
    error: str | None = None

    @property
    def restored(self) -> bool:
        """True if the step's effect is gone (COMPENSATED or NOTHING_TO_UNDO)."""
        return self.outcome in _RESTORED


@dataclass(frozen=True, slots=True)
class RollbackReport:
    """The result of rolling a saga back: one ``StepOutcome`` per step, newest first.

    Guarantee: ``clean`` is True only when every step was restored and every rollback
    record was written; callers and auditors can always tell a clean restoration from a
    partial one that needs a human. ``wal_errors`` lists log failures met on the way.
    """

    saga_id: str
    steps: tuple[StepOutcome, ...]
    wal_errors: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """True only if every step is COMPENSATED / NOTHING_TO_UNDO and the log is whole."""
        return not self.wal_errors and all(s.outcome in _RESTORED for s in self.steps)

    @property
    def not_restored(self) -> tuple[StepOutcome, ...]:
        """The steps a human must look at (NOT_UNDOABLE, FAILED, ESCALATED)."""
        return tuple(s for s in self.steps if s.outcome not in _RESTORED)

    def counts(self) -> dict[str, int]:
        """Number of steps per outcome name (only outcomes that occurred)."""
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.outcome.value] = out.get(s.outcome.value, 0) + 1
        return out

    def summary(self) -> str:
        """One human line: clean or partial, and the counts."""
        counts = ", ".join(f"{n} {k.lower().replace('_', ' ')}" for k, n in self.counts().items())
        state = "cleanly" if self.clean else "PARTIALLY"
        text = f"saga {self.saga_id} rolled back {state}: {len(self.steps)} step(s)"
        if counts:
            text += f" ({counts})"
        if self.wal_errors:
            text += f"; {len(self.wal_errors)} WAL error(s): {self.wal_errors[0]}"
        return text

    def to_payload(self) -> dict[str, Any]:
        """The JSON form written in the saga's terminal WAL record."""
        return {
            "clean": self.clean,
            "counts": self.counts(),
            "steps": [
                {"step": s.step_id, "tool": s.tool, "outcome": s.outcome.value, "error": s.error}
                for s in self.steps
            ],
            "wal_errors": list(self.wal_errors),
        }


@dataclass(slots=True)
class RollbackEntry:
    """The engine's in-memory view of a step that needs undoing (internal)."""

    step_id: str
    tool: str
    semantics: ActionSemantics
    compensation: Compensation | None
    error: str | None = None  # why no usable compensation exists (escalate)
    unknown: bool = False  # the outcome is unknown: derive from factory(None)
    factory: Callable[[Any], Any] | None = None


class _Log:
    """WAL access that records failures instead of raising them (see module invariants)."""

    __slots__ = ("errors", "saga_id", "wal")

    def __init__(self, wal: BaseWAL, saga_id: str) -> None:
        self.wal = wal
        self.saga_id = saga_id
        self.errors: list[str] = []

    def _failed(self, exc: Exception) -> None:
        text = error_text(exc)
        if text not in self.errors:
            self.errors.append(text)
            log.error("saga %s: WAL failed during rollback: %s", self.saga_id, text)

    def append(self, type: str, step: str | None, payload: dict[str, Any]) -> int | None:
        try:
            return self.wal.append(type, self.saga_id, step, payload)
        except Exception as exc:  # noqa: BLE001 - reported in the rollback report
            self._failed(exc)
            return None

    async def barrier(self, seq: int | None) -> None:
        if seq is None:
            return
        try:
            await self.wal.barrier(seq)
        except Exception as exc:  # noqa: BLE001 - reported in the rollback report
            self._failed(exc)


async def roll_back(
    saga_id: str,
    wal: BaseWAL,
    executor: ToolExecutor,
    entries: list[RollbackEntry],
    cause: BaseException | None,
) -> RollbackReport:
    """Undo ``entries`` newest first and write the saga's terminal record; never raises
    for a step's failure (that is what the report is for)."""
    wlog = _Log(wal, saga_id)
    outcomes: list[StepOutcome] = []
    obs = _observe.current
    for entry in reversed(entries):
        token = step_id_var.set(entry.step_id)
        seen = None if obs is None else _observe.safely(
            obs.rollback_step_started, saga_id, entry.step_id, entry.tool, entry.semantics.value)
        done: StepOutcome | None = None
        try:
            done = await _undo(entry, wlog, executor)
            outcomes.append(done)
        finally:
            step_id_var.reset(token)
            if obs is not None:
                _observe.safely(obs.rollback_step_ended, seen, done.outcome.value if done else "INTERRUPTED",
                                done.error if done else "interrupted")
    report = RollbackReport(saga_id, tuple(outcomes), tuple(wlog.errors))
    payload = report.to_payload()
    if cause is not None:
        payload["cause"] = describe_error(cause)
    terminal = RecordType.SAGA_ROLLED_BACK if report.clean else RecordType.SAGA_ROLLBACK_PARTIAL
    await wlog.barrier(wlog.append(terminal.value, None, payload))
    if len(wlog.errors) != len(report.wal_errors):
        # The terminal record itself failed: the report must say so.
        report = RollbackReport(saga_id, report.steps, tuple(wlog.errors))
    if obs is not None:
        _observe.safely(obs.rollback_ended, saga_id, report.clean)
    if report.clean:
        log.info("%s", report.summary())
    else:
        log.error("%s", report.summary())
    return report


async def _undo(entry: RollbackEntry, wlog: _Log, executor: ToolExecutor) -> StepOutcome:
    step, tool, sem = entry.step_id, entry.tool, entry.semantics
    base = {"tool": tool, "semantics": sem.value, "outcome_unknown": entry.unknown}

    def outcome(kind: RollbackOutcome, error: str | None = None) -> StepOutcome:
        return StepOutcome(step, tool, sem, kind, error)

    async def escalate(reason: str) -> StepOutcome:
        log.error("saga %s step %s (%s) escalated to a human: %s", wlog.saga_id, step, tool, reason)
        await wlog.barrier(wlog.append(RecordType.ESCALATED.value, step, {**base, "reason": reason}))
        return outcome(RollbackOutcome.ESCALATED, reason)

    if sem is ActionSemantics.IRREVERSIBLE:
        reason = "IRREVERSIBLE: no automated undo exists"
        if entry.unknown:
            reason += " (and the step's outcome is unknown: it may have happened)"
        wlog.append(
            RecordType.COMPENSATION_SKIPPED.value, step, {**base, "outcome": "NOT_UNDOABLE", "reason": reason}
        )
        return outcome(RollbackOutcome.NOT_UNDOABLE, reason)

    comp = entry.compensation
    if entry.unknown:
        if entry.factory is None:
            comp = None  # REVERSIBLE with nothing to undo, whatever happened
        else:
            try:
                comp = coerce_compensation(entry.factory(None), tool)
            except Exception as exc:  # noqa: BLE001 - any failure here means: cannot derive
                return await escalate(
                    f"outcome unknown and no compensation can be derived without a result "
                    f"(factory(None) raised {error_text(exc)})"
                )
            if comp is None:
                return await escalate(
                    "outcome unknown and the compensation factory cannot derive an inverse "
                    "without the forward result (factory(None) returned None)"
                )
    elif comp is None and entry.error is not None:
        return await escalate(entry.error)

    if comp is None:
        wlog.append(
            RecordType.COMPENSATION_SKIPPED.value,
            step,
            {**base, "outcome": "NOTHING_TO_UNDO", "reason": "nothing to undo"},
        )
        return outcome(RollbackOutcome.NOTHING_TO_UNDO)

    fn = comp.fn
    if fn is None:
        assert comp.handler is not None  # Compensation guarantees one of the two
        try:
            fn = get_compensator(comp.handler, comp.kwargs)
        except SagaError as exc:
            return await escalate(error_text(exc))

    try:
        descriptor: dict[str, Any] = comp.descriptor()
    except SagaError as exc:
        # Not replayable (not JSON / looks like a secret): run it here, log no kwargs.
        descriptor = {
            "handler": comp.handler,
            "kwargs": None,
            "description": comp.description,
            "in_process_only": error_text(exc),
        }
    key = idempotency_key(wlog.saga_id, step, COMPENSATION_SCOPE)
    await wlog.barrier(
        wlog.append(
            RecordType.COMPENSATION_STARTED.value,
            step,
            {**base, "compensation": descriptor, "idempotency_key": key},
        )
    )
    try:
        await call(fn, comp.kwargs, key, executor)
    except (Exception, asyncio.CancelledError) as exc:
        err = describe_error(exc)
        log.error(
            "saga %s step %s (%s): compensation %s failed: %s: %s",
            wlog.saga_id, step, tool, comp.handler or getattr(fn, "__qualname__", fn),
            err["error_type"], err["message"],
        )
        await wlog.barrier(wlog.append(RecordType.COMPENSATION_FAILED.value, step, {**base, **err}))
        return outcome(RollbackOutcome.FAILED, f"{err['error_type']}: {err['message']}")
    await wlog.barrier(wlog.append(RecordType.COMPENSATION_DONE.value, step, dict(base)))
    return outcome(RollbackOutcome.COMPENSATED)
