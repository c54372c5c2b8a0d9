"""The SagaPolicy schema and its JSONPath subset, each test named after a sentence of the spec.

One schema for the custom resource's spec and the MCP proxy's policy file; bad input is
refused with an error naming the field and the fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from agent_saga.controls.policy import (
    JSON_PATH_PATTERN,
    JsonPathError,
    JsonPathMissing,
    PolicyError,
    compile_path,
    load_policy_file,
    load_policy_text,
    parse_policy,
)
from agent_saga.semantics import ActionSemantics

#: The brief's policy file, verbatim.
BRIEF_FILE = """{
  "mode": "enforce",
  "tools": {
    "stripe__create_charge": {
      "semantics": "COMPENSABLE",
      "compensate": {"tool": "stripe__create_refund", "args": {"charge": "$.id"}},
      "policy_args": {"amount": "$.amount"}
    },
    "search_docs": {"semantics": "REVERSIBLE"}
  }
}"""

MANIFEST = """apiVersion: agentsaga.dev/v1alpha1
kind: SagaPolicy
metadata: {name: payments}
spec:
  mode: Enforce
  undeclaredTools: Refuse
  appliesTo: {agents: ["payments-*"]}
  tools:
    stripe__create_charge:
      semantics: COMPENSABLE
      compensate: {tool: stripe__create_refund, args: {charge: $.id}}
      policyArgs: {amount: $.amount}
    search_docs: {semantics: REVERSIBLE}
  rules:
    - {name: large-charges, argExceeds: {arg: amount, threshold: 10000}, verdict: RequireApproval}
"""


def refused(doc: object) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(doc)
    return info.value


# ---------------------------------------------------------------- one schema
def test_the_briefs_policy_file_is_read_exactly_as_it_shows_it() -> None:
    p = load_policy_text(BRIEF_FILE)
    assert p.mode == "Enforce" and p.undeclared_tools == "Refuse"
    charge = p.tools["stripe__create_charge"]
    assert charge.semantics is ActionSemantics.COMPENSABLE
    assert charge.compensate is not None and charge.compensate.tool == "stripe__create_refund"
    assert charge.compensate.kwargs_for({}, {"id": "ch_1", "amount": 5}) == {"charge": "ch_1"}
    assert {k: v.text for k, v in charge.policy_args.items()} == {"amount": "$.amount"}
    assert p.tools["search_docs"].semantics is ActionSemantics.REVERSIBLE


def test_the_sagapolicy_manifest_and_the_policy_file_are_one_schema() -> None:
    from_manifest = load_policy_text(MANIFEST, source="policy.yaml")
    from_file = load_policy_text(BRIEF_FILE)
    assert from_manifest.tools == from_file.tools
    assert from_manifest.applies("payments-1") and not from_manifest.applies("billing-1")
    assert from_manifest.rules[0].condition == ("argExceeds", ("amount", 10000.0))


def test_the_canonical_document_parses_back_to_the_same_policy() -> None:
    p = load_policy_text(MANIFEST)
    doc = p.to_doc()
    assert parse_policy(json.loads(json.dumps(doc))) == p
    assert doc["tools"]["stripe__create_charge"]["policyArgs"] == {"amount": "$.amount"}
    assert list(doc["tools"]) == sorted(doc["tools"])


def test_choice_values_are_matched_ignoring_case_and_underscores() -> None:
    p = parse_policy({"mode": "OBSERVE", "undeclared_tools": "require_approval",
                      "rules": [{"name": "r", "tagged": "eu", "verdict": "BLOCK"}]})
    assert (p.mode, p.undeclared_tools, p.rules[0].verdict) == ("Observe", "RequireApproval", "Block")
    assert parse_policy({"undeclaredTools": "allow"}).undeclared_tools == "Allow"


def test_undeclared_tools_are_refused_by_default() -> None:
    assert parse_policy({}).undeclared_tools == "Refuse"
    assert parse_policy({}).mode == "Enforce"


def test_a_file_with_a_manifest_of_another_kind_is_refused_naming_the_kind(tmp_path) -> None:
    f = tmp_path / "ks.yaml"
    f.write_text("apiVersion: agentsaga.dev/v1alpha1\nkind: KillSwitch\nspec: {}\n")
    with pytest.raises(PolicyError, match="'KillSwitch' manifest"):
        load_policy_file(f)


def test_errors_in_a_manifest_name_the_spec_field_and_the_file(tmp_path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(MANIFEST.replace("semantics: COMPENSABLE", "semantics: UNDOABLE"))
    with pytest.raises(PolicyError) as info:
        load_policy_file(f)
    assert info.value.field == "spec.tools.stripe__create_charge.semantics"
    assert str(f) in str(info.value) and "REVERSIBLE, COMPENSABLE, IRREVERSIBLE" in str(info.value)


def test_an_unreadable_policy_file_names_the_file(tmp_path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file .*missing.json"):
        load_policy_file(tmp_path / "missing.json")


# ---------------------------------------------------------------- refused, naming the field
def test_an_unknown_field_is_refused_with_the_closest_known_name() -> None:
    e = refused({"tools": {"x": {"semantics": "REVERSIBLE", "policy_arg": {}}}})
    assert e.field == "tools.x.policy_arg"
    assert "did you mean 'policy_args'" in str(e)


def test_both_spellings_of_one_field_are_refused() -> None:
    e = refused({"undeclaredTools": "Refuse", "undeclared_tools": "Refuse"})
    assert e.field == "undeclaredTools" and "same field" in str(e)


def test_a_compensable_tool_must_declare_its_inverse() -> None:
    e = refused({"tools": {"charge": {"semantics": "COMPENSABLE"}}})
    assert e.field == "tools.charge.compensate" and "classify it IRREVERSIBLE" in str(e)


def test_an_irreversible_tool_has_no_automated_undo() -> None:
    e = refused({"tools": {"sms": {"semantics": "IRREVERSIBLE", "compensate": {"tool": "unsend"}}}})
    assert e.field == "tools.sms.compensate" and "no automated undo" in str(e)


def test_an_inverse_is_a_tool_or_a_handler_never_both_or_neither() -> None:
    for comp in ({"args": {}}, {"tool": "refund", "handler": "stripe.refund"}):
        e = refused({"tools": {"charge": {"semantics": "COMPENSABLE", "compensate": comp}}})
        assert e.field == "tools.charge.compensate" and "exactly one inverse" in str(e)
    p = parse_policy({"tools": {"charge": {"semantics": "COMPENSABLE",
                                           "compensate": {"handler": "stripe.refund", "args": {"c": "$.id"}}}}})
    assert p.tools["charge"].compensate is not None and p.tools["charge"].compensate.target == "stripe.refund"


def _inverse(**comp: object) -> dict[str, object]:
    return {"tools": {"git_add": {"semantics": "COMPENSABLE", "compensate": {"tool": "git_reset", **comp}}}}


def test_an_inverse_takes_arguments_from_the_call_constants_and_the_result() -> None:
    p = parse_policy(_inverse(callArgs={"repo_path": "$.repo_path"}, values={"mode": "mixed", "paths": ["."]},
                              args={"ref": "$.head"}))
    comp = p.tools["git_add"].compensate
    assert comp is not None and parse_policy(p.to_doc()) == p
    assert comp.kwargs_for({"repo_path": "/srv/repo", "files": ["a"]}, {"head": "abc"}) == {
        "repo_path": "/srv/repo", "mode": "mixed", "paths": ["."], "ref": "abc"}
    assert comp.kwargs_for({"repo_path": "/r"}, {"head": "x"})["paths"] is not comp.values["paths"]  # a fresh copy
    assert parse_policy(_inverse(call_args={"r": "$.r"})).tools["git_add"].compensate.call_args["r"].text == "$.r"


def test_an_inverse_argument_comes_from_one_place_only() -> None:
    e = refused(_inverse(callArgs={"repo_path": "$.repo_path"}, args={"repo_path": "$.path"}))
    assert e.field == "tools.git_add.compensate.callArgs.repo_path"
    assert "'repo_path' is also in args" in str(e) and "keep it in one of them" in str(e)
    e = refused(_inverse(callArgs={"repo_path": "$.repo_path"}, values={"repo_path": "/srv"}))
    assert e.field == "tools.git_add.compensate.values.repo_path" and "also in callArgs" in str(e)


def test_a_constant_is_json_bounded_and_never_a_secret() -> None:
    e = refused(_inverse(values={"token": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"}))
    assert e.field == "tools.git_add.compensate.values.token" and "looks like a secret" in str(e)
    assert "a policy names constants, never secrets" in str(e)
    e = refused(_inverse(values={"at": float("inf")}))
    assert e.field == "tools.git_add.compensate.values.at" and "not JSON" in str(e)
    e = refused(_inverse(values={"note": "x" * 1100}))
    assert "at most 1024 characters as JSON" in str(e)
    assert "must be an object of name -> constant" in str(refused(_inverse(values=["force"])))


def test_tool_names_are_exact_names_without_wildcards_or_spaces() -> None:
    for name in ("stripe.*", "two words", ""):
        e = refused({"tools": {name: {"semantics": "REVERSIBLE"}}})
        assert e.field == f"tools.{name}"


def test_a_tool_without_semantics_is_refused_suggesting_irreversible() -> None:
    e = refused({"tools": {"x": {}}})
    assert e.field == "tools.x.semantics" and "when in doubt, IRREVERSIBLE" in str(e)


def test_a_rule_has_exactly_one_condition() -> None:
    assert "got none" in str(refused({"rules": [{"name": "r"}]}))
    e = refused({"rules": [{"name": "r", "tagged": "eu", "toolMatches": ["x"]}]})
    assert e.field == "rules[0]" and "toolMatches, tagged" in str(e)


def test_two_rules_of_one_name_are_refused() -> None:
    e = refused({"rules": [{"name": "r", "tagged": "eu"}, {"name": "r", "tagged": "us"}]})
    assert e.field == "rules[1].name"


def test_a_threshold_is_a_finite_number_not_a_string_or_a_boolean() -> None:
    for t in ("10000", True, float("inf")):
        e = refused({"rules": [{"name": "r", "argExceeds": {"arg": "amount", "threshold": t}}]})
        assert e.field == "rules[0].argExceeds.threshold"


def test_require_approval_is_true_or_false() -> None:
    e = refused({"tools": {"x": {"semantics": "REVERSIBLE", "requireApproval": "yes"}}})
    assert e.field == "tools.x.requireApproval"


def test_a_blank_reason_is_refused() -> None:
    e = refused({"rules": [{"name": "r", "tagged": "eu", "reason": "   "}]})
    assert e.field == "rules[0].reason" and "blank" in str(e)


def test_applies_to_needs_at_least_one_agent() -> None:
    e = refused({"appliesTo": {"agents": []}})
    assert e.field == "appliesTo.agents"


def test_sizes_the_resource_bounds_are_bounded_here_too() -> None:
    e = refused({"tools": {f"t{i}": {"semantics": "REVERSIBLE"} for i in range(513)}})
    assert e.field == "tools" and "512" in str(e)
    e = refused({"rules": [{"name": f"r{i}", "tagged": "x"} for i in range(65)]})
    assert e.field == "rules"


def test_a_policy_that_is_not_an_object_is_refused() -> None:
    assert "must be an object" in str(refused(["mode"]))


# ---------------------------------------------------------------- JSONPath subset
def test_a_path_reads_fields_and_list_elements() -> None:
    doc = {"id": "ch_1", "charge": {"id": "ch_2"}, "items": [{"id": "a"}, {"id": "b"}]}
    assert compile_path("$.id").read(doc) == "ch_1"
    assert compile_path("$.charge.id").read(doc) == "ch_2"
    assert compile_path("$.items[1].id").read(doc) == "b"
    assert compile_path("$").read(doc) is doc


@pytest.mark.parametrize("path", ["id", "$.", "$..id", "$.a[*]", "$['id']", "$.a[-1]", "$.a b", "$.1a"])
def test_a_path_outside_the_subset_is_refused_with_an_example(path: str) -> None:
    with pytest.raises(JsonPathError) as info:
        compile_path(path, field="args.charge")
    assert str(info.value).startswith("args.charge: ")
    assert "$.charge.id" in str(info.value)


@pytest.mark.parametrize("path", ["$", "$.id", "$.a_b-c.d", "$[0]", "$.a[10][2].b", "id", "$..x", "$.a[x]",
                                  "$.", "$[]", "$.a.", "$ .a", "$.é"])
def test_the_parser_and_the_resources_pattern_accept_the_same_paths(path: str) -> None:
    try:
        compile_path(path)
        parsed = True
    except JsonPathError:
        parsed = False
    assert parsed == bool(re.fullmatch(JSON_PATH_PATTERN, path))


def test_a_path_never_guesses_a_missing_value() -> None:
    with pytest.raises(JsonPathMissing, match=r"\$ has no field 'id' \(fields: amount\)"):
        compile_path("$.id").read({"amount": 1})
    with pytest.raises(JsonPathMissing, match=r"1 element\(s\); \[3\] is past the end"):
        compile_path("$.items[3]").read({"items": [1]})
    with pytest.raises(JsonPathMissing, match="is a string, not an object"):
        compile_path("$.id.x").read({"id": "ch_1"})


# ---------------------------------------------------------------- agent-saga policy check
def test_policy_check_says_what_a_valid_file_declares(tmp_path, capsys) -> None:
    from agent_saga.cli import main

    f = tmp_path / "saga-policy.json"
    f.write_text(BRIEF_FILE)
    assert main(["policy", "check", str(f)]) == 0
    out = capsys.readouterr().out
    assert "valid. mode Enforce, undeclared tools Refuse, 1 COMPENSABLE, 1 REVERSIBLE, 0 rule(s)" in out
    assert "  stripe__create_charge: undone by tool stripe__create_refund(charge <- result $.id)" in out


def test_policy_check_says_where_each_inverse_argument_comes_from(capsys) -> None:
    from agent_saga.cli import main

    example = Path(__file__).resolve().parents[2] / "examples" / "policies" / "mcp-server-filesystem.yaml"
    assert main(["policy", "check", str(example)]) == 0
    assert "  move_file: undone by tool move_file(destination <- call $.source, source <- call $.destination)" in \
        capsys.readouterr().out


def test_policy_check_names_the_field_of_an_invalid_file(tmp_path, capsys) -> None:
    from agent_saga.cli import main

    f = tmp_path / "policy.yaml"
    f.write_text(MANIFEST.replace("compensate: {tool: stripe__create_refund, args: {charge: $.id}}", "x: 1"))
    assert main(["policy", "check", str(f)]) == 1
    err = capsys.readouterr().err
    assert "INVALID" in err and "spec.tools.stripe__create_charge.x: " in err
