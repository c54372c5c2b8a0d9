"""PreFlightGate rules and approvals: IRREVERSIBLE requires a human, arg_exceeds-style
rules over tool / semantics / policy_args / tags, and every way an approval fails closed."""

from __future__ import annotations

import pytest
from agent_saga.controls import (
    DEFAULT_RULES,
    ApprovalOutcome,
    PreFlightDecision,
    PreFlightGate,
    arg_exceeds,
    irreversible_requires_human,
    rule,
    tagged,
    tool_matches,
)
from agent_saga.errors import ConfigurationError
from agent_saga.gates import Gate, GateDecision, StepRequest
from agent_saga.semantics import ActionSemantics
from fixtures.steps import req

R = ActionSemantics.REVERSIBLE
C = ActionSemantics.COMPENSABLE
I = ActionSemantics.IRREVERSIBLE  # noqa: E741


class Approver:
    """A test approval provider answering from a script."""

    def __init__(self, outcome: object = None, raises: BaseException | None = None) -> None:
        self.outcome = outcome if outcome is not None else ApprovalOutcome(True, "risk@corp", "verified by phone")
        self.raises = raises
        self.asked: list[tuple[StepRequest, PreFlightDecision]] = []

    async def request_approval(self, request, verdict):
        self.asked.append((request, verdict))
        if self.raises is not None:
            raise self.raises
        return self.outcome


def test_the_gate_implements_the_engine_gate_protocol():
    gate = PreFlightGate()
    assert isinstance(gate, Gate)


async def test_decisions_are_gate_decisions_the_engine_accepts():
    d = await PreFlightGate().decide(req())
    assert isinstance(d, GateDecision) and isinstance(d, PreFlightDecision)
    assert d.verdict == "ALLOW" and d.allowed and d.decided_by == "PreFlightGate"


async def test_default_rule_irreversible_requires_a_human():
    approver = Approver()
    gate = PreFlightGate(approval_provider=approver)
    d = await gate.decide(req("wire.send", I, amount=80_000, to="acct_9"))
    assert d.verdict == "REQUIRE_APPROVAL" and d.allowed
    assert d.decided_by == "rule:irreversible"
    assert d.reason.startswith("Action cannot be undone") and "approved by risk@corp" in d.reason
    assert "verified by phone" in d.reason
    (asked, pending), = approver.asked
    assert asked.policy_args == {"amount": 80_000, "to": "acct_9"}
    assert pending.verdict == "REQUIRE_APPROVAL" and not pending.allowed
    assert pending.reason == "Action cannot be undone"


async def test_default_rule_irreversible_without_an_approver_is_blocked():
    d = await PreFlightGate().decide(req("wire.send", I))
    assert d.verdict == "BLOCK" and not d.allowed and d.decided_by == "rule:irreversible"
    assert "no approval_provider" in d.reason


async def test_reversible_and_compensable_steps_pass_the_default_rule():
    gate = PreFlightGate()
    assert (await gate.decide(req(sem=R))).allowed
    assert (await gate.decide(req(sem=C))).allowed


async def test_user_rules_add_to_the_default_rule_and_default_rules_can_be_dropped():
    gate = PreFlightGate(rules=[arg_exceeds("amount", 1000)])
    assert [r.name for r in gate.rules] == ["irreversible", "amount-exceeds-1000"]
    assert not (await gate.decide(req("wire.send", I, amount=1))).allowed
    bare = PreFlightGate(rules=[arg_exceeds("amount", 1000)], default_rules=())
    assert (await bare.decide(req("wire.send", I, amount=1))).allowed
    assert DEFAULT_RULES[0].name == irreversible_requires_human().name == "irreversible"


async def test_arg_exceeds_requires_approval_above_the_threshold_only():
    approver = Approver(ApprovalOutcome(False, "risk@corp", "no"))
    gate = PreFlightGate(rules=[arg_exceeds("amount", 1000)], approval_provider=approver)
    assert (await gate.decide(req(amount=1000))).verdict == "ALLOW"
    d = await gate.decide(req(amount=1000.01))
    assert d.verdict == "REQUIRE_APPROVAL" and not d.allowed
    assert d.decided_by == "rule:amount-exceeds-1000" and "amount 1000.01 exceeds 1000" in d.reason
    assert "denied by risk@corp: no" in d.reason


async def test_arg_exceeds_can_block_and_does_not_match_a_call_without_the_arg():
    gate = PreFlightGate(rules=[arg_exceeds("amount", 10, "BLOCK", name="small-only")])
    assert (await gate.decide(req(tool="jira.create_issue", summary="x"))).allowed
    d = await gate.decide(req(amount=11))
    assert d.verdict == "BLOCK" and d.decided_by == "rule:small-only"


async def test_arg_exceeds_fails_closed_when_the_arg_is_not_a_number():
    d = await PreFlightGate(rules=[arg_exceeds("amount", 10)]).decide(req(amount="11"))
    assert d.verdict == "BLOCK" and d.decided_by == "rule:amount-exceeds-10"
    assert "cannot read" in d.reason and "'11'" in d.reason


async def test_rules_see_tool_semantics_policy_args_and_saga_tags():
    seen: list[StepRequest] = []

    def when(r: StepRequest) -> bool:
        seen.append(r)
        return r.tool == "wire.send" and r.semantics == C and r.policy_args["to"] == "acct_9" and "eu" in r.tags

    gate = PreFlightGate(rules=[rule("eu-wires", when, "BLOCK", "EU wires are paused")])
    d = await gate.decide(req("wire.send", C, ("eu", "prod"), to="acct_9"))
    assert d.verdict == "BLOCK" and d.reason == "EU wires are paused" and d.decided_by == "rule:eu-wires"
    assert seen[0].tags == ("eu", "prod")
    assert (await gate.decide(req("wire.send", C, ("us",), to="acct_9"))).allowed


async def test_tagged_and_tool_matches_rules():
    gate = PreFlightGate(
        rules=[tool_matches("stripe.*", reason="stripe is frozen"), tagged("eu", "BLOCK")],
        default_rules=(),
    )
    d = await gate.decide(req("stripe.refund"))
    assert d.verdict == "BLOCK" and d.decided_by == "rule:tool:stripe.*" and d.reason == "stripe is frozen"
    d = await gate.decide(req("jira.create_issue", tags=("eu",)))
    assert d.verdict == "BLOCK" and d.decided_by == "rule:tag:eu"
    assert (await gate.decide(req("jira.create_issue"))).allowed


async def test_a_block_rule_wins_over_an_approval_rule_and_no_human_is_asked():
    approver = Approver()
    gate = PreFlightGate(rules=[tool_matches("wire.*")], approval_provider=approver)
    d = await gate.decide(req("wire.send", I))
    assert d.verdict == "BLOCK" and d.decided_by == "rule:tool:wire.*"
    assert approver.asked == []


async def test_several_approval_rules_are_one_request_naming_the_first():
    approver = Approver()
    gate = PreFlightGate(rules=[arg_exceeds("amount", 10)], approval_provider=approver)
    d = await gate.decide(req("wire.send", I, amount=11))
    assert d.allowed and d.decided_by == "rule:irreversible"
    (_, pending), = approver.asked
    assert "Action cannot be undone" in pending.reason and "amount 11 exceeds 10" in pending.reason
    assert [r["rule"] for r in d.detail["rules"]] == ["irreversible", "amount-exceeds-10"]


async def test_a_rule_that_raises_fails_closed():
    def broken(r: StepRequest) -> bool:
        raise KeyError("to")

    d = await PreFlightGate(rules=[rule("broken", broken)]).decide(req())
    assert d.verdict == "BLOCK" and d.decided_by == "rule:broken" and "KeyError" in d.reason


async def test_an_approval_without_a_named_approver_is_refused():
    for who in (None, "", "  "):
        d = await PreFlightGate(approval_provider=Approver(ApprovalOutcome(True, who))).decide(req("wire.send", I))
        assert d.verdict == "BLOCK" and not d.allowed and "names no approver" in d.reason


async def test_an_approval_provider_that_raises_fails_closed():
    d = await PreFlightGate(approval_provider=Approver(raises=ConnectionError("slack down"))).decide(req("wire.send", I))
    assert d.verdict == "BLOCK" and d.decided_by == "approval" and "ConnectionError: slack down" in d.reason


async def test_an_approval_provider_that_answers_with_anything_else_fails_closed():
    d = await PreFlightGate(approval_provider=Approver(outcome=True)).decide(req("wire.send", I))
    assert d.verdict == "BLOCK" and "not an ApprovalOutcome" in d.reason


async def test_a_break_glass_approval_is_marked():
    d = await PreFlightGate(
        approval_provider=Approver(ApprovalOutcome(True, "cto@corp", "incident 7", break_glass=True))
    ).decide(req("wire.send", I))
    assert d.allowed and "(break-glass)" in d.reason and d.detail["approval"]["break_glass"] is True


def test_misuse_is_refused_eagerly():
    with pytest.raises(ConfigurationError, match="verdict must be"):
        rule("x", lambda r: True, "ALLOW")
    with pytest.raises(ConfigurationError, match="rules must be rules"):
        PreFlightGate(rules=[lambda r: None])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="request_approval"):
        PreFlightGate(approval_provider=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="threshold must be a finite number"):
        arg_exceeds("amount", float("nan"))
