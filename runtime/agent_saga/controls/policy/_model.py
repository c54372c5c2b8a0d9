"""The SagaPolicy schema: one definition for the custom resource's spec and the policy file.

A SagaPolicy says, for the tools an agent may call, what undoing each one means, where
the inverse's arguments come from (the call, a constant, the forward result), which policy
arguments the gate and the limits read, and which calls need a human or are refused. The
same document is

- the ``spec`` of a ``SagaPolicy`` custom resource (``kubectl apply``), which the operator
  projects into the policy plane for the runtime's gate, and
- the MCP proxy's policy file (``saga-policy.json``).

    {"mode": "Enforce", "undeclaredTools": "Refuse",
     "appliesTo": {"agents": ["payments-*"]},
     "tools": {
       "stripe__create_charge": {"semantics": "COMPENSABLE",
          "compensate": {"tool": "stripe__create_refund", "args": {"charge": "$.id"}},
          "policyArgs": {"amount": "$.amount"}},
       "git_add": {"semantics": "COMPENSABLE",
          "compensate": {"tool": "git_reset", "callArgs": {"repo_path": "$.repo_path"}}},
       "search_docs": {"semantics": "REVERSIBLE"}},
     "rules": [{"name": "large-charges", "argExceeds": {"arg": "amount", "threshold": 10000},
                "verdict": "RequireApproval"}]}

Spellings: field names are the resource's camelCase (``policyArgs``); the policy file's
snake_case (``policy_args``) is the same field — one object may use either, never both.
Choice values are matched ignoring case and underscores (``enforce``, ``Enforce``;
``require_approval``, ``RequireApproval``). ``to_doc`` writes the canonical form.

Invariants:
- ``parse_policy`` refuses, with ``PolicyError`` naming the field path (``tools.x.compensate``)
  and the fix: unknown fields (with the closest known name), both spellings of one field,
  a COMPENSABLE tool without ``compensate``, an IRREVERSIBLE tool with one, a ``compensate``
  with neither or both of ``tool`` / ``handler``, an inverse argument named in two of
  ``args`` / ``callArgs`` / ``values``, a constant that is not JSON or looks like a
  credential, a tool name with wildcards or spaces, a path outside the JSONPath subset, a rule with zero or
  several conditions, two rules of one name, and every size the resource's schema bounds.
  The operator's CRD model accepts and refuses the same documents
  (tests/unit/policy/test_policy_schema_agreement.py).
- A parsed policy is immutable; parsing its canonical document again gives an equal policy (``parse_policy(p.to_doc()) == p``).
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ...compensation import HANDLER_PATTERN
from ...errors import ConfigurationError, SecretDetected
from ...payloads import snapshot
from ...semantics import ActionSemantics
from ._jsonpath import JsonPath, JsonPathError, compile_path
from ._jsonpath import kind_of as _kind

__all__ = [
    "AppliesTo",
    "Compensate",
    "PolicyError",
    "PolicyRule",
    "SagaPolicy",
    "ToolDeclaration",
    "parse_policy",
]

Mode = Literal["Enforce", "Observe"]
Undeclared = Literal["Refuse", "RequireApproval", "Allow"]
RuleVerdict = Literal["RequireApproval", "Block"]

# The patterns and bounds of the SagaPolicy CRD (operator/agent_saga_operator/models/).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")
TOOL_GLOB = re.compile(r"^[A-Za-z0-9_*?][A-Za-z0-9_.:/*?-]*$")
TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")
ARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
RULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
MAX_TOOLS, MAX_ARGS, MAX_RULES, MAX_GLOBS, MAX_AGENTS = 512, 32, 64, 32, 64
MAX_NAME, MAX_TAG, MAX_ARG, MAX_RULE, MAX_SENTENCE = 253, 63, 100, 100, 1024
MAX_VALUE = 1024  # characters of one compensate.values constant, as JSON


class PolicyError(ConfigurationError):
    """A policy document that cannot be enforced; ``field`` is the path of the offending
    field (``tools.stripe__create_charge.compensate``), the message says how to fix it."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}" if field_path else message)
        self.field = field_path


# ---------------------------------------------------------------- the parsed policy
@dataclass(frozen=True, slots=True)
class Compensate:
    """The inverse of a COMPENSABLE tool: another ``tool`` of the same server (the MCP
    proxy calls it) or a named ``handler`` (``@compensator``). Each of its arguments comes
    from one place: ``call_args`` (a path into the call's arguments), ``values`` (a
    constant) or ``args`` (a path into the forward result); no name is in two of them."""

    tool: str | None
    handler: str | None
    args: Mapping[str, JsonPath]
    call_args: Mapping[str, JsonPath] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """The handler's name, else the tool's (exactly one is set)."""
        return self.handler if self.handler is not None else str(self.tool)

    def from_call(self, call: Any) -> dict[str, Any]:
        """The arguments ``call_args`` reads from the call. Raises ``JsonPathMissing``."""
        return {name: path.read(call) for name, path in self.call_args.items()}

    def kwargs_for(self, call: Any, result: Any) -> dict[str, Any]:
        """The inverse's arguments: read from ``call`` and ``result``, with the constants
        (a fresh copy each time). Raises ``JsonPathMissing``."""
        kwargs = {name: path.read(result) for name, path in self.args.items()} if self.args else {}
        if self.call_args:
            kwargs.update(self.from_call(call))
        if self.values:
            kwargs.update(copy.deepcopy(dict(self.values)))
        return kwargs

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"tool": self.tool} if self.tool is not None else {"handler": self.handler}
        doc["args"] = {k: v.text for k, v in sorted(self.args.items())}
        if self.call_args:
            doc["callArgs"] = {k: v.text for k, v in sorted(self.call_args.items())}
        if self.values:
            doc["values"] = copy.deepcopy({k: self.values[k] for k in sorted(self.values)})
        return doc

    def sources(self) -> str:
        """Where each argument comes from, for a reviewer: ``repo_path <- call $.repo_path``."""
        parts = [f"{k} <- call {v.text}" for k, v in sorted(self.call_args.items())]
        parts += [f"{k} <- result {v.text}" for k, v in sorted(self.args.items())]
        parts += [f"{k} = {json.dumps(self.values[k])}" for k in sorted(self.values)]
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class ToolDeclaration:
    """One tool: its semantics, its inverse, where its policy arguments come from, and
    whether every call needs a human."""

    name: str
    semantics: ActionSemantics
    compensate: Compensate | None = None
    policy_args: Mapping[str, JsonPath] = field(default_factory=dict)
    require_approval: bool = False

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"semantics": self.semantics.value}
        if self.compensate is not None:
            doc["compensate"] = self.compensate.to_doc()
        if self.policy_args:
            doc["policyArgs"] = {k: v.text for k, v in sorted(self.policy_args.items())}
        if self.require_approval:
            doc["requireApproval"] = True
        return doc


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """A gate rule: when its one condition matches, ask a human or refuse. ``condition``
    is ``("toolMatches", (globs…))``, ``("tagged", tag)`` or ``("argExceeds", (arg, threshold))``."""

    name: str
    verdict: RuleVerdict
    condition: tuple[str, Any]
    reason: str | None = None

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "verdict": self.verdict}
        if self.reason is not None:
            doc["reason"] = self.reason
        kind, value = self.condition
        if kind == "toolMatches":
            doc[kind] = list(value)
        elif kind == "tagged":
            doc[kind] = value
        else:
            doc[kind] = {"arg": value[0], "threshold": value[1]}
        return doc


@dataclass(frozen=True, slots=True)
class AppliesTo:
    """Which agents (by name, shell globs) a policy governs."""

    agents: tuple[str, ...]

    def matches(self, agent: str) -> bool:
        return any(fnmatch.fnmatchcase(agent, g) for g in self.agents)


@dataclass(frozen=True, slots=True)
class SagaPolicy:
    """A parsed, validated SagaPolicy (see the module doc). ``applies_to`` None: every
    agent of the namespace."""

    mode: Mode = "Enforce"
    undeclared_tools: Undeclared = "Refuse"
    applies_to: AppliesTo | None = None
    tools: Mapping[str, ToolDeclaration] = field(default_factory=dict)
    rules: tuple[PolicyRule, ...] = ()

    def applies(self, agent: str) -> bool:
        """Does this policy govern the agent named ``agent``?"""
        return self.applies_to is None or self.applies_to.matches(agent)

    def to_doc(self) -> dict[str, Any]:
        """The canonical document (camelCase, tools sorted by name)."""
        doc: dict[str, Any] = {"mode": self.mode, "undeclaredTools": self.undeclared_tools}
        if self.applies_to is not None:
            doc["appliesTo"] = {"agents": list(self.applies_to.agents)}
        doc["tools"] = {name: self.tools[name].to_doc() for name in sorted(self.tools)}
        doc["rules"] = [r.to_doc() for r in self.rules]
        return doc


# ---------------------------------------------------------------- parsing
class _Object:
    """One JSON object being read: each field taken once, by either spelling."""

    def __init__(self, value: Any, where: str, fields: Mapping[str, tuple[str, ...]]) -> None:
        if not isinstance(value, Mapping):
            raise PolicyError(where, f"must be an object, got {_kind(value)}")
        self.where = where
        self.fields = fields
        self.value = value
        known = {spelling: canon for canon, alts in fields.items() for spelling in (canon, *alts)}
        for key in value:
            if not isinstance(key, str) or key not in known:
                close = difflib.get_close_matches(str(key), list(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise PolicyError(_join(where, str(key)), f"unknown field{hint}; the fields here are "
                                  f"{', '.join(fields)}")
        for canon, alts in fields.items():
            given = [s for s in (canon, *alts) if s in value]
            if len(given) > 1:
                raise PolicyError(_join(where, canon), f"given twice, as {' and '.join(map(repr, given))}: "
                                  f"they are the same field, keep one")

    def get(self, canon: str, *, nullable: bool = False) -> tuple[Any, str] | None:
        """``(value, field path)`` of a field given (by either spelling), else None. A
        ``nullable`` field given as null counts as absent."""
        for spelling in (canon, *self.fields[canon]):
            if spelling in self.value:
                if nullable and self.value[spelling] is None:
                    return None
                return self.value[spelling], _join(self.where, spelling)
        return None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _choice(value: Any, where: str, choices: tuple[str, ...]) -> str:
    if isinstance(value, str):
        key = value.replace("_", "").replace("-", "").strip().lower()
        for c in choices:
            if c.lower() == key:
                return c
    raise PolicyError(where, f"{value!r} is not one of {', '.join(choices)}")


def _string(value: Any, where: str, pattern: re.Pattern[str] | None, max_len: int, what: str) -> str:
    if not isinstance(value, str):
        raise PolicyError(where, f"must be a string ({what}), got {_kind(value)}")
    if not value or len(value) > max_len:
        raise PolicyError(where, f"must be 1 to {max_len} characters ({what}), got {len(value)}")
    if pattern is not None and not pattern.match(value):
        raise PolicyError(where, f"{value!r} is not {what}")
    return value


def _sentence(value: Any, where: str) -> str:
    text = _string(value, where, None, MAX_SENTENCE, "a sentence")
    if not text.strip():
        raise PolicyError(where, "must not be blank: say why, in a sentence a human reads")
    return text


def _list(value: Any, where: str, min_len: int, max_len: int) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise PolicyError(where, f"must be a list, got {_kind(value)}")
    if not min_len <= len(value) <= max_len:
        raise PolicyError(where, f"must have {min_len} to {max_len} entries, got {len(value)}")
    return list(value)


def _named(value: Any, where: str, what: str) -> list[tuple[str, str, Any]]:
    """``(name, field path, value)`` of an object of argument name -> ``what``."""
    if not isinstance(value, Mapping):
        raise PolicyError(where, f"must be an object of name -> {what}, got {_kind(value)}")
    if len(value) > MAX_ARGS:
        raise PolicyError(where, f"at most {MAX_ARGS} entries, got {len(value)}")
    out = []
    for name, item in value.items():
        here = _join(where, str(name))
        if not isinstance(name, str) or not name:
            raise PolicyError(here, "an argument name must be a non-empty string")
        out.append((name, here, item))
    return out


def _paths(value: Any, where: str, into: str) -> dict[str, JsonPath]:
    out: dict[str, JsonPath] = {}
    for name, here, path in _named(value, where, f"path into {into} (like {{\"charge\": \"$.id\"}})"):
        try:
            out[name] = compile_path(path, field=here)
        except JsonPathError as e:
            raise PolicyError(here, e.message.removeprefix(f"{here}: ")) from None
    return out


_POLICY_FIELDS = {"mode": (), "undeclaredTools": ("undeclared_tools",), "appliesTo": ("applies_to",),
                  "tools": (), "rules": ()}
_TOOL_FIELDS = {"semantics": (), "compensate": (), "policyArgs": ("policy_args",),
                "requireApproval": ("require_approval",)}
_COMPENSATE_FIELDS = {"tool": (), "handler": (), "args": (), "callArgs": ("call_args",), "values": ()}
_RULE_FIELDS = {"name": (), "verdict": (), "reason": (), "toolMatches": ("tool_matches",), "tagged": (),
                "argExceeds": ("arg_exceeds",)}
_ARG_EXCEEDS_FIELDS = {"arg": (), "threshold": ()}
_APPLIES_FIELDS = {"agents": ()}
_SEMANTICS = tuple(s.value for s in ActionSemantics)


def _compensate(value: Any, where: str) -> Compensate:
    obj = _Object(value, where, _COMPENSATE_FIELDS)
    tool, handler = obj.get("tool", nullable=True), obj.get("handler", nullable=True)
    if (tool is None) == (handler is None):
        raise PolicyError(where, "name exactly one inverse: tool (another tool of the same server, called with "
                          "args) or handler (a function registered with @compensator)")
    args, call_args, values = obj.get("args"), obj.get("callArgs", nullable=True), obj.get("values", nullable=True)
    from_result = _paths(args[0], args[1], "the forward result") if args else {}
    from_call = _paths(call_args[0], call_args[1], "the call's arguments") if call_args else {}
    constants = _constants(values[0], values[1]) if values else {}
    seen: dict[str, str] = {}
    for field_name, names in (("args", from_result), ("callArgs", from_call), ("values", constants)):
        for name in names:
            if name in seen:
                raise PolicyError(_join(_join(where, field_name), name), (
                    f"{name!r} is also in {seen[name]}: each argument of the inverse comes from one place, the call "
                    f"(callArgs), a constant (values) or the forward result (args); keep it in one of them"))
            seen[name] = field_name
    return Compensate(
        tool=_string(tool[0], tool[1], TOOL_NAME, MAX_NAME, "an exact tool name") if tool else None,
        handler=_string(handler[0], handler[1], HANDLER_PATTERN, 128,
                        "a handler name like 'stripe.refund' ([A-Za-z0-9._:/-])") if handler else None,
        args=from_result,
        call_args=from_call,
        values=constants,
    )


def _constants(value: Any, where: str) -> dict[str, Any]:
    """``compensate.values``: name -> a JSON constant, at most ``MAX_VALUE`` characters
    each, none that looks like a credential (it is written in the WAL with the inverse),
    no null as a member of an object (the resource could not keep it)."""
    out: dict[str, Any] = {}
    for name, here, constant in _named(value, where, "constant (like {\"force\": true})"):
        try:
            out[name] = snapshot(constant, here)
        except SecretDetected as e:  # written in the WAL with the inverse: never a credential
            raise PolicyError(here, e.message.removeprefix(f"{here} ") + "; a policy names constants, never "
                              "secrets (the inverse's handler resolves its credentials)") from None
        except ConfigurationError as e:  # not JSON
            raise PolicyError(here, e.message.removeprefix(f"{here} ")) from None
        size = len(json.dumps(out[name], separators=(",", ":")))
        if size > MAX_VALUE:
            raise PolicyError(here, f"at most {MAX_VALUE} characters as JSON, got {size}")
        null = _null_field(out[name], here) if out[name] is not None else here
        if null is not None:
            raise PolicyError(null, "is null, which kubectl apply reads as \"delete this field\", so the resource "
                              "would silently lose it: omit it, or give a value the inverse accepts")
    return out


def _null_field(value: Any, where: str) -> str | None:
    """The path of the first object member that is null in ``value``, if any."""
    if isinstance(value, dict):
        for k, v in value.items():
            found = _join(where, k) if v is None else _null_field(v, _join(where, k))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _null_field(v, f"{where}[{i}]")
            if found is not None:
                return found
    return None


def _tool(name: str, value: Any, where: str) -> ToolDeclaration:
    obj = _Object(value, where, _TOOL_FIELDS)
    sem = obj.get("semantics")
    if sem is None:
        raise PolicyError(_join(where, "semantics"), "required: REVERSIBLE, COMPENSABLE or IRREVERSIBLE "
                          "(when in doubt, IRREVERSIBLE)")
    semantics = ActionSemantics(_choice(sem[0], sem[1], _SEMANTICS).upper())
    comp = obj.get("compensate", nullable=True)
    compensate = _compensate(comp[0], comp[1]) if comp is not None else None
    if semantics is ActionSemantics.COMPENSABLE and compensate is None:
        raise PolicyError(_join(where, "compensate"), "required for a COMPENSABLE tool: name its inverse "
                          "(compensate: {tool: ..., callArgs: {...}, args: {...}}), or classify it IRREVERSIBLE")
    if semantics is ActionSemantics.IRREVERSIBLE and compensate is not None:
        raise PolicyError(_join(where, "compensate"), "an IRREVERSIBLE tool has no automated undo: remove "
                          "compensate, or classify it COMPENSABLE")
    pargs = obj.get("policyArgs", nullable=True)
    approval = obj.get("requireApproval")
    if approval is not None and not isinstance(approval[0], bool):
        raise PolicyError(approval[1], f"must be true or false, got {_kind(approval[0])}")
    return ToolDeclaration(
        name=name,
        semantics=semantics,
        compensate=compensate,
        policy_args=_paths(pargs[0], pargs[1], "the call's arguments") if pargs else {},
        require_approval=bool(approval[0]) if approval else False,
    )


def _rule(value: Any, where: str) -> PolicyRule:
    obj = _Object(value, where, _RULE_FIELDS)
    name = obj.get("name")
    if name is None:
        raise PolicyError(_join(where, "name"), "required: a rule's name appears in verdicts, the WAL and approvals")
    rule_name = _string(name[0], name[1], RULE_NAME, MAX_RULE, "a rule name ([A-Za-z0-9._:-], starting with a "
                        "letter or digit)")
    verdict = obj.get("verdict")
    chosen: RuleVerdict = "RequireApproval"
    if verdict is not None:
        chosen = "Block" if _choice(verdict[0], verdict[1], ("RequireApproval", "Block")) == "Block" \
            else "RequireApproval"
    reason = obj.get("reason", nullable=True)
    conditions = [c for c in ("toolMatches", "tagged", "argExceeds") if obj.get(c, nullable=True) is not None]
    if len(conditions) != 1:
        found = f"got {', '.join(conditions)}" if conditions else "got none"
        raise PolicyError(where, f"a rule has exactly one condition: toolMatches, tagged or argExceeds ({found})")
    kind = conditions[0]
    given = obj.get(kind, nullable=True)
    assert given is not None
    raw, here = given
    cond: tuple[str, Any]
    if kind == "toolMatches":
        globs = _list(raw, here, 1, MAX_GLOBS)
        cond = (kind, tuple(_string(g, f"{here}[{i}]", TOOL_GLOB, MAX_NAME, "a tool name or glob (letters, "
                                    "digits, _ . - : / and the wildcards * ?)") for i, g in enumerate(globs)))
    elif kind == "tagged":
        cond = (kind, _string(raw, here, TAG, MAX_TAG, "a tag ([A-Za-z0-9][A-Za-z0-9_.:/-]*)"))
    else:
        ex = _Object(raw, here, _ARG_EXCEEDS_FIELDS)
        arg, threshold = ex.get("arg"), ex.get("threshold")
        if arg is None or threshold is None:
            raise PolicyError(here, "needs both arg (a policy argument name) and threshold (a number)")
        t = threshold[0]
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise PolicyError(threshold[1], f"must be a finite number, got {t!r}")
        cond = (kind, (_string(arg[0], arg[1], ARG, MAX_ARG, "a policy argument name"), float(t)))
    return PolicyRule(rule_name, chosen, cond, _sentence(reason[0], reason[1]) if reason else None)


def parse_policy(doc: Any, *, where: str = "") -> SagaPolicy:
    """Validate ``doc`` (a SagaPolicy spec or policy file, as parsed JSON/YAML) and return
    the policy. Raises ``PolicyError`` naming the field (prefixed by ``where``) and the fix."""
    obj = _Object(doc, where, _POLICY_FIELDS)
    mode = obj.get("mode")
    undeclared = obj.get("undeclaredTools")
    applies = obj.get("appliesTo", nullable=True)
    applies_to: AppliesTo | None = None
    if applies is not None:
        sel = _Object(applies[0], applies[1], _APPLIES_FIELDS)
        agents = sel.get("agents")
        if agents is None:
            raise PolicyError(_join(applies[1], "agents"), "required: agent names or globs (omit appliesTo "
                              "to govern every agent of the namespace)")
        applies_to = AppliesTo(tuple(
            _string(a, f"{agents[1]}[{i}]", TOOL_GLOB, MAX_NAME, "an agent name or glob")
            for i, a in enumerate(_list(agents[0], agents[1], 1, MAX_AGENTS))))
    tools: dict[str, ToolDeclaration] = {}
    given = obj.get("tools")
    if given is not None:
        raw, here = given
        if not isinstance(raw, Mapping):
            raise PolicyError(here, f"must be an object of tool name -> declaration, got {_kind(raw)}")
        if len(raw) > MAX_TOOLS:
            raise PolicyError(here, f"at most {MAX_TOOLS} tools, got {len(raw)}")
        for name, decl in raw.items():
            at = _join(here, str(name))
            _string(name, at, TOOL_NAME, MAX_NAME, "an exact tool name (letters, digits and _ . - : /; no "
                    "wildcards, no spaces)")
            tools[name] = _tool(name, decl, at)
    rules: list[PolicyRule] = []
    given = obj.get("rules", nullable=True)
    if given is not None:
        seen: set[str] = set()
        for i, r in enumerate(_list(given[0], given[1], 0, MAX_RULES)):
            rule = _rule(r, f"{given[1]}[{i}]")
            if rule.name in seen:
                raise PolicyError(f"{given[1]}[{i}].name", f"a second rule named {rule.name!r}: names identify "
                                  f"rules in verdicts and approvals, so each needs its own")
            seen.add(rule.name)
            rules.append(rule)
    return SagaPolicy(
        mode="Observe" if mode and _choice(mode[0], mode[1], ("Enforce", "Observe")) == "Observe" else "Enforce",
        undeclared_tools=_undeclared(undeclared),
        applies_to=applies_to,
        tools=tools,
        rules=tuple(rules),
    )


def _undeclared(given: tuple[Any, str] | None) -> Undeclared:
    if given is None:
        return "Refuse"
    value = _choice(given[0], given[1], ("Refuse", "RequireApproval", "Allow"))
    return "Allow" if value == "Allow" else "RequireApproval" if value == "RequireApproval" else "Refuse"
