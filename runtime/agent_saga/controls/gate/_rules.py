"""Gate rules: per-call policy over what a step is about to do.

A rule sees the whole ``StepRequest`` (tool, semantics, policy arguments, saga tags) and
answers ``None`` (no objection) or a ``RuleHit``: REQUIRE_APPROVAL (a named human must
say yes) or BLOCK (refused). The gate evaluates rules after the limits, in order; a BLOCK
ends the evaluation, otherwise the first REQUIRE_APPROVAL decides and the reasons of
every rule that asked are joined.

Invariants:
- The default rule, ``irreversible_requires_human()`` (name ``irreversible``), is always
  evaluated unless the gate is built with ``default_rules=()``: an IRREVERSIBLE step does
  not start without a human.
- A rule that cannot read what it inspects (an argument present but not a number) or
  that raises refuses the call (BLOCK naming the rule); an argument that is absent means
  the rule does not apply to this tool.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ...errors import ConfigurationError
from ...gates import StepRequest
from ...semantics import ActionSemantics
from ..limits._model import number_problem

__all__ = [
    "DEFAULT_RULES",
    "Rule",
    "RuleHit",
    "arg_exceeds",
    "irreversible_requires_human",
    "rule",
    "tagged",
    "tool_matches",
]

RuleVerdict = Literal["REQUIRE_APPROVAL", "BLOCK"]


@dataclass(frozen=True, slots=True)
class RuleHit:
    """A rule's objection: the verdict it asks for and why (a sentence for a human)."""

    verdict: RuleVerdict
    reason: str


@runtime_checkable
class Rule(Protocol):
    """A per-call policy. ``name`` identifies it in verdicts, the WAL and approval ids."""

    @property
    def name(self) -> str:
        """The rule's name (``rule:<name>`` in verdicts)."""

    def evaluate(self, request: StepRequest) -> RuleHit | None:
        """``None`` if the rule has no objection to ``request``, else what it asks for."""
        ...


class RuleUnreadable(Exception):
    """A rule could not read what it inspects (internal; the gate turns it into BLOCK)."""


def _check_verdict(verdict: str) -> RuleVerdict:
    v = verdict.upper() if isinstance(verdict, str) else verdict
    if v == "REQUIRE_APPROVAL":
        return "REQUIRE_APPROVAL"
    if v == "BLOCK":
        return "BLOCK"
    raise ConfigurationError(
        f"a rule's verdict must be 'REQUIRE_APPROVAL' or 'BLOCK', got {verdict!r} "
        f"(a rule that allows is a rule that does not match)"
    )


@dataclass(frozen=True, slots=True)
class PredicateRule:
    """A rule from a predicate: when ``when(request)`` is true, ask for ``verdict``."""

    name: str
    when: Callable[[StepRequest], bool]
    verdict: RuleVerdict = "REQUIRE_APPROVAL"
    reason: str = ""

    def evaluate(self, request: StepRequest) -> RuleHit | None:
        if self.when(request):
            return RuleHit(self.verdict, self.reason or f"rule {self.name} matched")
        return None


def rule(
    name: str,
    when: Callable[[StepRequest], bool],
    verdict: str = "REQUIRE_APPROVAL",
    reason: str = "",
) -> Rule:
    """A rule that asks for ``verdict`` whenever ``when(request)`` is true.

    ``rule("eu-wires", lambda r: r.tool == "wire.send" and "eu" in r.tags, "BLOCK",
    "EU wires are paused")``. A ``when`` that raises refuses the call.
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError("a rule needs a non-empty name (it appears in verdicts and the WAL)")
    if not callable(when):
        raise ConfigurationError(f"rule {name!r}: when= must be a callable taking the StepRequest")
    return PredicateRule(name, when, _check_verdict(verdict), reason)


def _is_irreversible(request: StepRequest) -> bool:
    return request.semantics == ActionSemantics.IRREVERSIBLE  # members equal their names


def irreversible_requires_human() -> Rule:
    """The default rule: an IRREVERSIBLE step needs a named human's approval."""
    return PredicateRule("irreversible", _is_irreversible, "REQUIRE_APPROVAL", "Action cannot be undone")


DEFAULT_RULES: tuple[Rule, ...] = (irreversible_requires_human(),)


@dataclass(frozen=True, slots=True)
class _ArgExceeds:
    name: str
    arg: str
    threshold: float
    verdict: RuleVerdict

    def evaluate(self, request: StepRequest) -> RuleHit | None:
        args = request.policy_args
        if self.arg not in args:
            return None
        value = args[self.arg]
        why = number_problem(value) if not (isinstance(value, float) and math.isinf(value)) else None
        if why is not None:
            raise RuleUnreadable(f"policy argument {self.arg!r} {why}")
        if value > self.threshold:
            return RuleHit(self.verdict, f"{self.arg} {value:g} exceeds {self.threshold:g}")
        return None


def arg_exceeds(
    arg: str, threshold: float, verdict: str = "REQUIRE_APPROVAL", *, name: str | None = None
) -> Rule:
    """Ask for ``verdict`` when the policy argument ``arg`` is greater than ``threshold``.

    A per-call threshold, not a spending control (1,000 charges of 999 all pass it: use a
    ``BudgetLimit`` for that). A call without ``arg`` is not matched; a call whose ``arg``
    is not a number is refused.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
        raise ConfigurationError(f"arg_exceeds({arg!r}, ...): threshold must be a finite number, got {threshold!r}")
    return _ArgExceeds(name or f"{arg}-exceeds-{threshold:g}", arg, float(threshold), _check_verdict(verdict))


@dataclass(frozen=True, slots=True)
class _ToolMatches:
    name: str
    patterns: tuple[str, ...]
    regex: re.Pattern[str]
    verdict: RuleVerdict
    reason: str

    def evaluate(self, request: StepRequest) -> RuleHit | None:
        if self.regex.match(request.tool):
            return RuleHit(self.verdict, self.reason or f"tool {request.tool} matches {', '.join(self.patterns)}")
        return None


def tool_matches(*patterns: str, verdict: str = "BLOCK", reason: str = "", name: str | None = None) -> Rule:
    """Ask for ``verdict`` (default BLOCK) for tools matching a shell pattern (``"stripe.*"``)."""
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise ConfigurationError("tool_matches() needs at least one tool name or pattern, e.g. 'wire.*'")
    regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
    return _ToolMatches(name or "tool:" + ",".join(patterns), tuple(patterns), regex, _check_verdict(verdict), reason)


@dataclass(frozen=True, slots=True)
class _Tagged:
    name: str
    tag: str
    verdict: RuleVerdict
    reason: str

    def evaluate(self, request: StepRequest) -> RuleHit | None:
        if self.tag in request.tags:
            return RuleHit(self.verdict, self.reason or f"saga is tagged {self.tag!r}")
        return None


def tagged(tag: str, verdict: str = "REQUIRE_APPROVAL", reason: str = "", *, name: str | None = None) -> Rule:
    """Ask for ``verdict`` for every step of a saga carrying ``tag``."""
    if not isinstance(tag, str) or not tag:
        raise ConfigurationError("tagged() needs a non-empty tag")
    return _Tagged(name or f"tag:{tag}", tag, _check_verdict(verdict), reason)
