"""The SagaPolicy stage of the gate: what the reviewed policies make of a call.

Between the pre-checks and the limits, the gate asks the policies in force for this
agent (``agent_saga.controls.policy``) to admit the call: an undeclared tool is refused
there, before anything is spent; otherwise the call continues with the semantics and
policy arguments the policies tightened, and their questions for a human wait for the
approval stage. The policies' gate rules are compiled here into the gate's own rules
(``arg_exceeds``, ``tagged``, ``tool_matches``) and evaluated after the gate's rules.

``evaluate_call`` is that evaluation, limits aside: the admission, then every rule. The
gate calls it for each decision (and applies the limits between the two answers);
``agent-saga policy replay`` calls it for each recorded step. One function, so a replayed
verdict is the verdict the gate would give.

Invariants:
- A source whose policies cannot be used (never read, or the policy plane lost for
  longer than its grace window) refuses every call (``decided_by: policy-source``).
- Compiled rules are cached per ``PolicySet`` (a new set is a new version): the hot path
  builds nothing when nothing changed.
- ``evaluate_call`` does no I/O, never raises for a call, and never asks a human: a rule
  that cannot read the call, or raises, is a BLOCK naming the rule (rules fail closed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ...compensation import Compensation
from ...errors import CompensationError
from ...gates import StepRequest
from ..policy import Admission, Compensate, PolicyRule, PolicySet
from ._rules import Rule, RuleHit, RuleUnreadable, arg_exceeds, tagged, tool_matches

__all__ = ["Evaluation", "apply_rules", "compile_rules", "evaluate_call", "inverse_factory"]

Verdict = Literal["ALLOW", "REQUIRE_APPROVAL", "BLOCK"]


def _rule(name: str, r: PolicyRule) -> Rule:
    verdict = "BLOCK" if r.verdict == "Block" else "REQUIRE_APPROVAL"
    kind, value = r.condition
    if kind == "toolMatches":
        return tool_matches(*value, verdict=verdict, reason=r.reason or "", name=name)
    if kind == "tagged":
        return tagged(value, verdict, r.reason or "", name=name)
    base = arg_exceeds(value[0], value[1], verdict, name=name)
    return base if r.reason is None else _Reasoned(base, r.reason)


class _Reasoned:
    """A rule whose hits carry the policy's sentence, then the measured fact."""

    __slots__ = ("inner", "reason")

    def __init__(self, inner: Rule, reason: str) -> None:
        self.inner = inner
        self.reason = reason

    @property
    def name(self) -> str:
        return self.inner.name

    def evaluate(self, request: Any) -> RuleHit | None:
        hit = self.inner.evaluate(request)
        return None if hit is None else RuleHit(hit.verdict, f"{self.reason} ({hit.reason})")


_compiled: dict[int, tuple[PolicySet, tuple[Rule, ...], tuple[Rule, ...]]] = {}


def compile_rules(pset: PolicySet) -> tuple[tuple[Rule, ...], tuple[Rule, ...]]:
    """``(enforced rules, observed rules)`` of ``pset`` as gate rules (cached)."""
    got = _compiled.get(id(pset))
    if got is not None and got[0] is pset:
        return got[1], got[2]
    enforced = tuple(_rule(n, r) for n, r in pset.rule_specs)
    observed = tuple(_rule(n, r) for n, r in pset.observed_rule_specs)
    if len(_compiled) > 64:
        _compiled.clear()
    _compiled[id(pset)] = (pset, enforced, observed)
    return enforced, observed


def observe(rules: Sequence[Rule], request: Any) -> list[str]:
    """What Observe-mode rules would have done to ``request`` (nothing is enforced)."""
    out = []
    for r in rules:
        try:
            hit = r.evaluate(request)
        except Exception as exc:  # noqa: BLE001 - an observation never refuses
            out.append(f"rule {r.name} could not read the call ({exc})")
            continue
        if hit is not None:
            out.append(f"rule {r.name} would {'refuse' if hit.verdict == 'BLOCK' else 'ask a human'}: {hit.reason}")
    return out


def inverse_factory(tool: str, compensate: Compensate, call: Any) -> Any:
    """A compensation factory building the policy's inverse over the forward result:
    ``Compensation(handler=<handler or tool>, kwargs=<from call, constants, result>)``
    (``call``: the call's arguments, which the admission already found complete)."""

    def factory(result: Any) -> Compensation:
        try:
            kwargs = compensate.kwargs_for(call, result)
        except LookupError as exc:
            raise CompensationError(
                f"the SagaPolicy inverse of {tool!r} ({compensate.target}) could not read its arguments: {exc}",
                tool=tool) from exc
        return Compensation(handler=compensate.target, kwargs=kwargs,
                            description=f"declared by a SagaPolicy: {compensate.target}")

    return factory


def apply_rules(rules: Sequence[Rule], request: StepRequest
                ) -> tuple[tuple[str, RuleHit] | None, list[tuple[str, RuleHit]]]:
    """``(the first rule that blocks, or None; the rules that ask for a human)``.
    A rule that cannot read the call, or raises, blocks (rules fail closed)."""
    asks: list[tuple[str, RuleHit]] = []
    for r in rules:
        try:
            hit = r.evaluate(request)
        except RuleUnreadable as exc:
            hit = RuleHit("BLOCK", f"rule {r.name} cannot read {request.tool}'s arguments: {exc}; rules fail closed")
        except Exception as exc:  # noqa: BLE001 - a rule that breaks refuses
            hit = RuleHit("BLOCK", f"rule {r.name} failed ({type(exc).__name__}: {exc}); rules fail closed")
        if hit is None:
            continue
        if hit.verdict == "BLOCK":
            return (r.name, hit), asks
        asks.append((r.name, hit))
    return None, asks


class Evaluation:
    """What the SagaPolicies and the rules make of one call, limits aside.

    Built by ``evaluate_call`` with the policies' answer (``admission``; None: no policy
    applies) and ``request``, the call as the rest of the gate sees it (tightened
    semantics, derived policy arguments). The rules run when first asked (``judge``,
    ``blocked``, ``asks``, ``verdict``): the gate asks after the limits, so a call already
    over budget never runs a rule. ``blocked`` is the first rule that refused; ``asks``
    the rules' then the policies' questions for a human.
    """

    __slots__ = ("_judged", "_policy_asks", "_rules", "admission", "observed_rules", "request")

    def __init__(self, request: StepRequest, admission: Admission | None, rules: Sequence[Rule],
                 observed_rules: tuple[Rule, ...] = ()) -> None:
        self.request = request
        self.admission = admission
        self.observed_rules = observed_rules
        self._rules = rules
        self._policy_asks = admission.asks if admission is not None else ()
        self._judged: tuple[tuple[str, RuleHit] | None, list[tuple[str, RuleHit]]] | None = None

    @property
    def refused_by_policy(self) -> bool:
        """The policies refused the call (undeclared, a path missing): no rule runs."""
        return self.admission is not None and self.admission.verdict == "BLOCK"

    def judge(self) -> tuple[tuple[str, RuleHit] | None, list[tuple[str, RuleHit]]]:
        """``(the first rule that blocks, or None; the questions for a human)``: the rules
        run once, over ``request``."""
        if self._judged is None:
            if self.refused_by_policy:
                self._judged = (None, [])
            else:
                blocked, asks = apply_rules(self._rules, self.request)
                if self._policy_asks and blocked is None:
                    asks.extend((name, RuleHit("REQUIRE_APPROVAL", why)) for name, why in self._policy_asks)
                self._judged = (blocked, asks)
        return self._judged

    @property
    def blocked(self) -> tuple[str, RuleHit] | None:
        return self.judge()[0]

    @property
    def asks(self) -> list[tuple[str, RuleHit]]:
        return self.judge()[1]

    @property
    def verdict(self) -> Verdict:
        """BLOCK (a policy or a rule refused), REQUIRE_APPROVAL (a human is asked) or ALLOW."""
        if self.refused_by_policy or self.blocked is not None:
            return "BLOCK"
        return "REQUIRE_APPROVAL" if self.asks else "ALLOW"

    @property
    def decided_by(self) -> str:
        """``policy:<id>``, ``rule:<name>``, or "" for an ALLOW."""
        if self.admission is not None and self.refused_by_policy:
            return self.admission.decided_by
        blocked, asks = self.judge()
        if blocked is not None:
            return "rule:" + blocked[0]
        return "rule:" + asks[0][0] if asks else ""

    @property
    def reason(self) -> str:
        """Why: the refusal's sentence, or every question for a human joined."""
        if self.admission is not None and self.refused_by_policy:
            return self.admission.reason
        blocked, asks = self.judge()
        if blocked is not None:
            return blocked[1].reason
        return "; ".join(hit.reason for _, hit in asks)


def evaluate_call(request: StepRequest, pset: PolicySet | None, rules: Sequence[Rule]) -> Evaluation:
    """The gate's SagaPolicy and rule stages for ``request`` (see the module doc): the
    policies in ``pset`` admit or refuse it now; ``rules`` then the policies' enforced
    rules run over the call they tightened when the answer is first asked for."""
    if not pset:
        return Evaluation(request, None, rules)
    adm = pset.admit(request, has_compensation=request.has_inverse)
    enforced, observed = compile_rules(pset)
    return Evaluation(adm.request, adm, (*rules, *enforced) if enforced else rules, observed)
