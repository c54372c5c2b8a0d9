"""PreFlightGate: the control that runs before any side effect, where refusal is free.

One decision, in this order; the first control that refuses ends it:

    1. kill switch   a halted tool or tag is refused before anything is spent (issue 6)
    2. breaker       a dependency known to be down is refused before spending budget
    3. limits        every applicable limit is checked and debited in ONE atomic store call
    4. rules         per-call policy: IRREVERSIBLE requires a human, arg_exceeds, ...
    5. approval      a named human is asked, only if a limit escalated or a rule asked

Steps 1-2 are ``PreCheck`` objects passed as ``checks=``, ordered by their ``stage``.

Invariants:
- Limits before rules, so a call already over budget never costs a human's attention.
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
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from ..errors import ConfigurationError
from ..gates import StepRequest
from ..wal.base import BaseWAL
from .approvals import ApprovalOutcome, ApprovalProvider
from .fleet import warn_if_fleet
from .limits import BudgetLimit, LimitUnreadable, RateLimit
from .rules import DEFAULT_RULES, Rule, RuleHit, RuleUnreadable
from .scopes import ScopeUnreadable
from .stores.base import Charge, DebitResult, LimitStore, LimitStoreUnavailable, LimitUsage
from .stores.default import ENV_LIMIT_STORE, get_limit_store, peek_limit_store
from .stores.inprocess import InProcessLimitStore
from .verdicts import PreFlightDecision, Stage, write_verdict

__all__ = ["PreCheck", "PreFlightGate"]

log = logging.getLogger("agent_saga.controls")

_GATE = "PreFlightGate"
_STORE = "limit-store"

# Debit ids: unique across processes (random token + pid, so a fork cannot repeat one)
# and cheap (no uuid4 on the hot path). Uniqueness matters: the stores are idempotent on
# the id, so a repeated id would silently not be counted.
_TOKEN = os.urandom(6).hex()
_counter = itertools.count(1)


def _new_debit_id() -> str:
    return f"{_TOKEN}.{os.getpid():x}.{next(_counter):x}"


@runtime_checkable
class PreCheck(Protocol):
    """A control consulted before the limits: the kill switch or the circuit breaker.

    ``check`` returns a refusal reason, or ``None`` to let the call continue. It owns
    its failure policy (the kill switch honours its last known state for a grace window;
    the breaker fails open); if it raises anyway, the gate refuses the call.
    """

    @property
    def name(self) -> str: ...

    @property
    def stage(self) -> Literal["kill_switch", "breaker"]: ...

    async def check(self, request: StepRequest) -> str | None: ...


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
        limits: Sequence[BudgetLimit | RateLimit] = (),
        approval_provider: ApprovalProvider | None = None,
        *,
        default_rules: Sequence[Rule] = DEFAULT_RULES,
        store: LimitStore | None = None,
        checks: Sequence[PreCheck] = (),
        wal: BaseWAL | None = None,
    ) -> None:
        self._rules: tuple[Rule, ...] = tuple(default_rules) + tuple(rules)
        for r in self._rules:
            if not isinstance(r, Rule):
                raise ConfigurationError(
                    f"PreFlightGate rules must be rules (arg_exceeds(...), rule(...), ...), got {r!r}"
                )
        self._limits: tuple[BudgetLimit | RateLimit, ...] = tuple(limits)
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
        for c in checks:
            if not isinstance(c, PreCheck) or c.stage not in _PRECHECK_ORDER:
                raise ConfigurationError(
                    f"PreFlightGate checks must be PreCheck objects with stage 'kill_switch' or 'breaker', got {c!r}"
                )
        self._checks = tuple(sorted(checks, key=lambda c: _PRECHECK_ORDER[c.stage]))
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
        if self._limits:
            effective = store if store is not None else peek_limit_store()
            if isinstance(effective, InProcessLimitStore) or (effective is None and not os.environ.get(ENV_LIMIT_STORE)):
                warn_if_fleet("InProcessLimitStore")

    # ------------------------------------------------------------------ introspection
    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    @property
    def limits(self) -> tuple[BudgetLimit | RateLimit, ...]:
        return self._limits

    @property
    def store(self) -> LimitStore:
        """The store this gate's limits live in (the process-wide one unless given)."""
        return self._store if self._store is not None else get_limit_store()

    async def usage(self) -> list[LimitUsage]:
        """Each non-empty window of this gate's limits. Raises ``LimitStoreUnavailable``."""
        return await self.store.usage(self._specs)

    def status(self) -> dict[str, Any]:
        """The gate's configuration for ``AgentKit.status()`` (JSON): rules, limits, the
        store, the approver. Window use needs the store: ``await gate.usage()``."""
        store = self._store if self._store is not None else peek_limit_store()
        return {
            "rules": [r.name for r in self._rules],
            "limits": [s.to_doc() for s in self._specs],
            "store": store.describe() if store is not None else "default (not created yet)",
            "approval_provider": type(self._approval).__name__ if self._approval is not None else None,
            "checks": [f"{c.stage}:{c.name}" for c in self._checks],
        }

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
        for check in self._checks:
            try:
                refusal = await check.check(request)
            except Exception as exc:  # noqa: BLE001 - a check that breaks refuses
                return _block(check.stage, check.name, f"{check.stage.replace('_', ' ')} {check.name} failed "
                              f"({type(exc).__name__}: {exc}); the call is refused", {})
            if refusal is not None:
                return _block(check.stage, check.name, refusal, {})

        # 3. limits: price the call against every applicable limit, then one store call
        charges: list[Charge] = []
        limits = self._limits
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
                if self._declared_in is not store:
                    await store.declare(self._specs)
                    self._declared_in = store
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
            return await self._after_limits(request, charges, store, debit_id, detail, reserved, escalated)
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
