"""The SagaPolicy stage of the gate: what the reviewed policies make of a call.

Between the pre-checks and the limits, the gate asks the policies in force for this
agent (``agent_saga.controls.policy``) to admit the call: an undeclared tool is refused
there, before anything is spent; otherwise the call continues with the semantics and
policy arguments the policies tightened, and their questions for a human wait for the
approval stage. The policies' gate rules are compiled here into the gate's own rules
(``arg_exceeds``, ``tagged``, ``tool_matches``) and evaluated after the gate's rules.

Invariants:
- A source whose policies cannot be used (never read, or the policy plane lost for
  longer than its grace window) refuses every call (``decided_by: policy-source``).
- Compiled rules are cached per ``PolicySet`` (a new set is a new version): the hot path
  builds nothing when nothing changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...compensation import Compensation
from ...errors import CompensationError
from ..policy import Compensate, PolicyRule, PolicySet
from ._rules import Rule, RuleHit, arg_exceeds, tagged, tool_matches

__all__ = ["compile_rules", "inverse_factory"]


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
