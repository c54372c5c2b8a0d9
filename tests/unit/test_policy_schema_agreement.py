"""One schema: the runtime's policy parser and the operator's SagaPolicy CRD model accept
and refuse the same documents.

The runtime (``agent_saga.controls.policy.parse_policy``) is where the schema is defined;
the operator's pydantic model generates the CRD. A document one accepts and the other
refuses would be a policy the API server admits and no agent can enforce (or the reverse),
so agreement is checked on hand-picked edge cases and on generated documents.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from agent_saga.controls.policy import PolicyError, parse_policy
from agent_saga.controls.policy._model import TOOL_GLOB, TOOL_NAME
from agent_saga_operator.models import SagaPolicySpec
from agent_saga_operator.models._base import TOOL_GLOB_PATTERN, TOOL_NAME_PATTERN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

VALID: dict[str, Any] = {
    "mode": "Enforce",
    "undeclaredTools": "Refuse",
    "appliesTo": {"agents": ["payments-*"]},
    "tools": {
        "stripe__create_charge": {
            "semantics": "COMPENSABLE",
            "compensate": {"tool": "stripe__create_refund", "args": {"charge": "$.id"}},
            "policyArgs": {"amount": "$.amount"},
        },
        "git_add": {
            "semantics": "COMPENSABLE",
            "compensate": {"tool": "git_reset", "callArgs": {"repo_path": "$.repo_path"}, "values": {"hard": False}},
        },
        "search_docs": {"semantics": "REVERSIBLE"},
        "wire.send": {"semantics": "IRREVERSIBLE", "requireApproval": True},
    },
    "rules": [
        {"name": "large-charges", "argExceeds": {"arg": "amount", "threshold": 10000}, "verdict": "RequireApproval",
         "reason": "charges above $10k need a second pair of eyes"},
        {"name": "eu-paused", "tagged": "eu", "verdict": "Block"},
        {"name": "no-wires", "toolMatches": ["wire.*"]},
    ],
}


def runtime_accepts(doc: Any) -> bool:
    try:
        parse_policy(doc)
    except PolicyError:
        return False
    return True


def model_accepts(doc: Any) -> bool:
    try:
        SagaPolicySpec.model_validate(doc)
    except ValidationError:
        return False
    return True


def with_(path: tuple[Any, ...], value: Any, base: dict[str, Any] = VALID) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    cur: Any = doc
    for key in path[:-1]:
        cur = cur[key]
    if value is DELETE:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return doc


DELETE = object()
T = ("tools", "stripe__create_charge")
R0 = ("rules", 0)
G = ("tools", "git_add", "compensate")

CASES: list[tuple[str, Any]] = [
    ("valid", VALID),
    ("empty", {}),
    ("the brief's file", {"mode": "enforce", "tools": {"c": {"semantics": "COMPENSABLE", "compensate": {
        "tool": "r", "args": {"charge": "$.id"}}, "policy_args": {"amount": "$.amount"}}}}),
    ("not an object", ["mode"]),
    ("null", None),
    ("unknown top-level field", with_(("tool",), {})),
    ("unknown tool field", with_((*T, "inverse"), {})),
    ("both spellings", with_(("undeclared_tools",), "Refuse")),
    ("snake-case policy args", with_((*T, "policy_args"), {"amount": "$.amount"},
                                     with_((*T, "policyArgs"), DELETE))),
    ("lower-case mode", with_(("mode",), "observe")),
    ("unknown mode", with_(("mode",), "Audit")),
    ("mode null", with_(("mode",), None)),
    ("undeclared allow", with_(("undeclaredTools",), "Allow")),
    ("undeclared require_approval", with_(("undeclaredTools",), "require_approval")),
    ("undeclared forward", with_(("undeclaredTools",), "Forward")),
    ("appliesTo null", with_(("appliesTo",), None)),
    ("appliesTo no agents", with_(("appliesTo",), {"agents": []})),
    ("appliesTo missing agents", with_(("appliesTo",), {})),
    ("agent glob with space", with_(("appliesTo",), {"agents": ["a b"]})),
    ("tools null", with_(("tools",), None)),
    ("tools a list", with_(("tools",), [])),
    ("glob tool name", with_(("tools", "stripe.*"), {"semantics": "REVERSIBLE"})),
    ("tool name with space", with_(("tools", "a b"), {"semantics": "REVERSIBLE"})),
    ("tool name too long", with_(("tools", "t" * 254), {"semantics": "REVERSIBLE"})),
    ("tool name at the limit", with_(("tools", "t" * 253), {"semantics": "REVERSIBLE"})),
    ("lower-case semantics", with_((*T, "semantics"), "compensable")),
    ("unknown semantics", with_((*T, "semantics"), "UNDOABLE")),
    ("no semantics", with_((*T, "semantics"), DELETE)),
    ("compensable without inverse", with_((*T, "compensate"), DELETE)),
    ("compensable inverse null", with_((*T, "compensate"), None)),
    ("irreversible with inverse", with_(("tools", "wire.send", "compensate"), {"tool": "unsend"})),
    ("reversible with inverse", with_(("tools", "search_docs", "compensate"), {"handler": "docs.forget"})),
    ("inverse handler", with_((*T, "compensate"), {"handler": "stripe.refund", "args": {"c": "$.id"}})),
    ("inverse handler and tool", with_((*T, "compensate"), {"handler": "stripe.refund", "tool": "r"})),
    ("inverse neither", with_((*T, "compensate"), {"args": {}})),
    ("inverse tool and a null handler", with_((*T, "compensate", "handler"), None)),
    ("inverse handler and a null tool", with_((*T, "compensate"), {"handler": "stripe.refund", "tool": None})),
    ("inverse bad handler", with_((*T, "compensate"), {"handler": "-refund"})),
    ("inverse args null", with_((*T, "compensate", "args"), None)),
    ("bad path", with_((*T, "compensate", "args", "charge"), "$..id")),
    ("path with index", with_((*T, "compensate", "args", "charge"), "$.items[0].id")),
    ("path not a string", with_((*T, "compensate", "args", "charge"), 3)),
    ("path too long", with_((*T, "compensate", "args", "charge"), "$" + ".a" * 128)),
    ("path of 129 characters", with_((*T, "compensate", "args", "charge"), "$" + ".a" * 64)),
    ("33 args", with_((*T, "policyArgs"), {f"a{i}": "$.x" for i in range(33)})),
    ("call args snake case", with_((*G, "call_args"), {"repo_path": "$.repo_path"}, with_((*G, "callArgs"), DELETE))),
    ("call args both spellings", with_((*G, "call_args"), {"r": "$.r"})),
    ("call args null", with_((*G, "callArgs"), None)),
    ("call args a list", with_((*G, "callArgs"), ["$.repo_path"])),
    ("call args bad path", with_((*G, "callArgs", "repo_path"), "repo_path")),
    ("call args with index", with_((*G, "callArgs", "first"), "$.files[0]")),
    ("33 call args", with_((*G, "callArgs"), {f"a{i}": "$.x" for i in range(33)})),
    ("call args only", with_((*G, "values"), DELETE)),
    ("call args and args share a name", with_((*G, "args"), {"repo_path": "$.path"})),
    ("call args and values share a name", with_((*G, "values", "repo_path"), "/srv/repo")),
    ("args and values share a name", with_((*T, "compensate", "values"), {"charge": "ch_1"})),
    ("values of every JSON type", with_((*G, "values"), {"s": "x", "n": 1.5, "b": True, "l": [1, "a", None],
                                                          "o": {"k": [None]}})),
    ("value null", with_((*G, "values", "z"), None)),
    ("value with a null member", with_((*G, "values", "o"), {"k": None})),
    ("values null", with_((*G, "values"), None)),
    ("values a string", with_((*G, "values"), "force")),
    ("33 values", with_((*G, "values"), {f"v{i}": i for i in range(33)})),
    ("value too long", with_((*G, "values", "note"), "x" * 1100)),
    ("value a secret", with_((*G, "values", "token"), "sk_live_" + "a" * 30)),
    ("inverse with only values", with_(G, {"tool": "git_reset", "values": {"repo_path": "/srv/repo"}})),
    ("handler with call args", with_(G, {"handler": "git.reset", "callArgs": {"repo": "$.repo_path"}})),
    ("policy args null", with_((*T, "policyArgs"), None)),
    ("require approval a string", with_(("tools", "wire.send", "requireApproval"), "yes")),
    ("require approval null", with_(("tools", "wire.send", "requireApproval"), None)),
    ("rules null", with_(("rules",), None)),
    ("rules empty", with_(("rules",), [])),
    ("rule without a name", with_((*R0, "name"), DELETE)),
    ("rule name bad", with_((*R0, "name"), "-x")),
    ("rule without a condition", with_(R0, {"name": "x"})),
    ("rule with two conditions", with_((*R0, "tagged"), "eu")),
    ("rule condition null", with_((*R0, "argExceeds"), None)),
    ("duplicate rule names", with_(("rules", 1, "name"), "large-charges")),
    ("verdict upper case", with_((*R0, "verdict"), "REQUIRE_APPROVAL")),
    ("verdict allow", with_((*R0, "verdict"), "Allow")),
    ("verdict null", with_((*R0, "verdict"), None)),
    ("threshold a string", with_((*R0, "argExceeds", "threshold"), "10000")),
    ("threshold a boolean", with_((*R0, "argExceeds", "threshold"), True)),
    ("threshold a float", with_((*R0, "argExceeds", "threshold"), 0.5)),
    ("threshold missing", with_((*R0, "argExceeds"), {"arg": "amount"})),
    ("arg bad", with_((*R0, "argExceeds", "arg"), "1x")),
    ("reason blank", with_((*R0, "reason"), "  ")),
    ("reason empty", with_((*R0, "reason"), "")),
    ("reason null", with_((*R0, "reason"), None)),
    ("reason too long", with_((*R0, "reason"), "x" * 1025)),
    ("tool matches empty", with_(("rules", 2, "toolMatches"), [])),
    ("tool matches bracket", with_(("rules", 2, "toolMatches"), ["wire[0]"])),
    ("tag bad", with_(("rules", 1, "tagged"), "-eu")),
    ("65 rules", with_(("rules",), [{"name": f"r{i}", "tagged": "x"} for i in range(65)])),
    ("513 tools", with_(("tools",), {f"t{i}": {"semantics": "REVERSIBLE"} for i in range(513)})),
]


@pytest.mark.parametrize(("label", "doc"), CASES, ids=[c[0] for c in CASES])
def test_the_crd_model_and_the_runtime_accept_and_refuse_the_same_documents(label: str, doc: Any) -> None:
    assert model_accepts(doc) == runtime_accepts(doc), label


def test_the_corpus_holds_both_accepted_and_refused_documents() -> None:
    verdicts = [runtime_accepts(doc) for _, doc in CASES]
    assert sum(verdicts) >= 15 and len(verdicts) - sum(verdicts) >= 40


def test_the_name_patterns_are_the_same_strings() -> None:
    assert TOOL_NAME.pattern == TOOL_NAME_PATTERN and TOOL_GLOB.pattern == TOOL_GLOB_PATTERN


# ---------------------------------------------------------------- generated documents
NAMES = st.sampled_from(["mode", "undeclaredTools", "undeclared_tools", "appliesTo", "tools", "rules", "semantics",
                         "compensate", "tool", "handler", "args", "callArgs", "call_args", "values", "policyArgs",
                         "policy_args", "requireApproval",
                         "name", "verdict", "reason", "toolMatches", "tagged", "argExceeds", "arg", "threshold",
                         "agents", "extra"])
SCALARS = st.one_of(
    st.sampled_from(["Enforce", "observe", "Refuse", "Allow", "RequireApproval", "REQUIRE_APPROVAL", "Block",
                     "REVERSIBLE", "compensable", "IRREVERSIBLE", "$.id", "$.a[0]", "$..x", "$.repo_path", "x",
                     "wire.*", "eu",
                     "", " ", "stripe.refund", "a b"]),
    st.integers(-3, 20000), st.floats(allow_nan=False, allow_infinity=False, width=32), st.booleans(), st.none())


def _values(depth: int) -> st.SearchStrategy[Any]:
    if depth == 0:
        return SCALARS
    inner = _values(depth - 1)
    return st.one_of(SCALARS, st.lists(inner, max_size=3), st.dictionaries(NAMES, inner, max_size=4))


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``node`` (the root included)."""
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    """The valid document with one to three fields replaced, added or removed."""
    doc: Any = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        value = draw(_values(2))
        if not path:
            if isinstance(doc, dict):
                doc[draw(NAMES)] = value
            continue
        parent: Any = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(NAMES)] = value
        else:
            parent[path[-1]] = value
    return doc


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_generated_documents_get_the_same_answer_from_both(doc: Any) -> None:
    assert model_accepts(doc) == runtime_accepts(doc), doc
