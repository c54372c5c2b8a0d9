"""How the SagaPolicies in force change a step: each test named after a sentence of the spec.

A reviewed policy can only tighten what code declares (IRREVERSIBLE beats COMPENSABLE; a
Block beats an Allow), never loosen it.
"""

from __future__ import annotations

import pytest
from agent_saga.compensation import compensator, unregister_compensator
from agent_saga.controls import ApprovalOutcome, PreFlightGate
from agent_saga.controls.policy import PolicyInForce, PolicySet, StaticPolicySource, parse_policy
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from fixtures.steps import req as step_request

R = ActionSemantics.REVERSIBLE
C = ActionSemantics.COMPENSABLE
I = ActionSemantics.IRREVERSIBLE  # noqa: E741


def req(tool: str = "stripe__create_charge", sem: ActionSemantics = C, tags: tuple[str, ...] = (),
        **args: object) -> StepRequest:
    return step_request(tool, sem, tags, **args)


def pset(*docs: dict, agent: str = "payments-1") -> PolicySet:
    return PolicySet([PolicyInForce(f"payments/p{i}", parse_policy(d), uid=f"u{i}", generation=1)
                      for i, d in enumerate(docs)], agent=agent)


CHARGE = {"semantics": "COMPENSABLE", "compensate": {"handler": "test.refund", "args": {"charge": "$.id"}},
          "policyArgs": {"amount": "$.amount"}}


class Approver:
    def __init__(self) -> None:
        self.asked: list[tuple[StepRequest, object]] = []

    async def request_approval(self, request, verdict):
        self.asked.append((request, verdict))
        return ApprovalOutcome(False, "risk@corp", "no")


# ---------------------------------------------------------------- undeclared tools
def test_an_undeclared_tool_is_refused() -> None:
    a = pset({"tools": {"search_docs": {"semantics": "REVERSIBLE"}}}).admit(req(), has_compensation=True)
    assert a.verdict == "BLOCK" and a.decided_by == "policy:payments/p0"
    assert "stripe__create_charge is not declared in SagaPolicy payments/p0" in a.reason
    assert "spec.tools" in a.reason


def test_undeclared_tools_require_approval_sends_them_to_a_human() -> None:
    a = pset({"undeclaredTools": "RequireApproval"}).admit(req(), has_compensation=True)
    assert a.verdict == "REQUIRE_APPROVAL"
    assert a.asks == (("payments/p0:undeclared", "stripe__create_charge is not declared in SagaPolicy "
                                                  "payments/p0: a human decides"),)


def test_undeclared_tools_allow_leaves_the_codes_declaration_in_force() -> None:
    r = req(sem=R, amount=5)
    a = pset({"undeclaredTools": "Allow"}).admit(r, has_compensation=False)
    assert a.verdict == "ALLOW" and a.request is r


# ---------------------------------------------------------------- precedence: tighten, never loosen
def test_irreversible_beats_compensable() -> None:
    a = pset({"tools": {"stripe__create_charge": {"semantics": "IRREVERSIBLE"}}}).admit(req(sem=C),
                                                                                        has_compensation=True)
    assert a.verdict == "ALLOW" and a.request.semantics is I
    assert a.detail["semantics"] == {"code": "COMPENSABLE", "enforced": "IRREVERSIBLE"}


def test_a_policy_never_loosens_what_code_declares() -> None:
    compensator("test.refund")(lambda charge: None)
    try:
        a = pset({"tools": {"stripe__create_charge": CHARGE}}).admit(req(sem=I, amount=1), has_compensation=False)
    finally:
        unregister_compensator("test.refund")
    assert a.request.semantics is I and a.compensate is None


def test_the_strictest_declaration_of_every_policy_wins() -> None:
    a = pset({"tools": {"t": {"semantics": "REVERSIBLE"}}}, {"tools": {"t": {"semantics": "IRREVERSIBLE"}}}
             ).admit(req("t", sem=R), has_compensation=False)
    assert a.request.semantics is I


def test_a_block_beats_an_allow() -> None:
    # p0 declares the tool; p1 does not and refuses undeclared tools: the call is refused.
    a = pset({"tools": {"stripe__create_charge": {"semantics": "IRREVERSIBLE"}}},
             {"tools": {"search_docs": {"semantics": "REVERSIBLE"}}}).admit(req(), has_compensation=True)
    assert a.verdict == "BLOCK" and a.decided_by == "policy:payments/p1"


def source(*docs: dict, agent: str = "payments-1") -> StaticPolicySource:
    return StaticPolicySource([PolicyInForce(f"payments/p{i}", parse_policy(d), uid=f"u{i}", generation=1)
                               for i, d in enumerate(docs)], agent=agent)


async def test_a_policy_rule_blocks_even_when_code_rules_allow() -> None:
    gate = PreFlightGate(default_rules=(), policy=source(
        {"undeclaredTools": "Allow", "rules": [{"name": "no-eu", "tagged": "eu", "verdict": "Block",
                                                "reason": "EU paused"}]}))
    d = await gate.decide(req(sem=R, tags=("eu",)))
    assert d.verdict == "BLOCK" and d.decided_by == "rule:payments/p0:no-eu"
    assert d.reason == "EU paused"


# ---------------------------------------------------------------- rules ask a human
async def test_a_rule_asks_a_human_with_its_reason() -> None:
    approver = Approver()
    gate = PreFlightGate(default_rules=(), approval_provider=approver, policy=source(
        {"undeclaredTools": "Allow",
         "rules": [{"name": "large-charges", "argExceeds": {"arg": "amount", "threshold": 10000},
                    "reason": "large charges need a second pair of eyes"}]}))
    small = await gate.decide(req(amount=500))
    assert small.verdict == "ALLOW"
    big = await gate.decide(req(amount=12000))
    assert len(approver.asked) == 1 and big.decided_by == "rule:payments/p0:large-charges"
    assert "large charges need a second pair of eyes (amount 12000 exceeds 10000)" in big.reason


def test_require_approval_on_a_tool_asks_a_human_for_every_call() -> None:
    a = pset({"tools": {"t": {"semantics": "REVERSIBLE", "requireApproval": True}}}).admit(
        req("t", sem=R), has_compensation=False)
    assert a.verdict == "REQUIRE_APPROVAL" and a.asks[0][0] == "payments/p0:t"


# ---------------------------------------------------------------- policy arguments
def test_policy_arguments_are_taken_by_path_from_the_call() -> None:
    ps = pset({"tools": {"t": {"semantics": "REVERSIBLE", "policyArgs": {"amount": "$.payment.total"}}}})
    a = ps.admit(req("t", sem=R, payment={"total": 4200}), has_compensation=False)
    assert a.verdict == "ALLOW" and a.request.policy_args["amount"] == 4200
    assert a.request.policy_args["payment"] == {"total": 4200}


def test_a_derived_policy_argument_replaces_the_codes_value_of_that_name() -> None:
    ps = pset({"tools": {"t": {"semantics": "REVERSIBLE", "policyArgs": {"amount": "$.cents"}}}})
    a = ps.admit(req("t", sem=R, amount=1, cents=420000), has_compensation=False)
    assert a.request.policy_args["amount"] == 420000


def test_a_policy_argument_the_call_does_not_have_refuses_the_call() -> None:
    ps = pset({"tools": {"t": {"semantics": "REVERSIBLE", "policyArgs": {"amount": "$.amount"}}}})
    a = ps.admit(req("t", sem=R, total=5), has_compensation=False)
    assert a.verdict == "BLOCK"
    assert "takes policy argument 'amount' of t from $.amount" in a.reason and "fail closed" in a.reason


def test_two_policies_deriving_different_values_refuse_the_call() -> None:
    ps = pset({"tools": {"t": {"semantics": "REVERSIBLE", "policyArgs": {"amount": "$.a"}}}},
              {"tools": {"t": {"semantics": "REVERSIBLE", "policyArgs": {"amount": "$.b"}}}})
    assert ps.admit(req("t", sem=R, a=1, b=2), has_compensation=False).verdict == "BLOCK"
    assert ps.admit(req("t", sem=R, a=1, b=1), has_compensation=False).verdict == "ALLOW"


# ---------------------------------------------------------------- compensation
def test_the_policys_inverse_is_used_when_the_code_has_none() -> None:
    compensator("test.refund")(lambda charge: None)
    try:
        a = pset({"tools": {"stripe__create_charge": CHARGE}}).admit(req(sem=R, amount=7), has_compensation=False)
    finally:
        unregister_compensator("test.refund")
    assert a.verdict == "ALLOW" and a.request.semantics is C
    assert a.compensate is not None
    assert a.compensate.kwargs_for({}, {"id": "ch_9", "amount": 7}) == {"charge": "ch_9"}


def test_the_codes_inverse_wins_over_the_policys() -> None:
    a = pset({"tools": {"stripe__create_charge": CHARGE}}).admit(req(sem=C, amount=7), has_compensation=True)
    assert a.verdict == "ALLOW" and a.compensate is None


def test_an_inverse_this_process_cannot_run_refuses_the_call() -> None:
    a = pset({"tools": {"stripe__create_charge": CHARGE}}).admit(req(sem=R, amount=7), has_compensation=False)
    assert a.verdict == "BLOCK"
    assert "no @compensator('test.refund') registered" in a.reason and "could not be undone" in a.reason


# ---------------------------------------------------------------- mode, appliesTo
def test_observe_mode_refuses_nothing_and_says_what_it_would_have_done() -> None:
    ps = pset({"mode": "Observe", "tools": {"t": {"semantics": "IRREVERSIBLE"}},
               "rules": [{"name": "big", "argExceeds": {"arg": "amount", "threshold": 10}}]})
    r = req("t", sem=R, amount=50)
    a = ps.admit(r, has_compensation=False)
    assert a.verdict == "ALLOW" and a.request is r and ps.rule_specs == ()
    assert a.observed == ("would gate t as IRREVERSIBLE",)
    assert [n for n, _ in ps.observed_rule_specs] == ["payments/p0:big"]
    assert ps.admit(req("other", sem=R), has_compensation=False).observed[0].startswith("would refuse: other")


def test_observe_mode_says_it_would_refuse_a_call_its_inverse_cannot_be_built_from() -> None:
    ps = pset({"mode": "Observe", "tools": {"git_add": {"semantics": "COMPENSABLE", "compensate": {
        "tool": "git_reset", "callArgs": {"repo_path": "$.repo_path"}}}}})
    a = ps.admit(req("git_add", sem=R, path="/srv/repo"), has_compensation=False)
    assert a.verdict == "ALLOW"
    assert a.observed[0].startswith("would refuse: SagaPolicy payments/p0 builds the inverse of git_add (git_reset)")
    assert ps.admit(req("git_add", sem=R, repo_path="/r"), has_compensation=False).observed == (
        "would gate git_add as COMPENSABLE",)


def test_a_policy_governs_only_the_agents_its_applies_to_matches() -> None:
    doc = {"appliesTo": {"agents": ["payments-*"]}}
    assert pset(doc, agent="payments-7").admit(req(), has_compensation=True).verdict == "BLOCK"
    other = pset(doc, agent="billing-1")
    assert not other and other.admit(req(), has_compensation=True).verdict == "ALLOW"


def test_no_policy_changes_nothing() -> None:
    r = req()
    a = PolicySet([], agent="x").admit(r, has_compensation=True)
    assert a.verdict == "ALLOW" and a.request is r and a.asks == ()


def test_an_agent_reports_which_version_of_each_policy_it_applied() -> None:
    assert pset({}).refs == [{"id": "payments/p0", "uid": "u0", "generation": 1, "mode": "Enforce"}]


@pytest.mark.parametrize("undeclared", ["Refuse", "RequireApproval", "Allow"])
def test_a_declared_tool_is_never_affected_by_undeclared_tools(undeclared: str) -> None:
    a = pset({"undeclaredTools": undeclared, "tools": {"t": {"semantics": "REVERSIBLE"}}}).admit(
        req("t", sem=R), has_compensation=False)
    assert a.verdict == "ALLOW" and a.asks == ()
