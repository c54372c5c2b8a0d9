"""The gate's evaluation order (kill switch -> breaker -> limits -> rules -> approval),
the pre-checks later controls plug into, and every verdict reaching the WAL."""

from __future__ import annotations

import json

import pytest
from agent_saga.compensation import Compensation
from agent_saga.controls import (
    ApprovalOutcome,
    BudgetLimit,
    InProcessLimitStore,
    PreCheck,
    PreFlightGate,
    RateLimit,
    rule,
)
from agent_saga.errors import ConfigurationError, GateBlocked
from agent_saga.gates import StepRequest
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL
from fixtures.steps import req as step_request
from fixtures.wal import records

C = ActionSemantics.COMPENSABLE
I = ActionSemantics.IRREVERSIBLE  # noqa: E741
DAY = 86_400


class Check:
    """A pre-check standing in for the kill switch or the breaker (their own issues)."""

    def __init__(self, name: str, stage: str, refuse: str | None = None, calls: list[str] | None = None,
                 raises: BaseException | None = None) -> None:
        self.name = name
        self.stage = stage
        self.refuse = refuse
        self.calls = calls if calls is not None else []
        self.raises = raises

    async def check(self, request: StepRequest) -> str | None:
        self.calls.append(self.name)
        if self.raises is not None:
            raise self.raises
        return self.refuse


class Approver:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    async def request_approval(self, request, verdict):
        self.calls.append("approval")
        return ApprovalOutcome(True, "risk@corp")


def req(tool: str = "wire.send", sem: ActionSemantics = I, **args) -> StepRequest:
    return step_request(tool, sem, **{"amount": 10, **args})


async def test_evaluation_order_is_kill_switch_breaker_limits_rules_approval():
    calls: list[str] = []
    store = InProcessLimitStore()
    real_debit = store.debit

    async def debit(*a, **kw):
        calls.append("limits")
        return await real_debit(*a, **kw)

    store.debit = debit  # type: ignore[method-assign]

    def when(r: StepRequest) -> bool:
        calls.append("rules")
        return False

    gate = PreFlightGate(
        rules=[rule("watch", when)],
        limits=[RateLimit("velocity", 5, 60)],
        approval_provider=Approver(calls),
        store=store,
        # given out of order on purpose: the gate orders pre-checks by stage
        checks=[Check("breaker", "breaker", calls=calls), Check("kill-switch", "kill_switch", calls=calls)],
    )
    d = await gate.decide(req())
    assert d.allowed
    assert calls == ["kill-switch", "breaker", "limits", "rules", "approval"]


async def test_a_kill_switch_refusal_spends_no_budget_and_asks_no_human():
    calls: list[str] = []
    store = InProcessLimitStore()
    gate = PreFlightGate(
        limits=[BudgetLimit("daily", arg="amount", max_total=100, window=DAY)],
        approval_provider=Approver(calls), store=store,
        checks=[Check("halt:tool:wire.send", "kill_switch", refuse="halted by soc@corp: fraud pattern")],
    )
    d = await gate.decide(req())
    assert d.verdict == "BLOCK" and d.stage == "kill_switch" and d.decided_by == "halt:tool:wire.send"
    assert d.reason == "halted by soc@corp: fraud pattern"
    assert calls == [] and await gate.usage() == []


async def test_a_breaker_refusal_comes_before_the_limits():
    store = InProcessLimitStore()
    gate = PreFlightGate(
        limits=[BudgetLimit("daily", arg="amount", max_total=100, window=DAY)], store=store,
        checks=[Check("stripe", "breaker", refuse="breaker open: stripe failing")],
    )
    d = await gate.decide(req(sem=C))
    assert d.stage == "breaker" and not d.allowed and await gate.usage() == []


async def test_a_pre_check_that_raises_fails_closed():
    gate = PreFlightGate(checks=[Check("ks", "kill_switch", raises=OSError("store gone"))])
    d = await gate.decide(req(sem=C))
    assert d.verdict == "BLOCK" and d.decided_by == "ks" and "OSError: store gone" in d.reason


def test_pre_checks_must_name_a_known_stage():
    assert isinstance(Check("x", "breaker"), PreCheck)
    with pytest.raises(ConfigurationError, match="stage 'kill_switch' or 'breaker'"):
        PreFlightGate(checks=[Check("x", "limits")])  # type: ignore[list-item]


async def test_every_verdict_is_written_to_the_wal_when_the_gate_has_one(tmp_path):
    wal = FileWAL(tmp_path / "gate.wal")
    try:
        gate = PreFlightGate(
            limits=[BudgetLimit("daily", arg="amount", max_total=15, window=DAY)],
            store=InProcessLimitStore(), wal=wal, approval_provider=Approver([]),
        )
        verdicts = [await gate.decide(req(sem=C)), await gate.decide(req(sem=C)), await gate.decide(req(sem=I, amount=1))]
        wal.barrier_sync()
    finally:
        wal.close()
    recs = [r for r in records(tmp_path / "gate.wal") if r.type == "GATE_VERDICT"]
    assert [r.payload["verdict"] for r in recs] == [v.verdict for v in verdicts] == ["ALLOW", "BLOCK", "REQUIRE_APPROVAL"]
    allowed, blocked, approved = (r.payload for r in recs)
    assert blocked["decided_by"] == "limit:daily" and blocked["stage"] == "limits"
    assert blocked["detail"]["charges"][0] == {
        "limit": "daily", "kind": "budget", "scope": "*", "amount": 10, "max_total": 15.0, "window": 86400.0,
        "used": 10.0, "over": True,
    }
    assert approved["detail"]["approval"]["approver"] == "risk@corp" and approved["allowed"] is True
    assert all(r.saga == "s-1" and r.step == "s-1/0" for r in recs)
    json.dumps([r.payload for r in recs], allow_nan=False)


async def test_under_saga_scope_the_engine_records_the_verdict_and_refuses_the_step(tmp_path):
    store = InProcessLimitStore()
    gate = PreFlightGate(limits=[BudgetLimit("daily", arg="amount", max_total=100, window=DAY)], store=store)
    wal = FileWAL(tmp_path / "saga.wal")
    ran: list[int] = []
    try:
        with pytest.raises(GateBlocked) as info:
            async with saga_scope(wal, gate=gate) as saga:
                undo = lambda r: Compensation(fn=lambda: None, handler="test.noop")  # noqa: E731
                await saga.execute("stripe.charge", C, lambda: ran.append(60), undo, policy_args={"amount": 60})
                await saga.execute("stripe.charge", C, lambda: ran.append(50), undo, policy_args={"amount": 50})
        wal.barrier_sync()
    finally:
        wal.close()
    assert ran == [60]
    assert info.value.decided_by == "limit:daily" and "60 of 100 used" in info.value.reason
    kinds = [(r.type, (r.payload or {}).get("verdict")) for r in records(tmp_path / "saga.wal") if r.saga == saga.saga_id]
    assert ("GATE_VERDICT", "ALLOW") in kinds and ("GATE_VERDICT", "BLOCK") in kinds
    assert ("STEP_REFUSED", "BLOCK") in kinds
    assert sum(1 for k, _ in kinds if k == "GATE_VERDICT") == 2, "one verdict per step, not two"
