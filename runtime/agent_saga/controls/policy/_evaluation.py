"""Applying SagaPolicies to a step: what the reviewed file changes about a call.

``PolicySet`` holds the policies in force for one agent, compiled for the hot path. The
gate asks it twice about every step:

1. ``admit(request, has_compensation=...)`` before the limits (refusal is free there):
   an undeclared tool is refused (or sent to a human, or left to the code's declaration,
   as ``undeclaredTools`` says); policy arguments are taken by path from the call; the
   step's semantics become the stricter of the code's and every policy's. The answer
   carries the request the rest of the gate sees (tightened semantics, merged policy
   arguments), the inverse the policy names when the code has none, and the refusal or
   the questions for a human.
2. ``rule_specs`` — the policies' gate rules (named ``<policy id>:<rule>``), which the
   gate evaluates with its own rules, after the limits (an over-budget call never costs
   a human's attention); ``observed_rule_specs`` are the Observe-mode policies' rules,
   evaluated for the record only.

Precedence, decided once: **a reviewed policy can only tighten what code declares, never
loosen it.**

- Semantics: IRREVERSIBLE > COMPENSABLE > REVERSIBLE; the step is gated as the strictest
  of the code's declaration and every policy's. A policy saying COMPENSABLE about a tool
  the code calls IRREVERSIBLE leaves it IRREVERSIBLE.
- Verdicts: BLOCK > REQUIRE_APPROVAL > ALLOW; every policy that applies must admit the
  call (one policy's refusal is not overruled by another's declaration).
- The inverse: the code's compensation, when it has one, is the one that runs (it is a
  real function, and more undo is never less safe); the policy's inverse is used only
  when the code has none and the policy made the step COMPENSABLE. An inverse this
  process cannot run (no ``@compensator`` of that name) refuses the call: it could not
  be undone.
- Policy arguments: a path the call does not satisfy refuses the call (fail closed, like
  a limit that cannot read its argument); the value a policy derives replaces the code's
  value of the same name; two policies deriving different values refuse the call.
- An inverse's ``callArgs``: a path the call does not satisfy refuses the call before it
  runs (its undo could not be built). ``args`` paths read the forward result, which only
  exists afterwards: one it does not satisfy escalates the step on rollback.
- ``mode: Observe``: the policy changes nothing; what it would have done is reported in
  ``Admission.observed`` (the gate records it in the verdict's detail).

Invariants:
- ``PolicySet`` is immutable; ``admit`` does no I/O and caches per tool what does not
  depend on the call, so a cached policy adds a few microseconds to a step
  (bench/bench_policy.py).
- Nothing here raises on a call: every failure is an ``Admission`` with verdict BLOCK and
  a reason naming the policy, the tool and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ...compensation import registered_compensators
from ...gates import StepRequest
from ...semantics import ActionSemantics
from ._jsonpath import JsonPathMissing
from ._model import Compensate, PolicyRule, SagaPolicy, ToolDeclaration

__all__ = ["Admission", "PolicyInForce", "PolicySet"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_RANK = {ActionSemantics.REVERSIBLE: 0, ActionSemantics.COMPENSABLE: 1, ActionSemantics.IRREVERSIBLE: 2}
Verdict = Literal["ALLOW", "REQUIRE_APPROVAL", "BLOCK"]


@dataclass(frozen=True, slots=True)
class PolicyInForce:
    """One policy as the policy plane (or a file) holds it: ``id`` names it in verdicts
    (``<namespace>/<name>`` for a resource); ``uid`` and ``generation`` say which
    version of the resource it is (agents report them in their heartbeat)."""

    id: str
    policy: SagaPolicy
    uid: str = ""
    generation: int = 0

    def ref(self) -> dict[str, Any]:
        """``{id, uid, generation, mode}``: what an agent reports it has applied."""
        return {"id": self.id, "uid": self.uid, "generation": self.generation, "mode": self.policy.mode}


class Admission:
    """The policies' answer before the limits.

    ``verdict`` BLOCK: refused with ``reason``, decided by ``decided_by``
    (``policy:<id>``). Otherwise ``request`` is what the rest of the gate sees,
    ``asks`` are (name, reason) pairs that need a human, ``compensate`` is the policy's
    inverse when the code has none, ``observed`` what Observe-mode policies would have
    done, and ``detail`` the JSON the verdict records.
    """

    __slots__ = ("asks", "compensate", "decided_by", "detail", "observed", "reason", "request", "verdict")

    def __init__(self, verdict: Verdict, request: StepRequest, reason: str = "", decided_by: str = "",
                 asks: tuple[tuple[str, str], ...] = (), compensate: Compensate | None = None,
                 observed: tuple[str, ...] = (), detail: Mapping[str, Any] = _EMPTY) -> None:
        # A plain slotted class, not a frozen dataclass: it is built on every gated call.
        self.verdict = verdict
        self.request = request
        self.reason = reason
        self.decided_by = decided_by
        self.asks = asks
        self.compensate = compensate
        self.observed = observed
        self.detail = detail

    def __repr__(self) -> str:
        return f"Admission({self.verdict}, {self.request.tool}, {self.reason or self.decided_by!r})"


@dataclass(frozen=True, slots=True)
class _ToolPlan:
    """What the enforced policies say about one tool, independent of the call."""

    semantics: ActionSemantics | None          # the strictest declared, None: nobody declared it
    derive: tuple[tuple[str, str, Any], ...]   # (policy id, arg name, JsonPath)
    compensate: tuple[str, Compensate] | None  # (policy id, inverse) of the first COMPENSABLE declaration
    bind: tuple[tuple[str, Compensate], ...]   # (policy id, inverse) of every inverse that reads the call
    refuse: tuple[str, str] | None             # (policy id, reason): undeclared and refused
    asks: tuple[tuple[str, str], ...]          # (name, reason)
    policies: tuple[str, ...]                  # ids of the policies that declare the tool
    detail: Mapping[str, Any] = field(default_factory=dict)         # {"policies": [...]}, shared
    refused: Mapping[str, Any] = field(default_factory=dict)        # the same, undeclared


class PolicySet:
    """The policies in force for one agent (see the module doc). ``version`` changes
    whenever the set does; ``refs`` is what the agent reports it applied.
    ``inverses_elsewhere``: the inverses the policies name are registered in another
    process (a replay of an agent's log), so this one's registry is not asked."""

    def __init__(self, policies: Sequence[PolicyInForce] = (), *, agent: str, version: int = 0,
                 inverses_elsewhere: bool = False) -> None:
        self.agent = agent
        self.inverses_elsewhere = inverses_elsewhere
        self.version = version
        chosen = sorted((p for p in policies if p.policy.applies(agent)), key=lambda p: p.id)
        self.policies: tuple[PolicyInForce, ...] = tuple(chosen)
        self.enforced = tuple(p for p in chosen if p.policy.mode == "Enforce")
        self.observing = tuple(p for p in chosen if p.policy.mode == "Observe")
        self.rule_specs: tuple[tuple[str, PolicyRule], ...] = tuple(
            (f"{p.id}:{r.name}", r) for p in self.enforced for r in p.policy.rules)
        self.observed_rule_specs: tuple[tuple[str, PolicyRule], ...] = tuple(
            (f"{p.id}:{r.name}", r) for p in self.observing for r in p.policy.rules)
        self._plans: dict[str, _ToolPlan] = {}
        self._observed_plans: dict[str, _ToolPlan] = {}

    def __bool__(self) -> bool:
        return bool(self.policies)

    @property
    def refs(self) -> list[dict[str, Any]]:
        return [p.ref() for p in self.policies]

    # ------------------------------------------------------------------ hot path
    def admit(self, request: StepRequest, *, has_compensation: bool) -> Admission:
        """What the enforced policies make of ``request`` (see the module doc)."""
        observed = self._observe(request) if self.observing else ()
        if not self.enforced:
            return Admission("ALLOW", request, observed=observed)
        plan = self._plans.get(request.tool)
        if plan is None:
            plan = self._plans[request.tool] = _plan(self.enforced, request.tool)
        if plan.refuse is not None:
            pid, reason = plan.refuse
            return Admission("BLOCK", request, reason, "policy:" + pid, observed=observed, detail=plan.refused)
        if plan.bind:
            unbound = _unbound(plan.bind, request)
            if unbound is not None:
                pid, reason = unbound
                return Admission("BLOCK", request, reason, "policy:" + pid, observed=observed, detail=plan.detail)
        args: Mapping[str, Any] = request.policy_args
        if plan.derive:
            merged, problem = _derive(plan.derive, request)
            if problem is not None:
                pid, reason = problem
                return Admission("BLOCK", request, reason, "policy:" + pid, observed=observed, detail=plan.detail)
            if merged is not None:
                args = merged
        sem = request.semantics
        if plan.semantics is not None and _RANK[plan.semantics] > _RANK[sem]:
            sem = plan.semantics
        compensate: Compensate | None = None
        if sem is ActionSemantics.COMPENSABLE and not has_compensation and plan.compensate is not None:
            pid, compensate = plan.compensate
            if not self.inverses_elsewhere and compensate.target not in registered_compensators():
                what = f"inverse tool {compensate.tool!r}" if compensate.tool else f"handler {compensate.handler!r}"
                return Admission("BLOCK", request, (
                    f"SagaPolicy {pid} declares {request.tool} COMPENSABLE with {what}, which this process cannot "
                    f"run (no @compensator({compensate.target!r}) registered): the call is refused because it "
                    "could not be undone"), "policy:" + pid, observed=observed, detail=plan.detail)
        effective = request
        detail = plan.detail
        if sem is not request.semantics or args is not request.policy_args:
            effective = StepRequest(request.saga_id, request.step_id, request.tool, sem, args, request.tags,
                                    request.has_inverse)
            if sem is not request.semantics:
                detail = {**detail, "semantics": {"code": request.semantics.value, "enforced": sem.value}}
        verdict: Verdict = "REQUIRE_APPROVAL" if plan.asks else "ALLOW"
        return Admission(verdict, effective, "", "", plan.asks, compensate, observed, detail)

    def _observe(self, request: StepRequest) -> tuple[str, ...]:
        """What the Observe-mode policies would have done (nothing is enforced)."""
        plan = self._observed_plans.get(request.tool)
        if plan is None:
            plan = self._observed_plans[request.tool] = _plan(self.observing, request.tool)
        out: list[str] = []
        if plan.refuse is not None:
            out.append(f"would refuse: {plan.refuse[1]}")
        unbound = _unbound(plan.bind, request) if plan.bind else None
        if unbound is not None:
            out.append(f"would refuse: {unbound[1]}")
        if plan.semantics is not None and _RANK[plan.semantics] > _RANK[request.semantics]:
            out.append(f"would gate {request.tool} as {plan.semantics.value}")
        out.extend(f"would ask a human: {reason}" for _, reason in plan.asks)
        return tuple(out)


def _plan(policies: Sequence[PolicyInForce], tool: str) -> _ToolPlan:
    strictest: ActionSemantics | None = None
    derive: list[tuple[str, str, Any]] = []
    compensate: tuple[str, Compensate] | None = None
    bind: list[tuple[str, Compensate]] = []
    refuse: tuple[str, str] | None = None
    asks: list[tuple[str, str]] = []
    declaring: list[str] = []
    for p in policies:
        decl: ToolDeclaration | None = p.policy.tools.get(tool)
        if decl is None:
            if p.policy.undeclared_tools == "Refuse" and refuse is None:
                refuse = (p.id, f"{tool} is not declared in SagaPolicy {p.id}, and undeclared tools are refused: "
                                f"declare it under spec.tools (semantics, and its inverse if COMPENSABLE)")
            elif p.policy.undeclared_tools == "RequireApproval":
                asks.append((f"{p.id}:undeclared", f"{tool} is not declared in SagaPolicy {p.id}: a human decides"))
            continue
        declaring.append(p.id)
        if strictest is None or _RANK[decl.semantics] > _RANK[strictest]:
            strictest = decl.semantics
        if decl.compensate is not None and compensate is None:
            compensate = (p.id, decl.compensate)
        if decl.compensate is not None and decl.compensate.call_args:
            bind.append((p.id, decl.compensate))
        derive.extend((p.id, name, path) for name, path in sorted(decl.policy_args.items()))
        if decl.require_approval:
            asks.append((f"{p.id}:{tool}", f"SagaPolicy {p.id} requires a human for every call of {tool}"))
    detail = {"policies": list(declaring)}
    return _ToolPlan(strictest, tuple(derive), compensate, tuple(bind), refuse, tuple(asks), tuple(declaring),
                     detail, {**detail, "undeclared": True})


def _unbound(bind: Sequence[tuple[str, Compensate]], request: StepRequest) -> tuple[str, str] | None:
    """(policy id, refusal) for the first inverse whose ``callArgs`` the call does not satisfy."""
    for pid, comp in bind:
        for name, path in comp.call_args.items():
            try:
                path.read(request.policy_args)
            except JsonPathMissing as exc:
                return pid, (
                    f"SagaPolicy {pid} builds the inverse of {request.tool} ({comp.target}) with argument {name!r} "
                    f"from the call's {path.text} (compensate.callArgs), and the call does not have it ({exc.why}): "
                    f"a call whose undo cannot be built is refused before it runs")
    return None


def _derive(derive: Sequence[tuple[str, str, Any]], request: StepRequest
            ) -> tuple[Mapping[str, Any] | None, tuple[str, str] | None]:
    """The call's policy arguments with the policies' derived values (``None``: the same
    as the call's, nothing to rebuild), or the refusal."""
    args = request.policy_args
    found: dict[str, tuple[Any, str]] = {}
    changed = False
    for pid, name, path in derive:
        try:
            value = path.read(args)
        except JsonPathMissing as exc:
            return None, (pid, (
                f"SagaPolicy {pid} takes policy argument {name!r} of {request.tool} from {path.text}, and the call "
                f"does not have it ({exc.why}); policy arguments fail closed: the call is refused"))
        earlier = found.get(name)
        if earlier is not None and earlier[0] != value:
            return None, (pid, (
                f"SagaPolicies {earlier[1]} and {pid} derive different values for policy argument {name!r} of "
                f"{request.tool}; the call is refused until they agree"))
        found[name] = (value, pid)
        if not changed and (name not in args or args[name] != value):
            changed = True
    if not changed:
        return None, None
    return MappingProxyType({**args, **{k: v for k, (v, _) in found.items()}}), None
