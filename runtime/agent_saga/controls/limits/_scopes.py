"""Limit scopes: which calls share one window.

A scope turns a step into the key of the window it is counted in. ``global_scope`` (the
default) counts every call in one window; ``by_tool`` keeps one window per tool;
``by_arg("customer_id")`` one per value of a policy argument; ``combine(...)`` one per
combination (per tool *and* customer).

Invariants:
- A key is a plain string, stable across processes and hosts (it names a Redis key), and
  never contains a newline. Keys from different scopes of one limit cannot collide,
  because each part is prefixed with what it is (``tool=``, ``customer_id=``).
- A scope that cannot read what it keys on (``by_arg`` with the argument missing, null,
  or not a string or integer) raises ``ScopeUnreadable``: the gate refuses the call
  rather than count it in a window it does not belong to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ...errors import ConfigurationError
from ...gates import StepRequest

__all__ = ["Scope", "ScopeUnreadable", "by_arg", "by_tool", "combine", "global_scope"]

_MAX_VALUE = 200


class ScopeUnreadable(Exception):
    """The scope could not derive a key from the request (internal to the gate)."""

    def __init__(self, arg: str, why: str) -> None:
        super().__init__(why)
        self.arg = arg
        self.why = why


@runtime_checkable
class Scope(Protocol):
    """Maps a step to the key of its window; ``name`` describes the scope (for status)."""

    @property
    def name(self) -> str:
        """The scope's name in a ``LimitSpec`` (``global``, ``tool``, ``arg:x``, ``a+b``)."""

    def key(self, request: StepRequest) -> str:
        """The window key for ``request``; raises ``ScopeUnreadable`` if it has none."""
        ...


@dataclass(frozen=True, slots=True)
class _Global:
    name: str = "global"

    def key(self, request: StepRequest) -> str:
        return "*"

    def __repr__(self) -> str:
        return "global_scope"


@dataclass(frozen=True, slots=True)
class _ByTool:
    name: str = "tool"

    def key(self, request: StepRequest) -> str:
        tool = request.tool
        if "\n" in tool or "\r" in tool:
            raise ScopeUnreadable("tool", f"tool name {tool!r} contains a line break")
        return "tool=" + tool

    def __repr__(self) -> str:
        return "by_tool"


@dataclass(frozen=True, slots=True)
class _ByArg:
    arg: str

    @property
    def name(self) -> str:
        return "arg:" + self.arg

    def key(self, request: StepRequest) -> str:
        args = request.policy_args
        if self.arg not in args:
            raise ScopeUnreadable(self.arg, f"policy argument {self.arg!r} is missing")
        value = args[self.arg]
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ScopeUnreadable(
                self.arg,
                f"policy argument {self.arg!r} is {value!r}, not a string or integer id",
            )
        text = str(value) if not isinstance(value, int) or value.bit_length() <= 4 * _MAX_VALUE else ""
        if not text or len(text) > _MAX_VALUE or "\n" in text or "\r" in text:
            raise ScopeUnreadable(
                self.arg,
                f"policy argument {self.arg!r} must be a non-empty id of at most "
                f"{_MAX_VALUE} characters without line breaks",
            )
        return f"{self.arg}={text}"

    def __repr__(self) -> str:
        return f"by_arg({self.arg!r})"


@dataclass(frozen=True, slots=True)
class _Combined:
    parts: tuple[Scope, ...]

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.parts)

    def key(self, request: StepRequest) -> str:
        return "|".join(p.key(request) for p in self.parts)

    def __repr__(self) -> str:
        return "combine(" + ", ".join(repr(p) for p in self.parts) + ")"


#: One window for every call the limit applies to (the default scope).
global_scope: Scope = _Global()

#: One window per tool name.
by_tool: Scope = _ByTool()


def by_arg(arg: str) -> Scope:
    """One window per value of the policy argument ``arg`` (e.g. ``"customer_id"``).

    A call whose ``arg`` is missing, null, or not a string or integer is refused by the
    gate (it cannot be attributed to a window), never counted in a shared one.
    """
    if not isinstance(arg, str) or not arg or "\n" in arg:
        raise ConfigurationError(f"by_arg() needs the name of a policy argument, got {arg!r}")
    return _ByArg(arg)


def combine(*scopes: Scope) -> Scope:
    """One window per combination of the given scopes: ``combine(by_tool, by_arg("c"))``."""
    if not scopes:
        raise ConfigurationError("combine() needs at least one scope, e.g. combine(by_tool, by_arg('customer_id'))")
    parts: list[Scope] = []
    for s in scopes:
        if not isinstance(s, Scope):
            raise ConfigurationError(
                f"combine() takes scopes (global_scope, by_tool, by_arg(...)), got {s!r}; "
                f"note by_tool is used without parentheses"
            )
        if isinstance(s, _Combined):
            parts.extend(s.parts)
        elif not isinstance(s, _Global):
            parts.append(s)
    if not parts:
        return global_scope
    return parts[0] if len(parts) == 1 else _Combined(tuple(parts))
