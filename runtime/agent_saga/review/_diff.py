"""A semantic diff of two SagaPolicies: what became stricter, what became looser.

    changes = diff_policies(old, new)      # [Change(scope="tool:wire.send", aspect="semantics", ...)]

Each change names where (``policy`` or ``tool:<name>``), the aspect, the old and the new
value, and a direction:

    stricter   the new policy refuses or asks a human about at least what the old one did
    looser     it may let through what the old one stopped, or the change cannot be
               ordered (a different inverse, a different path, another tag): it is not
               a tightening, so a reviewer must look at it
    reworded   only a sentence a human reads changed (a rule's reason)

Orders used: IRREVERSIBLE > COMPENSABLE > REVERSIBLE; undeclared tools Refuse >
RequireApproval > Allow; Enforce > Observe; a rule's Block > RequireApproval; a lower
``argExceeds`` threshold is stricter; more ``toolMatches`` globs or agents governed is
stricter. A tool the new policy declares and the old did not is compared with what the
old policy did to it as an undeclared tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..controls.policy import PolicyRule, SagaPolicy, ToolDeclaration
from ..semantics import ActionSemantics

__all__ = ["Change", "diff_policies", "diff_exit_code"]

_SEM = {ActionSemantics.REVERSIBLE: 0, ActionSemantics.COMPENSABLE: 1, ActionSemantics.IRREVERSIBLE: 2}
_UNDECLARED = {"Allow": 0, "RequireApproval": 1, "Refuse": 2}
_MODE = {"Observe": 0, "Enforce": 1}
_RULE = {"RequireApproval": 0, "Block": 1}


@dataclass(frozen=True, slots=True)
class Change:
    """One difference (see the module doc)."""

    scope: str
    aspect: str
    old: Any
    new: Any
    direction: str  # stricter | looser | reworded

    def to_doc(self) -> dict[str, Any]:
        return {"scope": self.scope, "aspect": self.aspect, "old": self.old, "new": self.new,
                "direction": self.direction}

    def describe(self) -> str:
        return f"{self.scope}: {self.aspect} {_show(self.old)} -> {_show(self.new)} ({self.direction})"


def _show(v: Any) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def _order(rank: dict[Any, int], old: Any, new: Any) -> str:
    return "stricter" if rank[new] > rank[old] else "looser"


def _sets(old: set[str], new: set[str]) -> str:
    return "stricter" if new >= old else "looser"


def diff_policies(old: SagaPolicy, new: SagaPolicy) -> list[Change]:
    """Every difference between ``old`` and ``new`` that changes what the gate does (and
    reworded reasons), policy-wide first, then tool by tool, then rule by rule."""
    out: list[Change] = []
    if old.mode != new.mode:
        out.append(Change("policy", "mode", old.mode, new.mode, _order(_MODE, old.mode, new.mode)))
    if old.undeclared_tools != new.undeclared_tools:
        out.append(Change("policy", "undeclaredTools", old.undeclared_tools, new.undeclared_tools,
                          _order(_UNDECLARED, old.undeclared_tools, new.undeclared_tools)))
    a = None if old.applies_to is None else list(old.applies_to.agents)
    b = None if new.applies_to is None else list(new.applies_to.agents)
    if a != b:
        # None governs every agent of the namespace: more than any list.
        direction = "stricter" if b is None else "looser" if a is None else _sets(set(a), set(b))
        out.append(Change("policy", "appliesTo.agents", a, b, direction))
    for name in sorted(set(old.tools) | set(new.tools)):
        out.extend(_tool(name, old, new))
    out.extend(_rules(old.rules, new.rules))
    return out


def _level(decl: ToolDeclaration | None, policy: SagaPolicy) -> int:
    """What a policy does to every call of a tool: 2 refused, 1 a human asked, 0 neither."""
    if decl is None:
        return _UNDECLARED[policy.undeclared_tools]
    return 1 if decl.require_approval or decl.semantics is ActionSemantics.IRREVERSIBLE else 0


def _tool(name: str, old: SagaPolicy, new: SagaPolicy) -> list[Change]:
    scope = f"tool:{name}"
    a, b = old.tools.get(name), new.tools.get(name)
    if a is None or b is None:
        before, after = _level(a, old), _level(b, new)
        what = "declared" if a is None else "removed"
        shown_old = f"undeclared ({old.undeclared_tools})" if a is None else _decl(a)
        shown_new = f"undeclared ({new.undeclared_tools})" if b is None else _decl(b)
        direction = "stricter" if after > before or (after == before and a is None) else "looser"
        return [Change(scope, what, shown_old, shown_new, direction)]
    out: list[Change] = []
    if a.semantics is not b.semantics:
        out.append(Change(scope, "semantics", a.semantics.value, b.semantics.value,
                          _order(_SEM, a.semantics, b.semantics)))
    if a.compensate != b.compensate:
        # A different inverse is not a tightening: what the undo does changed.
        out.append(Change(scope, "compensate", a.compensate.to_doc() if a.compensate else None,
                          b.compensate.to_doc() if b.compensate else None, "looser"))
    if a.require_approval != b.require_approval:
        out.append(Change(scope, "requireApproval", a.require_approval, b.require_approval,
                          "stricter" if b.require_approval else "looser"))
    for arg in sorted(set(a.policy_args) | set(b.policy_args)):
        pa, pb = a.policy_args.get(arg), b.policy_args.get(arg)
        if pa is not None and pb is not None and pa.text == pb.text:
            continue
        # A new path makes the argument visible to rules and limits (and refuses a call
        # without it); a removed or moved one may hide what they weighed.
        out.append(Change(scope, f"policyArgs.{arg}", pa.text if pa else None, pb.text if pb else None,
                          "stricter" if pa is None else "looser"))
    return out


def _decl(d: ToolDeclaration) -> str:
    return d.semantics.value + (" requireApproval" if d.require_approval else "")


def _rules(old: tuple[PolicyRule, ...], new: tuple[PolicyRule, ...]) -> list[Change]:
    out: list[Change] = []
    before = {r.name: r for r in old}
    after = {r.name: r for r in new}
    for name in sorted(set(before) | set(after)):
        scope = f"rule:{name}"
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            r = a or b
            assert r is not None
            out.append(Change(scope, "added" if a is None else "removed", None if a is None else r.to_doc(),
                              None if b is None else r.to_doc(), "stricter" if a is None else "looser"))
            continue
        if a.verdict != b.verdict:
            out.append(Change(scope, "verdict", a.verdict, b.verdict, _order(_RULE, a.verdict, b.verdict)))
        if a.condition != b.condition:
            out.append(Change(scope, a.condition[0] if a.condition[0] == b.condition[0] else "condition",
                              _cond(a), _cond(b), _condition(a, b)))
        if a.reason != b.reason:
            out.append(Change(scope, "reason", a.reason, b.reason, "reworded"))
    return out


def _cond(r: PolicyRule) -> Any:
    kind, value = r.condition
    if kind == "argExceeds":
        return {"arg": value[0], "threshold": value[1]}
    return list(value) if kind == "toolMatches" else value


def _condition(a: PolicyRule, b: PolicyRule) -> str:
    (ka, va), (kb, vb) = a.condition, b.condition
    if ka != kb:
        return "looser"
    if ka == "argExceeds":
        return "stricter" if va[0] == vb[0] and vb[1] < va[1] else "looser"
    if ka == "toolMatches":
        return _sets(set(va), set(vb))
    return "looser"  # another tag: not a tightening


def diff_exit_code(changes: list[Change]) -> int:
    """0 nothing the gate does changed, 1 stricter only, 3 something looser."""
    if any(c.direction == "looser" for c in changes):
        return 3
    return 1 if any(c.direction == "stricter" for c in changes) else 0
