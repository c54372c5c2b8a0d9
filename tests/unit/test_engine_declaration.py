"""A gate's Declaration: a reviewed policy tightens how a step runs, never loosens it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from agent_saga.compensation import Compensation
from agent_saga.gates import Declaration, GateDecision, StepRequest
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import of_type, payload, wal_fixture  # noqa: F401 - provides the `wal` fixture

R = ActionSemantics.REVERSIBLE
C = ActionSemantics.COMPENSABLE
I = ActionSemantics.IRREVERSIBLE  # noqa: E741


@dataclass(frozen=True)
class Declared(GateDecision):
    declaration: Declaration | None = None


class DeclaringGate:
    def __init__(self, declaration: Declaration) -> None:
        self.declaration = declaration
        self.requests: list[StepRequest] = []

    async def decide(self, request: StepRequest) -> GateDecision:
        self.requests.append(request)
        return Declared("ALLOW", "policy", "policy:test", True, self.declaration)


def intent(wal, saga_id: str) -> dict:
    (rec,) = of_type(wal, saga_id, "STEP_INTENT")
    return payload(rec)


async def test_a_reversible_step_declared_compensable_runs_with_the_policys_inverse(wal) -> None:
    undone: list[object] = []
    policy_inverse = lambda r: Compensation(fn=lambda: undone.append(r["id"]))  # noqa: E731
    gate = DeclaringGate(Declaration(C, policy_inverse))
    with pytest.raises(RuntimeError):
        async with saga_scope(wal, gate=gate) as saga:
            await saga.execute("charge", R, lambda: {"id": "ch_1"})
            raise RuntimeError("model regretted it")
    assert intent(wal, saga.saga_id)["semantics"] == "COMPENSABLE"
    assert undone == ["ch_1"]  # rolled back with the policy's inverse


async def test_the_codes_inverse_wins_over_the_policys(wal) -> None:
    undone: list[str] = []
    gate = DeclaringGate(Declaration(C, lambda r: Compensation(fn=lambda: undone.append("policy"))))
    with pytest.raises(RuntimeError):
        async with saga_scope(wal, gate=gate) as saga:
            await saga.execute("charge", C, lambda: {"id": "ch_1"},
                               lambda r: Compensation(fn=lambda: undone.append("code")))
            raise RuntimeError("fail")
    assert undone == ["code"]


async def test_a_step_declared_irreversible_without_an_inverse_runs_irreversible(wal) -> None:
    gate = DeclaringGate(Declaration(I))
    async with saga_scope(wal, gate=gate) as saga:
        await saga.execute("sms", R, lambda: "sent")
    assert intent(wal, saga.saga_id)["semantics"] == "IRREVERSIBLE"


async def test_a_step_declared_irreversible_keeps_the_codes_undo(wal) -> None:
    undone: list[str] = []
    gate = DeclaringGate(Declaration(I))
    with pytest.raises(RuntimeError):
        async with saga_scope(wal, gate=gate) as saga:
            await saga.execute("charge", C, lambda: {"id": "x"}, lambda r: Compensation(fn=lambda: undone.append("x")))
            raise RuntimeError("fail")
    assert intent(wal, saga.saga_id)["semantics"] == "COMPENSABLE" and undone == ["x"]


async def test_a_declaration_never_loosens_what_code_declares(wal) -> None:
    gate = DeclaringGate(Declaration(R))
    async with saga_scope(wal, gate=gate) as saga:
        await saga.execute("wire", I, lambda: "sent")
    assert intent(wal, saga.saga_id)["semantics"] == "IRREVERSIBLE"
