"""Carry out one saga's plan: compensate, reconcile, escalate, then close the saga.

Per compensation, in this order (a crash between any two steps is safe):

    1. the ledger already says done?     -> COMPENSATION_DONE {via: "ledger"}, no call
    2. COMPENSATION_STARTED              durable before the handler is called
    3. ledger: attempt                   (how many calls a token had: diagnostics)
    4. the claim is still ours?          else stop (``ClaimLost``), nothing called
    5. the handler, with idempotency_key = the recovery token
    6. ledger: done                      durable: from here no daemon calls it again
    7. COMPENSATION_DONE                 (durable with the next fence)

A crash between 5 and 6 leaves the call in doubt: the next daemon calls the handler again
with the same key (which is what the key is for). A crash between 6 and 7 does not: the
next daemon finds the ledger entry and only writes the record.

The claim is checked before every log record too (``_append``: 1, 2 and 7 above, and
every STEP_RECONCILED, COMPENSATION_SKIPPED, COMPENSATION_FAILED, ESCALATED and terminal
record): a daemon that lost its claim stops there (``ClaimLost``) as if it had crashed
there, and the new holder goes on from the log and the ledger. Ledger entries are not
checked: ``attempt`` and ``done`` record a call that is about to happen or happened, and a
human-queue entry repeats an ESCALATED record already in the log under a deterministic id.

Then ESCALATED records and human-queue entries for every step not restored, and one
terminal record (SAGA_ROLLED_BACK if every step is restored, else SAGA_ROLLBACK_PARTIAL)
carrying the same report the engine writes, plus ``recovered_by``, durable before the
saga's journal entry (``close``: with claims and ledger in one Redis namespace, that
entry and the claim's release are one request; a crash before it leaves the claim to
expire, after it nothing is left to do).

Invariants:
- Never guesses: a handler that raises, times out, is missing or cannot be replayed, an
  IRREVERSIBLE step and an unknown outcome nobody can reconcile are all escalated.
- Acts with its writer's rights only: a compensation whose handler or credential_ref the
  allow-list does not grant to the saga's writer (``recovery.grants``) is escalated
  (``NOT_ALLOWED``) before anything is called.
- A WAL or ledger failure stops the saga where it is (the next sweep resumes from the
  log); it is never reported as resolved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..clocks import SYSTEM_CLOCK, Clock
from ..compensation import get_compensator
from ..context import saga_id_var, step_id_var
from ..errors import HandlerNotRegistered, SagaError
from ..executor import ToolExecutor
from ..faults import fault_point
from ..idempotency import FORWARD_SCOPE, idempotency_key
from ..invoke import Expired, call
from ..payloads import describe_error
from ..records import RecordType
from ..rollback import RollbackOutcome, RollbackReport, StepOutcome
from ..semantics import ActionSemantics
from ..wal.base import BaseWAL
from .grants import DEFAULT_GRANTS, Grants
from .ledger import Escalation, LedgerEntry, LedgerKind, RecoveryLedger, escalation_id
from .plan import Action, SagaPlan, StepPlan
from .reconcilers import coerce_observation, get_reconciler
from .recordtypes import RECOVERED_BY, RECOVERY_STARTED, STEP_RECONCILED, EscalationKind
from .scan import SagaView

__all__ = ["Resolution", "SagaResult"]

log = logging.getLogger("agent_saga.recovery")

R = RecordType


@dataclass(frozen=True, slots=True)
class SagaResult:
    """What recovery did with one saga.

    ``status``: ROLLED_BACK or ROLLBACK_PARTIAL (resolved by this daemon); PLANNED (dry
    run); or why it was left alone: LIVE, QUARANTINED, RESOLVED (someone else finished
    it), CLAIMED (another daemon holds it), WRITER_BUSY, WRITER_HELD (its writer is
    broken or quarantined), CLAIM_LOST, FAILED.
    """

    saga_id: str
    status: str
    report: RollbackReport | None = None
    plan: SagaPlan | None = None
    escalations: tuple[str, ...] = ()
    compensations_run: int = 0
    skipped_by_ledger: int = 0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON."""
        return {
            "saga": self.saga_id,
            "status": self.status,
            "report": None if self.report is None else self.report.to_payload(),
            "plan": None if self.plan is None else self.plan.to_dict(),
            "escalations": list(self.escalations),
            "compensations_run": self.compensations_run,
            "skipped_by_ledger": self.skipped_by_ledger,
            "error": self.error,
        }


def escalated_compensation(desc: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    """What an escalation hands the human: the recorded descriptor (handler, kwargs,
    description) and the idempotency key to call the handler with, so running it by hand
    cannot apply it twice. None when the log recorded no compensation for the step."""
    if desc is None:
        return None
    return {**desc, "idempotency_key": key}


def _semantics(value: str) -> ActionSemantics:
    try:
        return ActionSemantics(value)
    except ValueError:
        return ActionSemantics.COMPENSABLE  # unknown in the log: reported as the riskier kind


class Resolution:
    """One saga's resolution by one daemon (internal to ``RecoveryDaemon``)."""

    def __init__(
        self,
        *,
        view: SagaView,
        plan: SagaPlan,
        wal: BaseWAL,
        ledger: RecoveryLedger,
        daemon_id: str,
        source: str,
        executor: ToolExecutor,
        check_claim: Callable[[], None],
        compensation_timeout: float | None,
        claim_token: str,
        clock: Clock = SYSTEM_CLOCK,
        calls: asyncio.Semaphore | None = None,
        close: Callable[[LedgerEntry], Awaitable[None]] | None = None,
        grants: Grants = DEFAULT_GRANTS,
        writer: str = "",
    ) -> None:
        self.view = view
        self.grants = grants
        self.writer = writer
        self.plan = plan
        self.wal = wal
        self.ledger = ledger
        self.daemon_id = daemon_id
        self.source = source
        self.executor = executor
        self.check_claim = check_claim
        self.timeout = compensation_timeout
        self.claim_token = claim_token
        self.clock = clock
        self.calls = calls
        self.close = close if close is not None else ledger.record
        self.saga_id = view.saga_id
        self.escalated: list[str] = []
        self.ran = 0
        self.by_ledger = 0

    # ------------------------------------------------------------------ records

    def _append(self, type_: str, step: str | None, payload: dict[str, Any]) -> int:
        # Every log record goes through here, so every one is preceded by the claim's
        # check: a daemon that lost its claim raises ``ClaimLost`` instead of writing its
        # records beside the new holder's (a second terminal record, an escalation the
        # holder also writes). What must be kept whatever the claim says (the ledger's
        # done entry of a call that ran) is written before the record that follows it.
        self.check_claim()
        payload[RECOVERED_BY] = self.daemon_id
        return self.wal.append(type_, self.saga_id, step, payload)

    def _base(self, sp: StepPlan) -> dict[str, Any]:
        return {"tool": sp.tool, "semantics": sp.semantics, "outcome_unknown": sp.outcome_unknown}

    def _outcome(self, sp: StepPlan, kind: RollbackOutcome, error: str | None = None) -> StepOutcome:
        return StepOutcome(sp.step_id, sp.tool, _semantics(sp.semantics), kind, error)

    async def _enqueue(self, sp: StepPlan, kind: EscalationKind, reason: str, compensation: dict[str, Any] | None) -> None:
        esc = Escalation(
            id=escalation_id(self.saga_id, sp.step_id), saga_id=self.saga_id, step_id=sp.step_id,
            tool=sp.tool, semantics=sp.semantics, kind=kind.value, reason=reason,
            outcome_unknown=sp.outcome_unknown, source=self.source, daemon=self.daemon_id,
            ts=self.clock.time(), compensation=escalated_compensation(compensation, sp.key),
        )
        await self.ledger.escalate(esc)
        self.escalated.append(esc.id)

    async def _escalate(
        self,
        sp: StepPlan,
        kind: EscalationKind,
        reason: str,
        outcome: RollbackOutcome = RollbackOutcome.ESCALATED,
        compensation: dict[str, Any] | None = None,
    ) -> StepOutcome:
        log.error("saga %s step %s (%s) escalated to a human [%s]: %s", self.saga_id, sp.step_id, sp.tool, kind.value, reason)
        seq = self._append(
            R.ESCALATED.value, sp.step_id,
            {**self._base(sp), "reason": reason, "kind": kind.value, "outcome": outcome.value},
        )
        await self.wal.barrier(seq)
        await self._enqueue(sp, kind, reason, compensation)
        return self._outcome(sp, outcome, reason)

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """One of the daemon's ``concurrency`` compensation slots, for one call."""
        return self.calls if self.calls is not None else contextlib.nullcontext()

    async def _call(self, fn: Callable[..., Any], args: dict[str, Any], key: str) -> tuple[Any, Exception | None]:
        """Call a handler or reconciler: ``(its result, None)`` or ``(None, what it raised)``
        (``Expired`` past the timeout), to be handled once its slot is free again."""
        try:
            return await call(fn, args, key, self.executor, self.timeout), None
        except Exception as exc:  # noqa: BLE001 - the caller escalates it
            return None, exc

    def _entry(self, kind: LedgerKind, sp: StepPlan, **detail: Any) -> LedgerEntry:
        return LedgerEntry(kind, sp.key, self.saga_id, sp.step_id, self.daemon_id, detail=detail)

    # ------------------------------------------------------------------ run

    async def run(self) -> SagaResult:
        """Resolve the saga: compensate, reconcile or escalate each step, in plan order."""
        token = saga_id_var.set(self.saga_id)
        try:
            return await self._run()
        finally:
            saga_id_var.reset(token)

    async def _run(self) -> SagaResult:
        plan = self.plan
        tokens = [s.key for s in plan.steps if s.action in (Action.COMPENSATE, Action.RESUME, Action.RECONCILE)]
        done = await self.ledger.completed(tokens) if tokens else set()
        self._append(
            RECOVERY_STARTED, None,
            {
                "claim": self.claim_token, "owner_last_seen_us": self.view.owner_last_ts,
                "lease_seconds": self.view.lease_seconds, "steps": len(plan.steps),
            },
        )
        outcomes: list[StepOutcome] = []
        for sp in plan.steps:
            stoken = step_id_var.set(sp.step_id)
            try:
                outcomes.append(await self._step(sp, done))
            finally:
                step_id_var.reset(stoken)
        report = RollbackReport(self.saga_id, tuple(outcomes))
        payload = report.to_payload()
        payload["cause"] = {
            "error_type": "OwnerLost",
            "message": (
                f"the owner's lease expired (last sign of life {self.view.owner_last_ts / 1e6:.3f}, "
                f"lease {self.view.lease_seconds}s) before the saga finished; rolled back by "
                f"recovery daemon {self.daemon_id}"
            ),
        }
        fault_point("recovery.before_terminal")
        terminal = R.SAGA_ROLLED_BACK if report.clean else R.SAGA_ROLLBACK_PARTIAL
        seq = self._append(terminal.value, None, payload)
        await self.wal.barrier(seq)
        # The saga's journal entry: from here the claim guards nothing (the terminal record
        # is durable), so ``close`` may release it in the same request.
        await self.close(
            LedgerEntry(LedgerKind.SAGA, self.saga_id, self.saga_id, None, self.daemon_id, detail={"status": terminal.value})
        )
        level = logging.INFO if report.clean else logging.ERROR
        log.log(level, "recovered: %s", report.summary())
        return SagaResult(
            self.saga_id, "ROLLED_BACK" if report.clean else "ROLLBACK_PARTIAL", report, plan,
            tuple(self.escalated), self.ran, self.by_ledger,
        )

    async def _step(self, sp: StepPlan, done: set[str]) -> StepOutcome:
        act = sp.action
        if act is Action.ALREADY:
            if sp.enqueue:
                await self._enqueue(sp, sp.kind or EscalationKind.ESCALATED_BEFORE, sp.reason, sp.compensation)
            restored = sp.outcome in (RollbackOutcome.COMPENSATED, RollbackOutcome.NOTHING_TO_UNDO)
            return self._outcome(sp, sp.outcome, None if restored else sp.reason)
        if act is Action.NOTHING_TO_UNDO:
            self._append(
                R.COMPENSATION_SKIPPED.value, sp.step_id,
                {**self._base(sp), "outcome": "NOTHING_TO_UNDO", "reason": sp.reason or "nothing to undo"},
            )
            return self._outcome(sp, RollbackOutcome.NOTHING_TO_UNDO)
        if act is Action.ESCALATE:
            assert sp.kind is not None
            return await self._escalate(sp, sp.kind, sp.reason, sp.outcome, sp.compensation)
        if act is Action.RECONCILE:
            return await self._reconcile(sp, done)
        assert sp.compensation is not None
        return await self._compensate(sp, sp.compensation, done, resumed=act is Action.RESUME)

    async def _reconcile(self, sp: StepPlan, done: set[str]) -> StepOutcome:
        fn = get_reconciler(sp.tool)
        if fn is None:  # unregistered since the plan was made
            return await self._escalate(sp, EscalationKind.OUTCOME_UNKNOWN, f"no reconciler for {sp.tool!r}")
        key = sp.forward_key or idempotency_key(self.saga_id, sp.step_id, FORWARD_SCOPE)
        async with self._slot():
            self.check_claim()  # after the wait for a slot: the claim is still ours
            got, failure = await self._call(fn, sp.policy_args or {}, key)
        if failure is None:
            try:
                obs = coerce_observation(got, sp.tool)
                comp = obs.undo(sp.tool) if obs.exists and obs.reversed_ is not True else None
            except Exception as exc:  # noqa: BLE001 - it cannot tell: a human decides
                failure = exc
        if isinstance(failure, Expired):
            return await self._escalate(sp, EscalationKind.RECONCILE_FAILED, f"the reconciler did not answer within {self.timeout}s")
        if failure is not None:
            err = describe_error(failure)
            return await self._escalate(
                sp, EscalationKind.RECONCILE_FAILED, f"the reconciler raised {err['error_type']}: {err['message']}"
            )
        seen = obs.to_dict()
        if obs.exists is None:
            return await self._escalate(
                sp, EscalationKind.OUTCOME_UNKNOWN, f"the reconciler could not tell whether it happened ({seen['detail'] or 'no detail'})"
            )
        if not obs.exists or obs.reversed_ is True:
            reason = "a reconciler found that it did not happen" if not obs.exists else "a reconciler found it already reversed"
            self._append(STEP_RECONCILED, sp.step_id, {"tool": sp.tool, "happened": obs.exists, "reversed": obs.reversed_, "observation": seen})
            self._append(
                R.COMPENSATION_SKIPPED.value, sp.step_id,
                {**self._base(sp), "outcome": "NOTHING_TO_UNDO", "reason": reason, "reconciled": True},
            )
            return self._outcome(sp, RollbackOutcome.NOTHING_TO_UNDO)
        if sp.semantics == ActionSemantics.IRREVERSIBLE.value:
            self._append(STEP_RECONCILED, sp.step_id, {"tool": sp.tool, "happened": True, "observation": seen, "compensation": None})
            return await self._escalate(sp, EscalationKind.IRREVERSIBLE, "IRREVERSIBLE and it happened (reconciled)", RollbackOutcome.NOT_UNDOABLE)
        if comp is None or comp.handler is None:
            return await self._escalate(
                sp, EscalationKind.NOT_REPLAYABLE,
                f"it happened and still stands ({seen['detail'] or 'no detail'}), but the reconciler named no compensation handler to undo it",
            )
        try:
            desc = comp.descriptor()
        except SagaError as exc:
            return await self._escalate(sp, EscalationKind.NOT_REPLAYABLE, f"the reconciler's compensation is not replayable: {exc.message}")
        self._append(STEP_RECONCILED, sp.step_id, {"tool": sp.tool, "happened": True, "observation": seen, "compensation": desc})
        return await self._compensate(sp, desc, done, resumed=False)

    async def _compensate(self, sp: StepPlan, desc: dict[str, Any], done: set[str], *, resumed: bool) -> StepOutcome:
        base = self._base(sp)
        handler = str(desc["handler"])
        if sp.key in done:
            # Done by an earlier daemon that died before its WAL record: do not call again.
            self.by_ledger += 1
            self._append(R.COMPENSATION_DONE.value, sp.step_id, {**base, "via": "ledger"})
            return self._outcome(sp, RollbackOutcome.COMPENSATED)
        kwargs = desc.get("kwargs") or {}
        refused = self.grants.refuses(self.writer, handler, kwargs if isinstance(kwargs, dict) else {})
        if refused is not None:
            # The log names the call; the saga's writer must hold the right to ask for it.
            return await self._escalate(sp, EscalationKind.NOT_ALLOWED, refused, RollbackOutcome.FAILED, desc)
        try:
            fn = get_compensator(handler, desc.get("kwargs") if isinstance(desc.get("kwargs"), dict) else None)
        except HandlerNotRegistered as exc:
            return await self._escalate(sp, EscalationKind.HANDLER_NOT_REGISTERED, exc.message, RollbackOutcome.FAILED, desc)
        seq = self._append(
            R.COMPENSATION_STARTED.value, sp.step_id,
            {**base, "compensation": desc, "idempotency_key": sp.key, "resumed": resumed},
        )
        await self.wal.barrier(seq)
        await self.ledger.record(self._entry(LedgerKind.ATTEMPT, sp, handler=handler))
        async with self._slot():
            self.check_claim()  # after the wait for a slot: the claim is still ours
            fault_point("recovery.before_compensation")
            self.ran += 1
            _, failure = await self._call(fn, desc.get("kwargs") or {}, sp.key)
        # A call that failed is recorded only while the claim is ours: a daemon that lost
        # it stops at COMPENSATION_FAILED's append, and writes no failed entry either (that
        # one follows the record, which the ledger's error messages count on). The holder
        # then finds the call in doubt and calls it again with the same key, exactly as
        # after a crash here; a failure recorded beside the holder's records could instead
        # land after its outcome for the same step.
        if isinstance(failure, Expired):
            reason = f"compensation {handler} did not return within {self.timeout}s: it may or may not have run"
            seq = self._append(R.COMPENSATION_FAILED.value, sp.step_id, {**base, "error_type": "Expired", "message": reason})
            await self.wal.barrier(seq)
            await self.ledger.record(self._entry(LedgerKind.FAILED, sp, error=reason))
            return await self._escalate(sp, EscalationKind.COMPENSATION_TIMEOUT, reason, RollbackOutcome.FAILED, desc)
        if failure is not None:  # unrecoverable: escalate
            err = describe_error(failure)
            log.error("saga %s step %s: compensation %s failed: %s: %s", self.saga_id, sp.step_id, handler, err["error_type"], err["message"])
            seq = self._append(R.COMPENSATION_FAILED.value, sp.step_id, {**base, **err})
            await self.wal.barrier(seq)
            await self.ledger.record(self._entry(LedgerKind.FAILED, sp, error=f"{err['error_type']}: {err['message']}"))
            return await self._escalate(
                sp, EscalationKind.COMPENSATION_FAILED, f"compensation {handler} raised {err['error_type']}: {err['message']}",
                RollbackOutcome.FAILED, desc,
            )
        fault_point("recovery.after_compensation")
        # The done entry comes before the claim is checked again (by COMPENSATION_DONE's
        # append): the call ran whether or not the claim is still ours, and this entry is
        # what keeps the next holder from calling it a second time.
        await self.ledger.record(self._entry(LedgerKind.DONE, sp, handler=handler))
        fault_point("recovery.after_ledger")
        self._append(R.COMPENSATION_DONE.value, sp.step_id, dict(base))
        return self._outcome(sp, RollbackOutcome.COMPENSATED)
