"""Spend and rate limits: statements about a window, which is why they need a store.

``arg_exceeds("amount", 1000)`` inspects one call; ``BudgetLimit("daily-spend",
arg="amount", max_total=50_000, window=86_400)`` bounds the sum of ``amount`` over every
call in the last 24 hours, and ``RateLimit("velocity", max_calls=20, window=60)`` the
number of calls in the last minute.

Invariants (the gate and the stores keep them; see docs/limits.md):
- A limit applies to every call unless ``tools=`` names the tools it polices (shell-style
  patterns, ``"stripe.*"``). A budget that applies to a call but cannot read its amount
  (argument missing, not a number, NaN, infinite or negative) refuses the call; so does a
  scope that cannot read its key. Nothing is guessed.
- The meter is gross authorised outflow: an authorisation stays debited whatever the
  step does afterwards (fails, times out, is compensated). Only a refusal hands it back.
- ``escalate_to_human=True`` turns "over budget" into REQUIRE_APPROVAL; the approved call
  is debited (it is authorised spend, and may take the window over its maximum). With no
  approver configured it is refused.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ...errors import ConfigurationError
from ...gates import StepRequest
from ._scopes import Scope, global_scope

__all__ = [
    "BudgetLimit",
    "Charge",
    "DebitResult",
    "Limit",
    "LimitKind",
    "LimitSpec",
    "LimitUnreadable",
    "LimitUsage",
    "RateLimit",
    "display_amount",
    "format_amount",
]

LimitKind = Literal["budget", "rate"]

SPEC_VERSION = 1

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """A limit's definition as a store and ``agent-saga status`` see it (JSON, ``v`` = 1)."""

    name: str
    kind: LimitKind
    max_total: float
    window: float
    scope: str = "global"
    arg: str | None = None
    escalate_to_human: bool = False
    tools: tuple[str, ...] | None = None

    def to_doc(self) -> dict[str, Any]:
        """The definition as JSON (``v`` 1)."""
        return {
            "v": SPEC_VERSION,
            "name": self.name,
            "kind": self.kind,
            "arg": self.arg,
            "max_total": self.max_total,
            "window": self.window,
            "scope": self.scope,
            "escalate_to_human": self.escalate_to_human,
            "tools": list(self.tools) if self.tools is not None else None,
        }

    def to_json(self) -> str:
        """``to_doc`` as canonical JSON text."""
        return json.dumps(self.to_doc(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> LimitSpec:
        """Read a definition; raises ``ValueError`` for another ``v`` or kind."""
        if doc.get("v") != SPEC_VERSION:
            raise ValueError(f"limit definition schema v={doc.get('v')!r} is not supported")
        tools = doc.get("tools")
        kind = doc["kind"]
        if kind not in ("budget", "rate"):
            raise ValueError(f"limit kind {kind!r} is not budget or rate")
        return cls(
            name=str(doc["name"]),
            kind=kind,
            max_total=float(doc["max_total"]),
            window=float(doc["window"]),
            scope=str(doc.get("scope", "global")),
            arg=doc.get("arg"),
            escalate_to_human=bool(doc.get("escalate_to_human", False)),
            tools=tuple(tools) if tools is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Charge:
    """What one call costs against one limit: ``amount`` in the window ``key``."""

    limit: str
    key: str
    amount: float
    max_total: float
    window: float
    escalate_to_human: bool = False
    kind: LimitKind = "budget"


@dataclass(frozen=True, slots=True)
class DebitResult:
    """The answer to one ``debit``.

    ``ok``: every charge was debited. ``used``: each window's total *before* this call
    (after trimming); always given on a refusal, possibly empty when ok (the Redis store
    does not spend a reply on it). ``over``: indices of the charges that did not fit
    (empty when ok). ``replayed``: ``debit_id`` had already been debited by an earlier
    attempt of the same call; nothing was added.
    """

    ok: bool
    used: tuple[float, ...]
    over: tuple[int, ...] = ()
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """One window's use: ``used`` of ``max_total`` in the last ``window`` seconds.

    ``entries`` is the number of debits in the window; ``frees_in`` the seconds until the
    oldest one leaves it (None when the window is empty).
    """

    name: str
    kind: LimitKind
    key: str
    used: float
    max_total: float
    window: float
    entries: int
    frees_in: float | None

    @property
    def remaining(self) -> float:
        """What is left of ``max_total`` in the window (never negative)."""
        return max(0.0, self.max_total - self.used)

    def to_doc(self) -> dict[str, Any]:
        """The window's use as JSON (``agent-saga status --json``)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "scope_key": self.key,
            "used": self.used,
            "max_total": self.max_total,
            "remaining": self.remaining,
            "window": self.window,
            "entries": self.entries,
            "frees_in": self.frees_in,
        }


def number_problem(value: Any) -> str | None:
    """Why the policy argument ``value`` is not a number a limit or a rule can weigh (the
    end of a sentence "policy argument 'amount' ..."), or None. An integer beyond the
    largest float (about 1.8e308) is refused here, by its size, never converted (a raw
    ``OverflowError``) or printed whole."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"is {_short(value)}, not a number"
    if isinstance(value, int):
        if abs(value) > sys.float_info.max:
            return (f"is an integer of {value.bit_length()} bits, beyond the largest number a limit or "
                    f"rule can weigh (about 1.8e308): pass the amount in a unit that keeps it smaller")
        return None
    if not math.isfinite(value):
        return f"is {value!r}, not a finite number"
    return None


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) else f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 80 else text[:77] + "..."


def display_amount(amount: float) -> str:
    """An amount for a person: ``50,000``, ``12.50``, ``0.0001`` (never rounded to ``0.00``)."""
    x = float(amount)
    if x.is_integer():
        return f"{x:,.0f}"
    return f"{x:,.2f}" if abs(x) >= 1 else f"{x:.4g}"


def format_amount(amount: float) -> str:
    """The exact text of an amount, as stored in a debit entry (``4200``, ``12.5``)."""
    if isinstance(amount, int) or amount.is_integer() and abs(amount) < 2**53:
        return str(int(amount))
    return repr(float(amount))


class LimitUnreadable(Exception):
    """A limit could not price a call (internal to the gate, which turns it into BLOCK)."""

    def __init__(self, limit: str, arg: str, why: str) -> None:
        super().__init__(why)
        self.limit = limit
        self.arg = arg
        self.why = why


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"limit name {name!r} is not valid: use 1-100 characters from [A-Za-z0-9._-] "
            f"starting with a letter or digit (it names the limit's windows in the store)"
        )
    return name


def _check_positive(limit: str, what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"limit {limit!r}: {what} must be a positive finite number, got {value!r}")
    return float(value)


def _compile_tools(limit: str, tools: Sequence[str] | None) -> tuple[tuple[str, ...] | None, re.Pattern[str] | None]:
    if tools is None:
        return None, None
    if isinstance(tools, str):
        tools = (tools,)
    pats = tuple(tools)
    if not pats or not all(isinstance(p, str) and p for p in pats):
        raise ConfigurationError(
            f"limit {limit!r}: tools= must be a non-empty list of tool names or patterns "
            f"(e.g. ['stripe.*']), or omitted to police every tool"
        )
    return pats, re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in pats))


def _check_scope_and_tools(limit: BudgetLimit | RateLimit) -> None:
    """Validate ``limit.scope`` and compile ``limit.tools`` (in place: the limits are frozen)."""
    if not isinstance(limit.scope, Scope):
        raise ConfigurationError(f"limit {limit.name!r}: scope= must be a scope (global_scope, by_tool, by_arg(...), "
                                 f"combine(...)), got {limit.scope!r}")
    tools, match = _compile_tools(limit.name, limit.tools)
    object.__setattr__(limit, "tools", tools)
    object.__setattr__(limit, "_match", match)


@dataclass(frozen=True, slots=True)
class BudgetLimit:
    """At most ``max_total`` of the policy argument ``arg`` summed over ``window`` seconds.

    One window per ``scope`` key (default: one for every call). Over budget refuses the
    call (BLOCK) or, with ``escalate_to_human=True``, asks a human (REQUIRE_APPROVAL).
    ``tools`` restricts the limit to matching tools; by default it polices every call
    and a call without a readable ``arg`` is refused.
    """

    name: str
    arg: str
    max_total: float
    window: float
    scope: Scope = global_scope
    escalate_to_human: bool = False
    tools: tuple[str, ...] | None = None
    _match: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    kind: LimitKind = field(default="budget", init=False)

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not isinstance(self.arg, str) or not self.arg:
            raise ConfigurationError(f"limit {self.name!r}: arg= must name the policy argument that carries the amount")
        object.__setattr__(self, "max_total", _check_positive(self.name, "max_total", self.max_total))
        object.__setattr__(self, "window", _check_positive(self.name, "window", self.window))
        _check_scope_and_tools(self)

    def applies_to(self, request: StepRequest) -> bool:
        """Whether this limit polices ``request`` (its tool matches ``tools``, if given)."""
        return self._match is None or self._match.match(request.tool) is not None

    def charge(self, request: StepRequest) -> Charge:
        """What ``request`` costs against this limit; raises ``LimitUnreadable``."""
        args = request.policy_args
        arg = self.arg
        if arg not in args:
            raise LimitUnreadable(self.name, arg, f"policy argument {arg!r} is missing")
        amount: Any = args[arg]
        why = number_problem(amount)
        if why is not None:
            raise LimitUnreadable(self.name, arg, f"policy argument {arg!r} {why}")
        if amount < 0:
            raise LimitUnreadable(self.name, arg, f"policy argument {arg!r} is negative ({amount!r}); a refund is not a charge")
        return Charge(
            self.name, self.scope.key(request), amount, self.max_total, self.window,
            self.escalate_to_human, "budget",
        )

    def spec(self) -> LimitSpec:
        """The limit's definition as a store and ``agent-saga status`` see it."""
        return LimitSpec(self.name, "budget", self.max_total, self.window, self.scope.name,
                         self.arg, self.escalate_to_human, self.tools)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``max_calls`` calls in any ``window`` seconds, per ``scope`` key.

    Counted exactly like a budget whose every call costs 1 (a sliding-window log, not a
    token bucket: see docs/limits.md). Over the limit refuses the call.
    """

    name: str
    max_calls: int
    window: float
    scope: Scope = global_scope
    tools: tuple[str, ...] | None = None
    _match: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    kind: LimitKind = field(default="rate", init=False)
    escalate_to_human: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        _check_name(self.name)
        if isinstance(self.max_calls, bool) or not isinstance(self.max_calls, int) or self.max_calls < 1:
            raise ConfigurationError(f"limit {self.name!r}: max_calls must be a positive integer, got {self.max_calls!r}")
        object.__setattr__(self, "window", _check_positive(self.name, "window", self.window))
        _check_scope_and_tools(self)

    @property
    def max_total(self) -> float:
        """``max_calls`` as the window's maximum."""
        return float(self.max_calls)

    def applies_to(self, request: StepRequest) -> bool:
        """Whether this limit polices ``request`` (its tool matches ``tools``, if given)."""
        return self._match is None or self._match.match(request.tool) is not None

    def charge(self, request: StepRequest) -> Charge:
        """One call against this limit's window; raises ``LimitUnreadable`` via its scope."""
        return Charge(self.name, self.scope.key(request), 1, float(self.max_calls), self.window, False, "rate")

    def spec(self) -> LimitSpec:
        """The limit's definition as a store and ``agent-saga status`` see it."""
        return LimitSpec(self.name, "rate", float(self.max_calls), self.window, self.scope.name,
                         None, False, self.tools)


Limit = BudgetLimit | RateLimit
