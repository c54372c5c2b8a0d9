"""The gate enforces SagaPolicies: each test named after a sentence of the spec.

Undeclared tools refused before anything is spent; a rule asks a human; the tightened
semantics and policy arguments reach the limits and rules; the policy's inverse is what a
rollback runs when the code gave none; Observe mode refuses nothing and records the
surface; a source that cannot be used refuses every call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga.compensation import compensator, unregister_compensator
from agent_saga.controls import ApprovalOutcome, BudgetLimit, InProcessLimitStore, PreFlightGate
from agent_saga.controls.policy import (
    PolicyInForce,
    PolicySet,
    PolicyView,
    StaticPolicySource,
    get_policy_source,
    parse_policy,
    set_policy_source,
)
from agent_saga.errors import GateBlocked, RollbackIncomplete
from agent_saga.gates import StepRequest
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import of_type, payload, types, wal_fixture  # noqa: F401 - provides the `wal` fixture
from fixtures.steps import req as step_request

R = ActionSemantics.REVERSIBLE
C = ActionSemantics.COMPENSABLE
I = ActionSemantics.IRREVERSIBLE  # noqa: E741

POLICY = {"tools": {"search_docs": {"semantics": "REVERSIBLE"},
                    "charge": {"semantics": "COMPENSABLE",
                               "compensate": {"handler": "test.policy-refund", "args": {"charge": "$.id"}},
                               "policyArgs": {"amount": "$.cents"}}},
          "rules": [{"name": "big", "argExceeds": {"arg": "amount", "threshold": 1000}, "reason": "big charge"}]}


def source(doc: dict, agent: str = "a") -> StaticPolicySource:
    return StaticPolicySource([PolicyInForce("payments/p", parse_policy(doc), "u", 1)], agent=agent)


def req(tool: str, sem: ActionSemantics = R, has_inverse: bool = False, **args: object) -> StepRequest:
    return step_request(tool, sem, saga="s", has_inverse=has_inverse, **args)


class Approver:
    def __init__(self, approved: bool = True) -> None:
        self.approved = approved
        self.asked: list[tuple[StepRequest, object]] = []

    async def request_approval(self, request, verdict):
        self.asked.append((request, verdict))
        return ApprovalOutcome(self.approved, "risk@corp", "")


class Broken:
    def view(self) -> PolicyView:
        raise RuntimeError("boom")

    def describe(self) -> str:
        return "Broken()"

    def record(self, request: StepRequest) -> None:
        return None


async def test_an_undeclared_tool_is_refused_before_anything_is_spent() -> None:
    store = InProcessLimitStore()
    gate = PreFlightGate(limits=[BudgetLimit("all", arg="amount", max_total=10, window=3600)], store=store,
                         policy=source(POLICY))
    d = await gate.decide(req("wire.send", amount=1))
    assert d.verdict == "BLOCK" and d.stage == "policy" and d.decided_by == "policy:payments/p"
    assert d.detail["policy"]["undeclared"] is True
    assert await store.usage([s for s in (gate.limits[0].spec(),)]) == []  # nothing was debited


async def test_policy_arguments_taken_by_path_reach_the_limits_and_the_rules() -> None:
    compensator("test.policy-refund")(lambda charge: None)
    try:
        store = InProcessLimitStore()
        gate = PreFlightGate(limits=[BudgetLimit("cents", arg="amount", max_total=5000, window=3600)], store=store,
                             default_rules=(), policy=source(POLICY))
        ok = await gate.decide(req("charge", C, True, cents=900))
        assert ok.verdict == "ALLOW" and ok.detail["charges"][0]["amount"] == 900
        big = await gate.decide(req("charge", C, True, cents=2000))
        assert big.verdict == "BLOCK" and big.decided_by == "rule:payments/p:big"  # no approver: refused
        assert "big charge (amount 2000 exceeds 1000)" in big.reason
    finally:
        unregister_compensator("test.policy-refund")


async def test_a_policy_rule_asks_a_human_and_a_yes_lets_the_call_run() -> None:
    approver = Approver()
    gate = PreFlightGate(default_rules=(), approval_provider=approver, policy=source(
        {"undeclaredTools": "Allow", "rules": [{"name": "big", "argExceeds": {"arg": "amount", "threshold": 10}}]}))
    d = await gate.decide(req("wire.send", amount=50))
    assert d.allowed and d.verdict == "REQUIRE_APPROVAL" and d.decided_by == "rule:payments/p:big"
    assert len(approver.asked) == 1


async def test_a_tool_tightened_to_irreversible_needs_a_human() -> None:
    gate = PreFlightGate(policy=source({"tools": {"t": {"semantics": "IRREVERSIBLE"}}}))
    d = await gate.decide(req("t", R))
    assert d.verdict == "BLOCK" and d.decided_by == "rule:irreversible"
    assert d.detail["policy"]["semantics"] == {"code": "REVERSIBLE", "enforced": "IRREVERSIBLE"}


async def test_a_policy_that_cannot_be_used_refuses_every_call() -> None:
    unread = StaticPolicySource([], agent="a")
    unread._view = PolicyView(PolicySet((), agent="a"), usable=False, problem="never read")
    d = await PreFlightGate(policy=unread).decide(req("search_docs"))
    assert d.verdict == "BLOCK" and d.decided_by == "policy-source" and "never read" in d.reason
    d = await PreFlightGate(policy=Broken()).decide(req("search_docs"))  # type: ignore[arg-type]
    assert d.verdict == "BLOCK" and "failed (RuntimeError: boom)" in d.reason


async def test_observe_mode_refuses_nothing_records_what_it_would_do_and_the_surface() -> None:
    src = source({"mode": "Observe", "rules": [{"name": "big", "argExceeds": {"arg": "amount", "threshold": 1}}]})
    d = await PreFlightGate(policy=src, default_rules=()).decide(req("wire.send", amount=5, to="acct"))
    assert d.verdict == "ALLOW"
    assert d.detail["policy"]["observed"] == [
        "would refuse: wire.send is not declared in SagaPolicy payments/p, and undeclared tools are refused: "
        "declare it under spec.tools (semantics, and its inverse if COMPENSABLE)",
        "rule payments/p:big would ask a human: amount 5 exceeds 1"]
    (entry,) = src.surface.drain()
    assert (entry["tool"], entry["semantics"], entry["policyArgs"], entry["calls"]) == (
        "wire.send", "REVERSIBLE", ["amount", "to"], 1)


async def test_the_process_wide_source_is_what_a_gate_without_policy_uses() -> None:
    src = source(POLICY)
    prev = set_policy_source(src)
    try:
        assert PreFlightGate().policy is src and get_policy_source() is src
        assert PreFlightGate(policy=None).policy is None
        assert (await PreFlightGate().decide(req("wire.send"))).stage == "policy"
    finally:
        set_policy_source(prev)


async def test_a_rollback_runs_the_policys_inverse_with_arguments_from_the_forward_result(wal) -> None:
    undone: list[str] = []
    compensator("test.policy-refund")(lambda charge: undone.append(charge))
    try:
        gate = PreFlightGate(default_rules=(), policy=source(POLICY))
        with pytest.raises(RuntimeError):
            async with saga_scope(wal, gate=gate) as saga:
                await saga.execute("charge", R, lambda: {"id": "ch_42"}, policy_args={"cents": 10})
                raise RuntimeError("the model regretted it")
    finally:
        unregister_compensator("test.policy-refund")
    assert undone == ["ch_42"]
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert payload(committed)["compensation"]["handler"] == "test.policy-refund"
    (intent,) = of_type(wal, saga.saga_id, "STEP_INTENT")
    assert payload(intent)["semantics"] == "COMPENSABLE"


async def test_an_undeclared_tool_in_a_saga_raises_gate_blocked_and_nothing_runs(wal) -> None:
    ran: list[str] = []
    with pytest.raises(GateBlocked) as info:
        async with saga_scope(wal, gate=PreFlightGate(policy=source(POLICY))) as saga:
            await saga.execute("wire.send", R, lambda: ran.append("sent"))
    assert ran == [] and info.value.decided_by == "policy:payments/p"
    assert "STEP_INTENT" not in types(wal, saga.saga_id) and "STEP_REFUSED" in types(wal, saga.saga_id)


MOVE = {"tools": {"move": {"semantics": "COMPENSABLE", "compensate": {
    "handler": "test.policy-move", "callArgs": {"src": "$.to", "dst": "$.from"}, "values": {"overwrite": False},
    "args": {"version": "$.version"}}}}}


async def test_a_rollback_builds_the_policys_inverse_from_the_call_the_constants_and_the_result(wal) -> None:
    undone: list[dict[str, object]] = []
    compensator("test.policy-move")(lambda src, dst, overwrite, version: undone.append(
        {"src": src, "dst": dst, "overwrite": overwrite, "version": version}))
    try:
        gate = PreFlightGate(default_rules=(), policy=source(MOVE))
        with pytest.raises(RuntimeError):
            async with saga_scope(wal, gate=gate) as saga:
                await saga.execute("move", R, lambda: {"version": 7}, policy_args={"from": "/a", "to": "/b"})
                raise RuntimeError("the model regretted it")
    finally:
        unregister_compensator("test.policy-move")
    assert undone == [{"src": "/b", "dst": "/a", "overwrite": False, "version": 7}]
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")  # what a recovery process replays
    assert payload(committed)["compensation"]["kwargs"] == undone[0]


async def test_a_call_without_an_argument_the_inverse_reads_is_refused_before_it_runs(wal) -> None:
    ran: list[str] = []
    compensator("test.policy-move")(lambda **kw: None)
    try:
        with pytest.raises(GateBlocked) as info:
            async with saga_scope(wal, gate=PreFlightGate(default_rules=(), policy=source(MOVE))) as saga:
                await saga.execute("move", R, lambda: ran.append("moved"), policy_args={"from": "/a"})
    finally:
        unregister_compensator("test.policy-move")
    assert ran == [] and info.value.decided_by == "policy:payments/p"
    assert "'src' from the call's $.to (compensate.callArgs)" in info.value.reason
    assert "$ has no field 'to' (fields: from)" in info.value.reason
    assert "STEP_INTENT" not in types(wal, saga.saga_id) and "STEP_REFUSED" in types(wal, saga.saga_id)


async def test_a_result_without_an_argument_the_inverse_reads_escalates_as_before(wal) -> None:
    compensator("test.policy-move")(lambda **kw: None)
    try:
        with pytest.raises(RollbackIncomplete, match="could not read its arguments: [$].version"):
            async with saga_scope(wal, gate=PreFlightGate(default_rules=(), policy=source(MOVE))) as saga:
                await saga.execute("move", R, lambda: {"no": "version"}, policy_args={"from": "/a", "to": "/b"})
                raise RuntimeError("the model regretted it")
    finally:
        unregister_compensator("test.policy-move")
    assert "STEP_COMMITTED" in types(wal, saga.saga_id) and "ESCALATED" in types(wal, saga.saga_id)


async def test_a_secret_in_the_call_an_inverse_reads_is_refused_before_it_runs_and_never_logged(wal) -> None:
    compensator("test.policy-move")(lambda **kw: None)
    secret = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
    ran: list[str] = []
    try:
        with pytest.raises(Exception, match="looks like a secret"):
            async with saga_scope(wal, gate=PreFlightGate(default_rules=(), policy=source(MOVE))) as saga:
                await saga.execute("move", R, lambda: ran.append("moved") or {"version": 1},
                                   policy_args={"from": "/a", "to": secret})
    finally:
        unregister_compensator("test.policy-move")
    wal.barrier_sync()
    assert ran == [] and secret.encode() not in Path(wal.path).read_bytes()
