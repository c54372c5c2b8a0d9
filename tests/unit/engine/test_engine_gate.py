"""The pre-flight gate: consulted before any side effect; IRREVERSIBLE needs one; fails closed."""

from __future__ import annotations

import pytest
from agent_saga.compensation import Compensation
from agent_saga.errors import ConfigurationError, GateBlocked, SagaRefused
from agent_saga.gates import Gate, GateDecision, StepRequest
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import (
    AllowGate,
    BlockGate,
    of_type,
    payload,
    types,
    wal_fixture,  # noqa: F401 - provides the `wal` fixture
)

I = ActionSemantics.IRREVERSIBLE  # noqa: E741
C = ActionSemantics.COMPENSABLE


async def test_irreversible_is_refused_without_a_gate(wal):
    calls: list[str] = []
    with pytest.raises(GateBlocked) as info:
        async with saga_scope(wal) as saga:
            await saga.execute("wire.send", I, lambda: calls.append("sent"))
    exc = info.value
    assert isinstance(exc, SagaRefused)
    assert calls == []
    assert "approval provider" in str(exc) and "gate" in str(exc)
    assert exc.tool == "wire.send" and exc.step_id == f"{saga.saga_id}/0"
    assert exc.decided_by == "agent_saga.engine"
    kinds = types(wal, saga.saga_id)
    assert "STEP_INTENT" not in kinds and "STEP_REFUSED" in kinds


async def test_irreversible_runs_when_the_gate_allows(wal):
    gate = AllowGate("REQUIRE_APPROVAL", allowed=True)
    async with saga_scope(wal, gate=gate, tags=("eu",)) as saga:
        out = await saga.execute("wire.send", "IRREVERSIBLE", lambda: "ok", policy_args={"amount": 80000})
    assert out == "ok"
    (req,) = gate.requests
    assert req == StepRequest(saga.saga_id, f"{saga.saga_id}/0", "wire.send", I, {"amount": 80000}, ("eu",))
    (verdict,) = of_type(wal, saga.saga_id, "GATE_VERDICT")
    assert payload(verdict)["verdict"] == "REQUIRE_APPROVAL" and payload(verdict)["allowed"] is True
    kinds = types(wal, saga.saga_id)
    assert kinds.index("GATE_VERDICT") < kinds.index("STEP_INTENT") < kinds.index("STEP_COMMITTED")


async def test_a_block_refuses_before_any_side_effect(wal):
    calls: list[str] = []
    with pytest.raises(GateBlocked) as info:
        async with saga_scope(wal, gate=BlockGate("wire.send")) as saga:
            await saga.execute("a", C, lambda: calls.append("a"), lambda r: Compensation(fn=lambda: None))
            await saga.execute("wire.send", I, lambda: calls.append("wire"))
    assert calls == ["a"]
    assert info.value.reason == "wire.send is halted" and info.value.decided_by == "soc@corp"
    refused = of_type(wal, saga.saga_id, "STEP_REFUSED")
    assert [r.step for r in refused] == [f"{saga.saga_id}/1"]
    assert not [r for r in of_type(wal, saga.saga_id, "STEP_INTENT") if r.step == f"{saga.saga_id}/1"]
    # The refused step is not part of the rollback: nothing happened.
    assert [s.tool for s in saga.rollback_report.steps] == ["a"]


async def test_an_unapproved_require_approval_is_refused(wal):
    with pytest.raises(GateBlocked):
        async with saga_scope(wal, gate=AllowGate("REQUIRE_APPROVAL")) as saga:
            await saga.execute("wire.send", I, lambda: "never")


class RaisingGate:
    async def decide(self, request: StepRequest) -> GateDecision:
        raise ConnectionError("redis unreachable")


class GarbageGate:
    async def decide(self, request: StepRequest) -> GateDecision:
        return True  # type: ignore[return-value]


@pytest.mark.parametrize("gate", [RaisingGate(), GarbageGate()], ids=["raises", "garbage"])
async def test_a_broken_gate_fails_closed(wal, gate):
    calls: list[str] = []
    with pytest.raises(GateBlocked) as info:
        async with saga_scope(wal, gate=gate) as saga:
            await saga.execute("search", "REVERSIBLE", lambda: calls.append("x"))
    assert calls == []
    assert "refused" in info.value.reason
    (verdict,) = of_type(wal, saga.saga_id, "GATE_VERDICT")
    assert payload(verdict)["verdict"] == "BLOCK"


def test_gate_decision_is_consistent():
    assert GateDecision("ALLOW").allowed is True
    assert GateDecision("block").verdict == "BLOCK" and GateDecision("BLOCK").allowed is False
    assert GateDecision("REQUIRE_APPROVAL").allowed is False  # not stated granted: denied
    with pytest.raises(ConfigurationError):
        GateDecision("ALLOW", allowed=False)
    with pytest.raises(ConfigurationError):
        GateDecision("BLOCK", allowed=True)
    with pytest.raises(ConfigurationError):
        GateDecision("MAYBE")  # type: ignore[arg-type]
    assert isinstance(AllowGate(), Gate)


def test_a_gate_without_decide_is_refused_at_construction():
    with pytest.raises(ConfigurationError, match="Gate protocol"):
        saga_scope(gate=object())  # type: ignore[arg-type]
