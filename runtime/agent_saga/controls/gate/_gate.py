"""PreFlightGate: the control that runs before any side effect, where refusal is free.

One decision, in this order; the first control that refuses ends it:

    1. kill switch   a halted tool or tag is refused before anything is spent
    2. breaker       a dependency known to be down is refused before spending budget
    3. policy        the SagaPolicies in force: an undeclared tool is refused; the call
                     continues with the semantics and policy arguments they tightened
    4. limits        every applicable limit is checked and debited in ONE atomic store call
    5. rules         per-call policy: IRREVERSIBLE requires a human, arg_exceeds, ... and
                     the SagaPolicies' rules after the gate's own
    6. approval      a named human is asked, only if a limit escalated or a rule asked

Steps 1-2 are ``PreCheck`` objects passed as ``checks=``, ordered by their ``stage``;
without ``checks=`` the gate uses the process-wide kill switch and breaker
(``set_kill_switch``, ``set_breaker``), looked up at each decision. Each step is one
method, named for what it does: ``_run_prechecks``, ``_apply_policy`` (the policies and
the rules, by ``evaluate_call``), ``_reserve`` (the limits: a ``Reservation`` that hands
itself back on a refusal), ``_judge``, ``_ask_human``.

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
- A refusal a BudgetLimit or SagaPolicy of the policy plane decided, and each question to
  a human one of them asked, is counted against that document (``note_refusal``): the
  heartbeat reports the counts and the operator shows them in the object's status.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, Literal

from ...errors import ConfigurationError, GateBlocked
from ...gates import Declaration, StepRequest
from ...heartbeat import AppliedRef, note_refusal
from ...wal.base import BaseWAL
from .._checks import PRECHECK_ORDER, CheckRefusal, PreCheck, as_precheck
from .._wiring import from_environment
from ..approvals import ApprovalOutcome, ApprovalProvider, get_approval_provider
from ..breaker import get_breaker
from ..killswitch import get_kill_switch
from ..limits import (
    ENV_LIMIT_STORE,
    BudgetLimit,
    Charge,
    InProcessLimitStore,
    LimitSource,
    LimitSpec,
    LimitStore,
    LimitUnreadable,
    LimitUsage,
    RateLimit,
    ScopeUnreadable,
    get_limit_source,
    get_limit_store,
    peek_limit_store,
    warn_if_fleet,
)
from ..policy import PolicySet, PolicySource, PolicyView, get_policy_source
from ._policy import Evaluation, evaluate_call, inverse_factory, observe
from ._reservation import GATE, Reservation, charges_doc, new_debit_id, over_reason, store_reason
from ._rules import DEFAULT_RULES, Rule, RuleHit
from ._verdicts import PreFlightDecision, Stage, write_verdict

__all__ = ["PreFlightGate"]

log = logging.getLogger("agent_saga.controls")

_STORE = "limit-store"
_SOURCE = "limit-source"
_POLICY_SOURCE = "policy-source"

#: ``policy=`` / ``limits=`` / ``approval_provider=`` not given: the process-wide one
#: (``set_policy_source``, ``set_limit_source``, ``set_approval_provider``; the
#: policy-plane wiring sets all three).
PROCESS_POLICY: Final[Any] = object()


class PreFlightGate:
    """The pre-flight gate (implements the engine's ``Gate`` protocol).

    ``rules`` are evaluated after ``default_rules`` (by default ``irreversible``: an
    IRREVERSIBLE step requires a human); pass ``default_rules=()`` to drop it.
    ``limits`` are ``BudgetLimit`` / ``RateLimit`` or a ``LimitSource`` (default: the
    process-wide source, ``set_limit_source``, else none); they live in ``store``
    (default: the process-wide store, see ``set_limit_store``). ``approval_provider`` is
    asked when a rule or an escalating limit requires a human (default: the process-wide
    one, ``set_approval_provider``); without one, such calls are refused. With
    ``AGENT_SAGA_REDIS_URL`` set, the first gate built wires the process to the policy
    plane (``agent_saga.plane``) and these defaults are its controls.
    ``checks`` are the kill switch and breaker (``PreCheck``). ``policy`` is where the
    SagaPolicies come from (``RedisPolicySource``, ``StaticPolicySource``; default: the
    process-wide source, ``set_policy_source``; ``None``: no policy). ``wal``: write each
    verdict as GATE_VERDICT (only when not used by ``saga_scope``, which writes it).
    """

    def __init__(
        self,
        rules: Sequence[Rule] = (),
        limits: Sequence[BudgetLimit | RateLimit] | LimitSource = PROCESS_POLICY,
        approval_provider: ApprovalProvider | None = PROCESS_POLICY,
        *,
        default_rules: Sequence[Rule] = DEFAULT_RULES,
        store: LimitStore | None = None,
        checks: Sequence[PreCheck] | None = None,
        wal: BaseWAL | None = None,
        policy: PolicySource | None = PROCESS_POLICY,
    ) -> None:
        if policy is not PROCESS_POLICY and policy is not None and not isinstance(policy, PolicySource):
            raise ConfigurationError(f"policy must be a SagaPolicy source (RedisPolicySource(url, ...), "
                                     f"StaticPolicySource.from_file(path)), got {policy!r}")
        from_environment()  # AGENT_SAGA_REDIS_URL: the process-wide controls below exist now
        if limits is PROCESS_POLICY:
            limits = get_limit_source() or ()
        if approval_provider is PROCESS_POLICY:
            approval_provider = get_approval_provider()
        self._policy: PolicySource | None = policy
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
            if not isinstance(c, PreCheck) or c.stage not in PRECHECK_ORDER:
                raise ConfigurationError(
                    f"PreFlightGate checks must be PreCheck objects with stage 'kill_switch' or 'breaker', got {c!r}"
                )
        # None: the process-wide kill switch and breaker, looked up at each decision.
        # ``_given`` is what the caller passed (``checks`` shows it); ``_prechecks`` the
        # same checks as PreChecks, every hook declared (``as_precheck``).
        self._given: tuple[PreCheck, ...] | None = (
            None if checks is None else tuple(sorted(checks, key=lambda c: PRECHECK_ORDER[c.stage]))
        )
        self._prechecks: tuple[PreCheck, ...] | None = (
            None if self._given is None else tuple(as_precheck(c) for c in self._given))
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
        # The declaration in flight on each event loop: concurrent first calls share it.
        self._declaring: dict[asyncio.AbstractEventLoop, tuple[LimitStore, int, asyncio.Task[None]]] = {}
        if self._limits or self._source is not None:
            effective = store if store is not None else peek_limit_store()
            if isinstance(effective, InProcessLimitStore) or (effective is None and not os.environ.get(ENV_LIMIT_STORE)):
                warn_if_fleet("InProcessLimitStore")

    # ------------------------------------------------------------------ introspection
    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules, in the order they are evaluated (``default_rules`` first)."""
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
            "policy_source": _policy_status(self.policy),
        }

    @property
    def policy(self) -> PolicySource | None:
        """The SagaPolicy source consulted now: the one given, else the process-wide one."""
        return get_policy_source() if self._policy is PROCESS_POLICY else self._policy

    @property
    def checks(self) -> tuple[PreCheck, ...]:
        """The pre-checks consulted now: those given, else the process-wide kill switch
        and breaker (``set_kill_switch``, ``set_breaker``)."""
        return self._given if self._given is not None else _process_wide()

    def _consulted(self) -> tuple[PreCheck, ...]:
        """``checks`` with every hook declared (raises if the process-wide ones cannot be
        set up)."""
        return self._prechecks if self._prechecks is not None else _process_wide()

    # ------------------------------------------------------------------ engine hooks
    async def admit_saga(self, saga_id: str, name: str | None, tags: tuple[str, ...]) -> None:
        """Called by ``saga_scope`` before a saga starts: raise ``GateBlocked`` if a check
        refuses new sagas (a DRAIN, or a kill switch that fails closed). Nothing has been
        written yet; a saga already running is never asked again."""
        try:
            checks = self._consulted()
        except Exception as exc:  # noqa: BLE001 - a control that cannot be set up refuses
            raise GateBlocked(f"saga {saga_id} not started: the gate's controls could not be set up "
                              f"({type(exc).__name__}: {exc})", reason=str(exc), decided_by=GATE,
                              saga_id=saga_id) from exc
        for check in checks:
            try:
                refusal = await check.admission(saga_id, tags)
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
            checks = self._consulted()
        except Exception:  # noqa: BLE001
            return None
        for check in checks:
            try:
                lever = check.quarantine_of(saga_id)
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
        for check in self._consulted():
            try:
                check.on_outcome(request, ok, error)
            except Exception as exc:  # noqa: BLE001 - feedback must never break a step
                log.warning("%s could not record the outcome of %s (%s: %s)",
                            check.name, request.step_id, type(exc).__name__, exc)

    # ------------------------------------------------------------------ refusal counts
    def _document(self, by: str) -> AppliedRef | None:
        """The policy-plane document behind ``decided_by`` (``limit:<name>``,
        ``policy:<ns>/<name>``, ``rule:<ns>/<name>:<rule>``), if it is one in force."""
        kind, _, rest = by.partition(":")
        if kind == "limit" and self._source is not None:
            snap = self._source.snapshot()
            if len(snap.documents) == len(snap.limits):
                for lim, (id_, uid, gen) in zip(snap.limits, snap.documents, strict=True):
                    if lim.name == rest:
                        return AppliedRef(id_, uid, gen)
        elif kind in ("policy", "rule") and (source := self.policy) is not None:
            pid = rest.split(":", 1)[0]
            for p in source.view().policies.policies:
                if p.id == pid:
                    return AppliedRef(p.id, p.uid, p.generation)
        return None

    def _count(self, request: StepRequest, by: str, outcome: Literal["refused", "held"]) -> None:
        """Count a refusal or a question to a human against the document that caused it
        (never raises: a count is a report, the verdict stands)."""
        try:
            ref = self._document(by)
            if ref is not None:
                note_refusal(ref, outcome, tool=request.tool, saga=request.saga_id, by=by)
        except Exception as exc:  # noqa: BLE001
            log.debug("could not count %s of %s against %s: %s", outcome, request.tool, by, exc)

    # ------------------------------------------------------------------ the decision
    async def decide(self, request: StepRequest) -> PreFlightDecision:
        """Decide whether ``request`` may run (see the module doc for the order and the
        guarantees). Never raises for a refusal: the refusal is the returned verdict."""
        decision = await self._decide(request)
        if self._wal is not None:
            write_verdict(self._wal, request, decision)
        if not decision.allowed and decision.verdict == "BLOCK" and decision.stage in _COUNTED:
            self._count(request, decision.decided_by, "refused")
        if not decision.allowed and decision.verdict == "BLOCK":
            log.info("refused %s in saga %s: %s %s: %s", request.tool, request.saga_id,
                     decision.stage.replace("_", " "), _refused_by(decision), decision.reason)
        return decision

    async def _decide(self, request: StepRequest) -> PreFlightDecision:
        try:
            checks = self._consulted()
        except Exception as exc:  # noqa: BLE001 - a control that cannot be set up refuses
            return _block("kill_switch", GATE, f"the gate's controls could not be set up "
                          f"({type(exc).__name__}: {exc}); the call is refused", {})
        refused = await self._run_prechecks(checks, request)  # 1-2. kill switch, breaker
        if refused is not None:
            return refused
        decision = await self._apply_policy(request, checks)
        if not decision.allowed:
            for check in checks:  # e.g. a breaker's trial call that will not run after all
                try:
                    check.on_refused(request)
                except Exception as exc:  # noqa: BLE001
                    log.warning("%s.on_refused failed (%s: %s)", check.name, type(exc).__name__, exc)
        return decision

    async def _run_prechecks(
        self, checks: Sequence[PreCheck], request: StepRequest, stages: tuple[str, ...] = ("kill_switch", "breaker")
    ) -> PreFlightDecision | None:
        """1-2. The first pre-check (of ``stages``) that refuses ``request``, as a BLOCK."""
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

    async def _apply_policy(self, request: StepRequest, checks: Sequence[PreCheck]) -> PreFlightDecision:
        """3. The SagaPolicies in force: refuse an undeclared tool (nothing spent yet), or go
        on with the request they tightened, their rules, and their questions for a human.
        The policies and the rules are evaluated once, by ``evaluate_call`` (what
        ``agent-saga policy replay`` runs); the limits are applied between its answers."""
        source = self.policy
        pset: PolicySet | None = None
        view: PolicyView | None = None
        if source is not None:
            try:
                view = source.view()
            except Exception as exc:  # noqa: BLE001 - a source that breaks refuses
                return _block("policy", _POLICY_SOURCE, f"SagaPolicy source {source.describe()} failed "
                              f"({type(exc).__name__}: {exc}); the call is refused", {})
            if not view.usable:
                return _block("policy", _POLICY_SOURCE, (
                    f"SagaPolicies from {source.describe()} cannot be used ({view.problem}): the gate fails closed "
                    f"and refuses every call until they can be read"), {"source": source.describe()})
            pset = view.policies or None
        ev = evaluate_call(request, pset, self._rules)
        adm = ev.admission
        if adm is None or source is None or pset is None or view is None:
            return await self._after_prechecks(request, checks, ev)
        if pset.observing:
            source.record(request)
        detail: Mapping[str, Any] = adm.detail  # shared per tool: never mutated
        if adm.observed or ev.observed_rules or view.degraded:
            extra = dict(adm.detail)
            seen = [*adm.observed, *observe(ev.observed_rules, adm.request)]
            if seen:
                extra["observed"] = seen
            if view.degraded:
                extra["degraded"] = view.degraded
            detail = extra
        if adm.verdict == "BLOCK":
            return _block("policy", adm.decided_by, adm.reason, {"policy": detail})
        decision = await self._after_prechecks(adm.request, checks, ev, detail)
        if decision.allowed and (adm.request.semantics is not request.semantics or adm.compensate is not None):
            declared = Declaration(adm.request.semantics, None if adm.compensate is None
                                   else inverse_factory(request.tool, adm.compensate, request.policy_args))
            # = replace(decision, declaration=declared), without its walk over the fields
            return PreFlightDecision(decision.verdict, decision.reason, decision.decided_by, decision.allowed,
                                     decision.stage, decision.approval, decision.detail, declared)
        return decision

    async def _after_prechecks(self, request: StepRequest, checks: Sequence[PreCheck], ev: Evaluation,
                               policy: Mapping[str, Any] | None = None) -> PreFlightDecision:
        reserved = await self._reserve(request)
        if isinstance(reserved, PreFlightDecision):
            if policy is not None:
                return replace(reserved, detail={**reserved.detail, "policy": policy})
            return reserved
        if policy is not None:
            reserved.detail["policy"] = policy
        try:
            return await self._judge(request, reserved, checks, ev)
        except BaseException:
            await reserved.refund()  # a refusal is the one outcome where the effect did not happen
            raise

    async def _declare(self, store: LimitStore, specs: Sequence[LimitSpec], version: int) -> None:
        """Declare ``specs`` (of limits ``version``) to ``store`` once: the calls that
        arrive while a declaration is in flight wait for that one instead of each sending
        its own (a burst of first calls would otherwise be a burst of identical writes).
        A failed declaration fails every call that waited for it, and the next call
        declares again."""
        loop = asyncio.get_running_loop()
        held = self._declaring.get(loop)
        if held is None or held[0] is not store or held[1] != version or held[2].done():
            task = loop.create_task(store.declare(specs))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if no one waits
            held = self._declaring[loop] = (store, version, task)
        try:
            # Shielded: a caller cancelled while waiting leaves the declaration to the others.
            await asyncio.shield(held[2])
        finally:
            if held[2].done() and self._declaring.get(loop) is held:
                del self._declaring[loop]
        self._declared_in, self._declared_version = store, version

    async def _reserve(self, request: StepRequest) -> Reservation | PreFlightDecision:
        """3. Price the call against every applicable limit and debit all of them in one
        store call: the reservation, or the refusal (nothing debited)."""
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
        charges: list[Charge] = []
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
        if not charges:
            return Reservation()
        store = self.store
        res = Reservation(charges, store, new_debit_id())
        try:
            if self._declared_in is not store or self._declared_version != version:
                await self._declare(store, specs, version)
            result = await store.debit(charges, res.debit_id)
        except Exception as exc:  # noqa: BLE001 - any store failure refuses (fail closed)
            return _block("limits", _STORE, store_reason(store, exc), {
                "store": store.describe(), "debit_id": res.debit_id, "debited": False,
                "charges": charges_doc(charges, None),
            })
        res.detail = {"store": store.describe(), "debit_id": res.debit_id, "charges": charges_doc(charges, result)}
        if result.ok:
            res.reserved = True
            return res
        hard = [i for i in result.over if not charges[i].escalate_to_human]
        if hard:
            first = hard[0]
            res.detail["debited"] = False
            return _block("limits", "limit:" + charges[first].limit,
                          over_reason(charges[first], result.used[first], request), res.detail)
        res.escalated = result.over
        return res

    async def _judge(self, request: StepRequest, res: Reservation, checks: Sequence[PreCheck],
                     ev: Evaluation) -> PreFlightDecision:
        """5-6. The rules' answer (the gate's, then the SagaPolicies', evaluated by
        ``evaluate_call``), then a human if a rule, a SagaPolicy or an escalating limit
        asks for one."""
        blocked, asks = ev.judge()
        if blocked is not None:
            name, hit = blocked
            res.detail["rules"] = [{"rule": name, "verdict": "BLOCK", "reason": hit.reason}]
            return await res.refuse("BLOCK", "rules", "rule:" + name, hit.reason)
        if not asks and not res.escalated:
            return res.allow()
        return await self._ask_human(request, res, list(asks), checks)

    async def _ask_human(self, request: StepRequest, res: Reservation, asks: list[tuple[str, RuleHit]],
                         checks: Sequence[PreCheck]) -> PreFlightDecision:
        """5. Ask the approval provider, naming the first cause (limits come before rules)
        and listing them all; only a named yes approves."""
        detail = res.detail
        causes: list[tuple[str, str]] = []
        for i in res.escalated:
            c = res.charges[i]
            used = float(detail["charges"][i]["used"])
            causes.append(("limit:" + c.limit, over_reason(c, used, request) + "; it escalates to a human"))
        for name, hit in asks:
            causes.append(("rule:" + name, hit.reason))
        if asks:
            detail["rules"] = [{"rule": n, "verdict": h.verdict, "reason": h.reason} for n, h in asks]
        decided_by, reason = causes[0][0], "; ".join(c[1] for c in causes)
        stage: Stage = "limits" if res.escalated else "rules"
        if self._approval is None:
            why = "an exhausted budget with no approver" if res.escalated else "a call that needs a human with no approver"
            return await res.refuse("BLOCK", stage, decided_by,
                                    f"{reason}: a human must approve and this gate has no approval_provider "
                                    f"({why} is refused)")
        pending = PreFlightDecision("REQUIRE_APPROVAL", reason, decided_by, False, stage, None, dict(detail))
        for by in dict.fromkeys(c[0] for c in causes):
            self._count(request, by, "held")
        try:
            outcome = await self._approval.request_approval(request, pending)
        except Exception as exc:  # noqa: BLE001 - a failed integration never authorises
            return await res.refuse("BLOCK", "approval", "approval",
                                    f"{reason}; the approval request failed ({type(exc).__name__}: {exc}), "
                                    f"so the call is refused")
        if not isinstance(outcome, ApprovalOutcome):
            return await res.refuse("BLOCK", "approval", "approval",
                                    f"{reason}; the approval provider returned {type(outcome).__name__}, not an "
                                    f"ApprovalOutcome, so the call is refused")
        detail["approval"] = outcome.to_doc()
        approver = (outcome.approver or "").strip()
        if not outcome.approved:
            who = f"denied by {approver}" if approver else "denied"
            note = f": {outcome.note}" if outcome.note else ""
            return await res.refuse("REQUIRE_APPROVAL", "approval", decided_by, f"{reason}; {who}{note}", outcome)
        if not approver:
            return await res.refuse("BLOCK", "approval", decided_by,
                                    f"{reason}; the approval names no approver, and an anonymous approval "
                                    f"proves nothing, so the call is refused", outcome)
        # A halt engaged while the human was deciding still stops the call.
        recheck = [c for c in checks if c.recheck_after_approval]
        halted = await self._run_prechecks(recheck, request, ("kill_switch",)) if recheck else None
        if halted is not None:
            detail.update(halted.detail)
            return await res.refuse("BLOCK", "kill_switch", halted.decided_by,
                                    f"approved by {approver}, but meanwhile {halted.reason}", outcome)
        refused = await res.debit_escalated(request, approver, outcome)
        if refused is not None:
            return refused
        note = f": {outcome.note}" if outcome.note else ""
        glass = " (break-glass)" if outcome.break_glass else ""
        return res.allow("REQUIRE_APPROVAL", f"{reason}; approved by {approver}{glass}{note}", decided_by,
                         "approval", outcome)


#: The stages whose BLOCK a BudgetLimit or SagaPolicy can have decided.
_COUNTED = ("policy", "limits", "rules")


def _process_wide() -> tuple[PreCheck, ...]:
    """The process-wide kill switch and breaker, those that are set."""
    switch, breaker = get_kill_switch(), get_breaker()  # (asked twice a call: no generator)
    if switch is None:
        return () if breaker is None else (breaker,)
    return (switch,) if breaker is None else (switch, breaker)


def _names(gate: PreFlightGate) -> list[str] | str:
    try:
        return [f"{c.stage}:{c.name}" for c in gate.checks]
    except Exception as exc:  # noqa: BLE001 - status must say what is wrong, not raise
        return f"unavailable ({type(exc).__name__}: {exc})"


def _refused_by(decision: PreFlightDecision) -> str:
    """The object that refused: the kill switch's ``ns/name``, else who decided
    (``policy:<ns>/<name>``, ``limit:<name>``)."""
    lever = decision.detail.get("lever")
    if isinstance(lever, Mapping) and lever.get("id"):
        return str(lever["id"])
    return decision.decided_by


def _block(stage: Stage, decided_by: str, reason: str, detail: dict[str, Any]) -> PreFlightDecision:
    return PreFlightDecision("BLOCK", reason, decided_by, False, stage, None, detail)


def _policy_status(source: PolicySource | None) -> dict[str, Any] | str | None:
    """The SagaPolicy source's state for ``status()`` (never raises)."""
    if source is None:
        return None
    try:
        reader = getattr(source, "status", None)
        if callable(reader):
            detail = reader()
            return dict(detail) if isinstance(detail, dict) else {"value": repr(detail)}
        v = source.view()
        return {"source": source.describe(), "usable": v.usable, "problem": v.problem, "degraded": v.degraded,
                "policies": v.policies.refs}
    except Exception as exc:  # noqa: BLE001 - status must say what is wrong, not raise
        return f"unavailable ({type(exc).__name__}: {exc})"


def _source_status(source: LimitSource | None) -> dict[str, Any] | None:
    """A limit source's ``status()`` if it has one (``LimitSource`` does not require it)."""
    reader = getattr(source, "status", None)
    if not callable(reader):
        return None
    detail = reader()
    return dict(detail) if isinstance(detail, dict) else {"value": repr(detail)}
