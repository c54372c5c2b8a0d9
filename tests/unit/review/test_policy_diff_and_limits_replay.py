"""`agent-saga policy diff` (what got stricter or looser) and `agent-saga limits replay`
(where a proposed cap would have bitten), each test named after a sentence of docs/gitops.md."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from agent_saga.cli import main
from agent_saga.controls.limits import BudgetLimit, RateLimit
from agent_saga.controls.limits._scopes import by_arg
from agent_saga.controls.policy import parse_policy
from agent_saga.gates import StepRequest
from agent_saga.review import diff_exit_code, diff_policies, load_limit_file, replay_limits
from agent_saga.review._calls import RecordedCall
from agent_saga.semantics import ActionSemantics

BASE: dict[str, Any] = {
    "undeclaredTools": "Refuse",
    "tools": {"charge": {"semantics": "COMPENSABLE", "compensate": {"handler": "refund", "args": {"id": "$.id"}},
                         "policyArgs": {"amount": "$.amount"}},
              "search": {"semantics": "REVERSIBLE"}},
    "rules": [{"name": "big", "argExceeds": {"arg": "amount", "threshold": 1000}}],
}


def changed(**edits: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(BASE))
    for path, value in edits.items():
        *parents, last = path.split("__")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[last] = value
    return doc


def diff(new: dict[str, Any], old: dict[str, Any] = BASE) -> list[Any]:
    return diff_policies(parse_policy(old), parse_policy(new))


def test_an_unchanged_policy_is_exit_0_and_a_reworded_reason_changes_nothing() -> None:
    assert diff(BASE) == []
    reworded = changed(rules__0__reason="amounts above $1k need a second pair of eyes")
    assert [c.direction for c in diff(reworded)] == ["reworded"] and diff_exit_code(diff(reworded)) == 0


@pytest.mark.parametrize(("edits", "aspect"), [
    ({"tools__search__semantics": "IRREVERSIBLE"}, "semantics"),
    ({"tools__search__requireApproval": True}, "requireApproval"),
    ({"rules__0__argExceeds__threshold": 500}, "argExceeds"),
    ({"rules__0__verdict": "Block"}, "verdict"),
])
def test_a_tightening_is_stricter_and_exit_1(edits: dict[str, Any], aspect: str) -> None:
    changes = diff(changed(**edits))
    assert [(c.aspect, c.direction) for c in changes] == [(aspect, "stricter")]
    assert diff_exit_code(changes) == 1


@pytest.mark.parametrize(("edits", "aspect"), [
    ({"undeclaredTools": "Allow"}, "undeclaredTools"),
    ({"rules__0__argExceeds__threshold": 5000}, "argExceeds"),
    ({"tools__charge__compensate": {"handler": "other", "args": {"id": "$.id"}}}, "compensate"),
    ({"tools__charge__policyArgs": {"amount": "$.total"}}, "policyArgs.amount"),
    ({"mode": "Observe"}, "mode"),
])
def test_a_loosening_or_a_change_that_cannot_be_ordered_is_looser_and_exit_3(edits: dict[str, Any],
                                                                              aspect: str) -> None:
    changes = diff(changed(**edits))
    assert [(c.aspect, c.direction) for c in changes] == [(aspect, "looser")]
    assert diff_exit_code(changes) == 3


def test_declaring_a_tool_the_old_policy_refused_is_looser() -> None:
    new = changed(tools__crm={"semantics": "REVERSIBLE"})
    (c,) = diff(new)
    assert (c.scope, c.aspect, c.direction) == ("tool:crm", "declared", "looser")
    (c,) = diff(new | {"undeclaredTools": "Allow"}, BASE | {"undeclaredTools": "Allow"})
    assert c.direction == "stricter"  # the code's declaration stood; now the policy's does too


def test_the_diff_command_exits_by_the_same_scheme_and_2_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new, bad = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "bad.json"
    old.write_text(json.dumps(BASE))
    new.write_text(json.dumps(changed(undeclaredTools="Allow", tools__search__requireApproval=True)))
    bad.write_text(json.dumps({"tools": {"x": {"semantics": "SOMETIMES"}}}))
    assert main(["policy", "diff", str(old), str(new), "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert (doc["stricter"], doc["looser"]) == (1, 1) and doc["by_tool"]["search"][0]["aspect"] == "requireApproval"
    assert main(["policy", "diff", str(old), str(old)]) == 0
    assert main(["policy", "diff", str(old), str(bad)]) == 2
    assert "tools.x.semantics" in capsys.readouterr().err


def call(ts_s: float, amount: Any, customer: str = "c1", tool: str = "charge") -> RecordedCall:
    req = StepRequest(f"s-{int(ts_s)}", "s/0", tool, ActionSemantics.COMPENSABLE,
                      MappingProxyType({"amount": amount, "customer_id": customer}), (), True)
    return RecordedCall(req, int(ts_s * 1e6))


def test_a_budget_refuses_on_the_sliding_window_the_store_keeps_and_a_refusal_debits_nothing() -> None:
    lim = BudgetLimit("daily", arg="amount", max_total=100, window=60)
    doc = replay_limits([call(0, 60), call(30, 50), call(31, 40), call(61, 50)], [lim])
    (d,) = doc["limits"]
    # 60 at t=0; 50 at t=30 does not fit (110) and is not debited; 40 at t=31 fits (100);
    # at t=61 the first 60 has left the window: 40 + 50 fits.
    assert (d["charged"], d["refused"], d["refused_amount"]) == (4, 1, 50)
    assert d["windows"][0]["key"] == "*" and d["windows"][0]["first"] == 30_000_000


def test_windows_are_per_scope_key_and_an_unreadable_amount_is_refused() -> None:
    lim = BudgetLimit("per-customer", arg="amount", max_total=100, window=3600, scope=by_arg("customer_id"))
    doc = replay_limits([call(0, 90, "a"), call(1, 90, "b"), call(2, 20, "a"), call(3, "ten", "b")], [lim])
    (d,) = doc["limits"]
    assert [(w["key"], w["refused"]) for w in d["windows"]] == [("customer_id=a", 1)]
    assert d["unreadable"] == 1 and doc["refused"] == 2


def test_an_escalating_budget_asks_a_human_and_the_approved_call_is_debited() -> None:
    lim = BudgetLimit("wires", arg="amount", max_total=100, window=3600, escalate_to_human=True)
    rate = RateLimit("velocity", max_calls=2, window=10)
    doc = replay_limits([call(0, 90), call(1, 20), call(2, 1), call(20, 1)], [lim, rate])
    wires, velocity = doc["limits"]
    assert (wires["escalated"], wires["refused"]) == (3, 0)  # 90+20 over; then 110+1, 111+1 over
    assert velocity["refused"] == 1  # a third call within 10 seconds


def test_a_budgetlimit_manifest_is_read_as_the_operator_names_it(tmp_path: Path) -> None:
    limits = load_limit_file(Path(__file__).parents[3] / "examples" / "k8s" / "budget.yaml")
    assert [lim.name for lim in limits] == ["agent-saga.daily-spend", "agent-saga.per-customer",
                                            "agent-saga.velocity", "agent-saga.wire-ceiling"]
    assert limits[0].window == 86_400 and limits[3].escalate_to_human
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: BudgetLimit\nmetadata: {name: x}\nspec: {kind: Budget, arg: amount, window: 1d}\n")
    with pytest.raises(Exception, match="spec.maxTotal"):
        load_limit_file(bad)
