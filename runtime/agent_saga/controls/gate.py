"""PreFlightGate: the control that runs before any side effect, where refusal is free.

One decision, in this order; the first control that refuses ends it:

    1. kill switch   a halted tool or tag is refused before anything is spent (issue 6)
    2. breaker       a dependency known to be down is refused before spending budget
    3. limits        every applicable limit is checked and debited in ONE atomic store call
    4. rules         per-call policy: IRREVERSIBLE requires a human, arg_exceeds, ...
    5. approval      a named human is asked, only if a limit escalated or a rule asked

Steps 1-2 are ``PreCheck`` objects passed as ``checks=``, ordered by their ``stage``;
without ``checks=`` the gate uses the process-wide kill switch and breaker
(``set_kill_switch``, ``set_breaker``), looked up at each decision.

Hooks the engine calls on a gate that has them (``PreFlightGate`` does):
- ``admit_saga`` when a saga starts: a DRAIN refuses it (``GateBlocked``) before
  anything is written; a saga already running is never asked again.
- ``on_outcome`` after a step the gate allowed has run: the breaker learns whether the
  tool raised. Compensations never pass through the gate, so they neither wait for nor
  feed the breaker.
- ``quarantine_of`` when a saga leaves its scope with an exception: a quarantined saga
  is frozen (SAGA_QUARANTINED), never rolled back automatically.

Invariants:
- Limits before rules, so a call already over budget never costs a human's attention.
- A call a human approved is checked against the kill switch again before it runs: a
  halt engaged while the human was deciding still stops it.
- All-or-nothing across limits: a call refused by one limit debits none of them.
- The debit made in step 3 is a reservation until the verdict is final: if a rule
  refuses, the approver denies, no approver exists, or anything fails, it is handed back
  (a refusal is the one outcome where we know the effect did not happen). Once the call
  is allowed the debit is permanent: a failed, timed-out or compensated step keeps it.
- Fails closed: an unreachable or failing store, an amount or scope key that cannot be
  read, a rule or check that raises, an escalation or approval rule with no
  ``approval_provider``, and a provider that raises or approves without naming a human
  all BLOCK, with a reason that names the store, limit, argument or rule.
- Over budget with ``escalate_to_human=True`` is REQUIRE_APPROVAL; nothing is reserved
  while the human decides, and an approved call is then debited even over the maximum
  (it is authorised spend), provided the limits that do not escalate still admit it.
- Under ``saga_scope`` the engine writes the GATE_VERDICT record; pass ``wal=`` only when
  calling ``decide`` yourself, and the gate writes it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ..errors import ConfigurationError, GateBlocked
from ..gates import StepRequest
from ..wal.base import BaseWAL
from .approvals import ApprovalOutcome, ApprovalProvider
from .fleet import warn_if_fleet
from .limit_source import LimitSource
from .limits import BudgetLimit, LimitUnreadable, RateLimit
from .rules import DEFAULT_RULES, Rule, RuleHit, RuleUnreadable
from .scopes import ScopeUnreadable
from .stores.base import (
    Charge,
    DebitResult,
    LimitSpec,
    LimitStore,
    LimitStoreUnavailable,
    LimitUsage,
)
from .stores.default import ENV_LIMIT_STORE, get_limit_store, peek_limit_store
from .stores.inprocess import InProcessLimitStore
from .verdicts import PreFlightDecision, Stage, write_verdict

__all__ = ["CheckRefusal", "PreCheck", "PreFlightGate"]

log = logging.getLogger("agent_saga.controls")

_GATE = "PreFlightGate"
_STORE = "limit-store"
_SOURCE = "limit-source"

# Debit ids: unique across processes (random token + pid, so a fork cannot repeat one)
# and cheap (no uuid4 on the hot path). Uniqueness matters: the stores are idempotent on
# the id, so a repeated id would silently not be counted.
_TOKEN = os.urandom(6).hex()
_counter = itertools.count(1)


def _new_debit_id() -> str:
    return f"{_TOKEN}.{os.getpid():x}.{next(_counter):x}"


@dataclass(frozen=True, slots=True)
class CheckRefusal:
    """A pre-check's refusal with audit detail (plain JSON, merged into the verdict's
    ``detail``). ``detail["quarantined"] = True`` makes the engine raise
    ``SagaQuarantined``: the saga is frozen, not rolled back."""

    reason: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class PreCheck(Protocol):
    """A control consulted before the limits: the kill switch or the circuit breaker.

    ``check`` returns a refusal (a reason, or a ``CheckRefusal`` with detail), or
    ``None`` to let the call continue. It owns its failure policy (the kill switch
    honours its last known state for a grace window; the breaker fails open); if it
    raises anyway, the gate refuses the call.

    Optional methods the gate calls when present: ``async admission(saga_id, tags)`` (a
    refusal to start a saga, or ``None``), ``quarantine_of(saga_id)`` (a quarantine
    in force, or ``None``), ``on_outcome(request, ok, error)`` (a step the gate allowed
    ran) and ``on_refused(request)`` (the check let ``request`` pass and a later stage
    refused it). A check with ``recheck_after_approval = True`` (the kill switch) is
    consulted again after a human approved, before the call runs.
    """

    @property
    def name(self) -> str: ...

    @property
    def stage(self) -> Literal["kill_switch", "breaker"]: ...

    async def check(self, request: StepRequest) -> str | CheckRefusal | None: ...


_PRECHECK_ORDER = {"kill_switch": 0, "breaker": 1}


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


class PreFlightGate:
    """The pre-flight gate (implements the engine's ``Gate`` protocol).

    ``rules`` are evaluated after ``default_rules`` (by default ``irreversible``: an
    IRREVERSIBLE step requires a human); pass ``default_rules=()`` to drop it.
    ``limits`` are ``BudgetLimit`` / ``RateLimit``; they live in ``store`` (default: the
    process-wide store, see ``set_limit_store``). ``approval_provider`` is asked when a
    rule or an escalating limit requires a human; without one, such calls are refused.
    ``checks`` are the kill switch and breaker (``PreCheck``). ``wal``: write each
    verdict as GATE_VERDICT (only when not used by ``saga_scope``, which writes it).
    """

    def __init__(
        self,
        rules: Sequence[Rule] = (),
        limits: Sequence[BudgetLimit | RateLimit] | LimitSource = (),
        approval_provider: ApprovalProvider | None = None,
        *,
        default_rules: Sequence[Rule] = DEFAULT_RULES,
        store: LimitStore | None = None,
        checks: Sequence[PreCheck] | None = None,
        wal: BaseWAL | None = None,
    ) -> None:
        self._rules: tuple[Rule, ...] = tuple(default_rules) + tuple(rules)
        for r in self._rules:
            if not isinstance(r, Rule):
                raise ConfigurationError(
                    f"PreFlightGate rules must be rules (arg_exceeds(...), rule(...), ...), got {r!r}"
                )
        # A LimitSource (RedisLimitSource): definitions read from the policy plane and
        # reloaded when they change; the hot path takes its cached snapshot (no I/O).
        self._source: LimitSource | None = limits if isinstance(limits, LimitSource) else None
        self._limits: tuple[BudgetLimit | RateLimit, ...] = (
            () if isinstance(limits, LimitSource) else tuple(limits))
        seen: set[str] = set()
        for lim in self._limits:
            if not isinstance(lim, BudgetLimit | RateLimit):
                raise ConfigurationError(f"PreFlightGate limits must be BudgetLimit or RateLimit, got {lim!r}")
            if lim.name in seen:
                raise ConfigurationError(
                    f"two limits are named {lim.name!r}: a name identifies a limit's windows "
                    f"in the store, so each limit needs its own"
                )
            seen.add(lim.name)
        for c in checks or ():
            if not isinstance(c, PreCheck) or c.stage not in _PRECHECK_ORDER:
                raise ConfigurationError(
                    f"PreFlightGate checks must be PreCheck objects with stage 'kill_switch' or 'breaker', got {c!r}"
                )
        # None: the process-wide kill switch and breaker, looked up at each decision
        self._checks: tuple[PreCheck, ...] | None = (
            None if checks is None else tuple(sorted(checks, key=lambda c: _PRECHECK_ORDER[c.stage]))
        )
        if approval_provider is not None and not callable(getattr(approval_provider, "request_approval", None)):
            raise ConfigurationError(
                f"approval_provider must implement request_approval(request, verdict), got {approval_provider!r}"
            )
        self._approval = approval_provider
        if store is not None and not isinstance(store, LimitStore):
            raise ConfigurationError(f"store must be a limit store (InProcessLimitStore(), RedisLimitStore(url)), got {store!r}")
        self._store = store
        self._wal = wal
        self._specs = tuple(lim.spec() for lim in self._limits)
        self._declared_in: LimitStore | None = None
        self._declared_version = 0
        if self._limits or self._source is not None:
            effective = store if store is not None else peek_limit_store()
            if isinstance(effective, InProcessLimitStore) or (effective is None and not os.environ.get(ENV_LIMIT_STORE)):
                warn_if_fleet("InProcessLimitStore")

    # ------------------------------------------------------------------ introspection
    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    @property
    def limits(self) -> tuple[BudgetLimit | RateLimit, ...]:
        """The limits in force now (a limit source's current definitions)."""
        return self._current()[0]

    def _current(self) -> tuple[tuple[BudgetLimit | RateLimit, ...], tuple[LimitSpec, ...], int]:
        if self._source is None:
            return self._limits, self._specs, 0
        snap = self._source.snapshot()
        return snap.limits, snap.specs, snap.version

    @property
    def store(self) -> LimitStore:
        """The store this gate's limits live in (the process-wide one unless given)."""
        return self._store if self._store is not None else get_limit_store()

    async def usage(self) -> list[LimitUsage]:
        """Each non-empty window of this gate's limits. Raises ``LimitStoreUnavailable``."""
        return await self.store.usage(self._current()[1])

    def status(self) -> dict[str, Any]:
        """The gate's configuration for ``AgentKit.status()`` (JSON): rules, limits, the
        store, the approver. Window use needs the store: ``await gate.usage()``."""
        store = self._store if self._store is not None else peek_limit_store()
        return {
            "rules": [r.name for r in self._rules],
            "limits": [s.to_doc() for s in self._current()[1]],
            "limit_source": self._source.describe() if self._source is not None else None,
            # The source's own state (RedisLimitSource: "data_lost" while the policy plane
            # has lost its data and the last known definitions are kept).
            "limit_source_status": _source_status(self._source),
            "store": store.describe() if store is not None else "default (not created yet)",
            "approval_provider": type(self._approval).__name__ if self._approval is not None else None,
            "checks": _names(self),
        }

    @property
    def checks(self) -> tuple[PreCheck, ...]:
        """The pre-checks consulted now: those given, else the process-wide kill switch
        and breaker (``set_kill_switch``, ``set_breaker``)."""
        if self._checks is not None:
            return self._checks
        get_kill_switch, get_breaker = _process_wide()
        switch, breaker = get_kill_switch(), get_breaker()
        if switch is None:
            return () if breaker is None else (breaker,)
        return (switch,) if breaker is None else (switch, breaker)

    # ------------------------------------------------------------------ engine hooks
    async def admit_saga(self, saga_id: str, name: str | None, tags: tuple[str, ...]) -> None:
        """Called by ``saga_scope`` before a saga starts: raise ``GateBlocked`` if a check
        refuses new sagas (a DRAIN, or a kill switch that fails closed). Nothing has been
        written yet; a saga already running is never asked again."""
        try:
            checks = self.checks
        except Exception as exc:  # noqa: BLE001 - a control that cannot be set up refuses
            raise GateBlocked(f"saga {saga_id} not started: the gate's controls could not be set up "
                              f"({type(exc).__name__}: {exc})", reason=str(exc), decided_by=_GATE,
                              saga_id=saga_id) from exc
        for check in checks:
            admission = getattr(check, "admission", None)
            if admission is None:
                continue
            try:
                refusal = await admission(saga_id, tags)
            except Exception as exc:  # noqa: BLE001 - a check that breaks refuses
                refusal = CheckRefusal(f"saga {saga_id} not started: {check.stage.replace('_', ' ')} "
                                       f"{check.name} failed ({type(exc).__name__}: {exc})")
            if refusal is not None:
                reason = refusal.reason if isinstance(refusal, CheckRefusal) else str(refusal)
                raise GateBlocked(reason, reason=reason, decided_by=check.name, saga_id=saga_id)

    def quarantine_of(self, saga_id: str) -> dict[str, Any] | None:
        """The quarantine in force on ``saga_id`` (the lever as JSON), or ``None``. Asked by
        ``saga_scope`` before rolling a saga back: a quarantined saga is never rolled
        back automatically. Never raises (a check that cannot answer is ``None``)."""
        try:
            checks = self.checks
        except Exception:  # noqa: BLE001
            return None
        for check in checks:
            ask = getattr(check, "quarantine_of", None)
            if ask is None:
                continue
            try:
                lever = ask(saga_id)
            except Exception as exc:  # noqa: BLE001 - unknown is not quarantined: rollback is the default
                log.warning("could not ask %s whether saga %s is quarantined (%s: %s)",
                            check.name, saga_id, type(exc).__name__, exc)
                continue
            if lever is not None:
                describe = getattr(lever, "describe", None)
                doc = describe() if callable(describe) else lever
                return dict(doc) if isinstance(doc, Mapping) else {"lever": str(doc)}
        return None

    def on_outcome(self, request: StepRequest, ok: bool, error: BaseException | None) -> None:
        """Called by the engine after a step this gate allowed has run: ``ok`` False if it
        raised (``error``). Feeds the breaker; never raises."""
        checks = self._checks if self._checks is not None else self.checks
        for check in checks:
            hook = getattr(check, "on_outcome", None)
            if hook is None:
                continue
            try:
                hook(request, ok, error)
            except Exception as exc:  # noqa: BLE001 - feedback must never break a step
                log.warning("%s could not record the outcome of %s (%s: %s)",
                            check.name, request.step_id, type(exc).__name__, exc)

    # ------------------------------------------------------------------ the decision
    async def decide(self, request: StepRequest) -> PreFlightDecision:
        """Decide whether ``request`` may run (see the module doc for the order and the
        guarantees). Never raises for a refusal: the refusal is the returned verdict."""
        decision = await self._decide(request)
        if self._wal is not None:
            write_verdict(self._wal, request, decision)
        return decision

    async def _decide(self, request: StepRequest) -> PreFlightDecision:
        # 1-2. kill switch, breaker
        try:
            checks = self.checks
        except Exception as exc:  # noqa: BLE001 - a control that cannot be set up refuses
            return _block("kill_switch", _GATE, f"the gate's controls could not be set up "
                          f"({type(exc).__name__}: {exc}); the call is refused", {})
        refused = await self._run_checks(checks, request)
        if refused is not None:
            return refused
        decision = await self._after_checks(request, checks)
        if not decision.allowed and checks:
            for check in checks:  # e.g. a breaker's trial call that will not run after all
                hook = getattr(check, "on_refused", None)
                if hook is not None:
                    try:
                        hook(request)
                    except Exception as exc:  # noqa: BLE001
                        log.warning("%s.on_refused failed (%s: %s)", check.name, type(exc).__name__, exc)
        return decision

    async def _run_checks(
        self, checks: Sequence[PreCheck], request: StepRequest, stages: tuple[str, ...] = ("kill_switch", "breaker")
    ) -> PreFlightDecision | None:
        for check in checks:
            if check.stage not in stages:
                continue
            try:
                refusal = await check.check(request)
            except Exception as exc:  # noqa: BLE001 - a check that breaks refuses
                return _block(check.stage, check.name, f"{check.stage.replace('_', ' ')} {check.name} failed "
                              f"({type(exc).__name__}: {exc}); the call is refused", {})
            if refusal is None:
                continue
            if isinstance(refusal, CheckRefusal):
                return _block(check.stage, check.name, refusal.reason, dict(refusal.detail))
            return _block(check.stage, check.name, str(refusal), {})
        return None

    async def _after_checks(self, request: StepRequest, checks: Sequence[PreCheck]) -> PreFlightDecision:

        # 3. limits: price the call against every applicable limit, then one store call
        charges: list[Charge] = []
        if self._source is not None:
            snap = self._source.snapshot()
            if not snap.usable:
                return _block("limits", _SOURCE, (
                    f"limit definitions from {self._source.describe()} could not be loaded ({snap.problem}); "
                    f"limits fail closed: every call is refused until they can be read"
                ), {"source": self._source.describe()})
            limits, specs, version = snap.limits, snap.specs, snap.version
        else:
            limits, specs, version = self._limits, self._specs, 0
        if limits:
            for lim in limits:
                if not lim.applies_to(request):
                    continue
                try:
                    charges.append(lim.charge(request))
                except (LimitUnreadable, ScopeUnreadable) as exc:
                    arg = exc.arg
                    return _block("limits", "limit:" + lim.name, (
                        f"limit {lim.name} cannot read policy argument {arg!r} of {request.tool}: "
                        f"{exc.why}. Limits fail closed: pass {arg!r} in policy_args, or name the "
                        f"tools the limit polices with tools=[...]"
                    ), {"limit": lim.name, "arg": arg})
        debit_id = ""
        detail: dict[str, Any] = {}
        reserved = False
        escalated: tuple[int, ...] = ()
        store: LimitStore | None = None
        if charges:
            store = self.store
            debit_id = _new_debit_id()
            try:
                if self._declared_in is not store or self._declared_version != version:
                    await store.declare(specs)
                    self._declared_in, self._declared_version = store, version
                result = await store.debit(charges, debit_id)
            except Exception as exc:  # noqa: BLE001 - any store failure refuses (fail closed)
                return _block("limits", _STORE, _store_reason(store, exc), {
                    "store": store.describe(), "debit_id": debit_id, "debited": False,
                    "charges": _charges_doc(charges, None),
                })
            detail = {"store": store.describe(), "debit_id": debit_id, "charges": _charges_doc(charges, result)}
            if result.ok:
                reserved = True
            else:
                hard = [i for i in result.over if not charges[i].escalate_to_human]
                first = hard[0] if hard else result.over[0]
                if hard:
                    detail["debited"] = False
                    return _block("limits", "limit:" + charges[first].limit,
                                  _over_reason(charges[first], result.used[first], request), detail)
                escalated = result.over

        # 4. rules (the reservation is handed back on any refusal from here on)
        try:
            return await self._after_limits(request, charges, store, debit_id, detail, reserved, escalated, checks)
        except BaseException:
            if reserved and store is not None:
                await self._refund(store, charges, debit_id, detail)
            raise

    async def _after_limits(
        self,
        request: StepRequest,
        charges: list[Charge],
        store: LimitStore | None,
        debit_id: str,
        detail: dict[str, Any],
        reserved: bool,
        escalated: tuple[int, ...],
        checks: Sequence[PreCheck] = (),
    ) -> PreFlightDecision:
        asks: list[tuple[str, RuleHit]] = []
        for r in self._rules:
            try:
                hit = r.evaluate(request)
            except RuleUnreadable as exc:
                hit = RuleHit("BLOCK", f"rule {r.name} cannot read {request.tool}'s arguments: {exc}; rules fail closed")
            except Exception as exc:  # noqa: BLE001 - a rule that breaks refuses
                hit = RuleHit("BLOCK", f"rule {r.name} failed ({type(exc).__name__}: {exc}); rules fail closed")
            if hit is None:
                continue
            if hit.verdict == "BLOCK":
                detail["rules"] = [{"rule": r.name, "verdict": "BLOCK", "reason": hit.reason}]
                return await self._refuse(store, charges, debit_id, detail, reserved,
                                          "BLOCK", "rules", "rule:" + r.name, hit.reason)
            asks.append((r.name, hit))

        if not asks and not escalated:
            if charges:
                detail["debited"] = True
            return PreFlightDecision("ALLOW", "no limit or rule objected", _GATE, True, "allow", None, detail)

        # 5. approval: name the first cause (limits come before rules), list them all
        causes: list[tuple[str, str]] = []
        for i in escalated:
            c = charges[i]
            used = float(detail["charges"][i]["used"])
            causes.append(("limit:" + c.limit, _over_reason(c, used, request) + "; it escalates to a human"))
        for name, hit in asks:
            causes.append(("rule:" + name, hit.reason))
        if asks:
            detail["rules"] = [{"rule": n, "verdict": h.verdict, "reason": h.reason} for n, h in asks]
        decided_by, reason = causes[0][0], "; ".join(c[1] for c in causes)
        stage: Stage = "limits" if escalated else "rules"
        if self._approval is None:
            why = "an exhausted budget with no approver" if escalated else "a call that needs a human with no approver"
            return await self._refuse(store, charges, debit_id, detail, reserved, "BLOCK", stage, decided_by,
                                      f"{reason}: a human must approve and this gate has no approval_provider "
                                      f"({why} is refused)")
        pending = PreFlightDecision("REQUIRE_APPROVAL", reason, decided_by, False, stage, None, dict(detail))
        try:
            outcome = await self._approval.request_approval(request, pending)
        except Exception as exc:  # noqa: BLE001 - a failed integration never authorises
            return await self._refuse(store, charges, debit_id, detail, reserved, "BLOCK", "approval", "approval",
                                      f"{reason}; the approval request failed ({type(exc).__name__}: {exc}), "
                                      f"so the call is refused")
        if not isinstance(outcome, ApprovalOutcome):
            return await self._refuse(store, charges, debit_id, detail, reserved, "BLOCK", "approval", "approval",
                                      f"{reason}; the approval provider returned {type(outcome).__name__}, not an "
                                      f"ApprovalOutcome, so the call is refused")
        detail["approval"] = outcome.to_doc()
        approver = (outcome.approver or "").strip()
        if not outcome.approved:
            who = f"denied by {approver}" if approver else "denied"
            note = f": {outcome.note}" if outcome.note else ""
            return await self._refuse(store, charges, debit_id, detail, reserved, "REQUIRE_APPROVAL", "approval",
                                      decided_by, f"{reason}; {who}{note}", outcome)
        if not approver:
            return await self._refuse(store, charges, debit_id, detail, reserved, "BLOCK", "approval", decided_by,
                                      f"{reason}; the approval names no approver, and an anonymous approval "
                                      f"proves nothing, so the call is refused", outcome)
        # A halt engaged while the human was deciding still stops the call.
        recheck = [c for c in checks if getattr(c, "recheck_after_approval", False) is True]
        halted = await self._run_checks(recheck, request, ("kill_switch",)) if recheck else None
        if halted is not None:
            detail.update(halted.detail)
            return await self._refuse(store, charges, debit_id, detail, reserved, "BLOCK", "kill_switch",
                                      halted.decided_by, f"approved by {approver}, but meanwhile {halted.reason}",
                                      outcome)
        if escalated:
            assert store is not None
            try:
                result = await store.debit(charges, debit_id, force=frozenset(escalated))
            except Exception as exc:  # noqa: BLE001
                detail["debited"] = False
                return PreFlightDecision("BLOCK", f"approved by {approver}, but {_store_reason(store, exc)}",
                                         _STORE, False, "approval", outcome, detail)
            detail["charges"] = _charges_doc(charges, result, forced=escalated)
            if not result.ok:
                i = result.over[0]
                detail["debited"] = False
                return PreFlightDecision(
                    "BLOCK", f"approved by {approver}, but meanwhile " + _over_reason(charges[i], result.used[i], request),
                    "limit:" + charges[i].limit, False, "approval", outcome, detail)
        if charges:
            detail["debited"] = True
        note = f": {outcome.note}" if outcome.note else ""
        glass = " (break-glass)" if outcome.break_glass else ""
        return PreFlightDecision("REQUIRE_APPROVAL", f"{reason}; approved by {approver}{glass}{note}", decided_by,
                                 True, "approval", outcome, detail)

    async def _refuse(
        self,
        store: LimitStore | None,
        charges: list[Charge],
        debit_id: str,
        detail: dict[str, Any],
        reserved: bool,
        verdict: Literal["BLOCK", "REQUIRE_APPROVAL"],
        stage: Stage,
        decided_by: str,
        reason: str,
        approval: ApprovalOutcome | None = None,
    ) -> PreFlightDecision:
        if reserved and store is not None:
            await self._refund(store, charges, debit_id, detail)
        if charges:
            detail["debited"] = bool(detail.get("refund_failed"))
        return PreFlightDecision(verdict, reason, decided_by, False, stage, approval, detail)

    async def _refund(self, store: LimitStore, charges: list[Charge], debit_id: str, detail: dict[str, Any]) -> None:
        try:
            await store.refund(charges, debit_id)
        except BaseException as exc:
            # The call is refused either way; a budget that stays counted errs on the safe side.
            detail["refund_failed"] = f"{type(exc).__name__}: {exc}"
            log.warning(
                "could not hand back debit %s of a refused call to %s (%s: %s): the amount stays "
                "counted until its window passes (never under-counted)",
                debit_id, store.describe(), type(exc).__name__, exc,
            )
            if isinstance(exc, asyncio.CancelledError):
                raise


_PROCESS_WIDE: tuple[Callable[[], PreCheck | None], Callable[[], PreCheck | None]] | None = None


def _process_wide() -> tuple[Callable[[], PreCheck | None], Callable[[], PreCheck | None]]:
    """``(get_kill_switch, get_breaker)``, imported once (they import this module)."""
    global _PROCESS_WIDE
    if _PROCESS_WIDE is None:
        from .breaker import get_breaker
        from .killswitch import get_kill_switch

        _PROCESS_WIDE = (get_kill_switch, get_breaker)
    return _PROCESS_WIDE


def _names(gate: PreFlightGate) -> list[str] | str:
    try:
        return [f"{c.stage}:{c.name}" for c in gate.checks]
    except Exception as exc:  # noqa: BLE001 - status must say what is wrong, not raise
        return f"unavailable ({type(exc).__name__}: {exc})"


def _block(stage: Stage, decided_by: str, reason: str, detail: dict[str, Any]) -> PreFlightDecision:
    return PreFlightDecision("BLOCK", reason, decided_by, False, stage, None, detail)


def _store_reason(store: LimitStore, exc: BaseException) -> str:
    if isinstance(exc, LimitStoreUnavailable):
        what = exc.message
        extra = (" (the request may have reached the store; if it did, the amount stays counted)"
                 if exc.outcome_unknown else "; nothing was debited")
    else:
        what = f"limit store {store.describe()} failed ({type(exc).__name__}: {exc})"
        extra = ""
    return f"{what}. Budgets fail closed: the call is refused{extra}"


def _over_reason(c: Charge, used: float, request: StepRequest) -> str:
    scope = "" if c.key == "*" else f" for {c.key}"
    window = _window_text(c.window)
    if c.kind == "rate":
        return f"rate limit {c.limit}{scope} reached: {_fmt(used)} of {_fmt(c.max_total)} calls in the last {window}"
    return (f"limit {c.limit}{scope} would be exceeded: {_fmt(used)} of {_fmt(c.max_total)} used in the last "
            f"{window}, this call needs {_fmt(c.amount)}")


def _window_text(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _charges_doc(charges: Sequence[Charge], result: DebitResult | None, forced: Sequence[int] = ()) -> list[dict[str, Any]]:
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


def _source_status(source: LimitSource | None) -> dict[str, Any] | None:
    """A limit source's ``status()`` if it has one (``LimitSource`` does not require it)."""
    reader = getattr(source, "status", None)
    if not callable(reader):
        return None
    detail = reader()
    return dict(detail) if isinstance(detail, dict) else {"value": repr(detail)}
