"""A policy argument that is an integer beyond the largest float (``10**400``) is refused by
the gate with a verdict naming the argument and what is wrong: never a raw
``OverflowError`` out of ``decide`` (limits, rules, a per-argument scope), and through a
saga the refusal is a ``GateBlocked`` with its GATE_VERDICT in the WAL."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga.compensation import Compensation
from agent_saga.controls import BudgetLimit, PreFlightGate, arg_exceeds, by_arg
from agent_saga.errors import GateBlocked
from agent_saga.gates import StepRequest
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL, iter_file_records
from fixtures.steps import req as step_request

C = ActionSemantics.COMPENSABLE
HUGE = [10**400, -(10**400), 10**5000]


def req(**args: object) -> StepRequest:
    return step_request("wire.send", **args)


@pytest.mark.parametrize("value", HUGE, ids=["1e400", "-1e400", "1e5000"])
async def test_a_budget_limit_refuses_a_huge_integer_amount(value: int) -> None:
    gate = PreFlightGate(limits=[BudgetLimit("spend", arg="amount", max_total=1000, window=86_400)], rules=[])
    d = await gate.decide(req(amount=value))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:spend", d
    assert "policy argument 'amount' is an integer of" in d.reason and "1.8e308" in d.reason, d.reason
    assert "OverflowError" not in d.reason


@pytest.mark.parametrize("value", HUGE, ids=["1e400", "-1e400", "1e5000"])
async def test_a_rule_refuses_a_huge_integer_argument(value: int) -> None:
    gate = PreFlightGate(rules=[arg_exceeds("amount", 100)], limits=[])
    d = await gate.decide(req(amount=value))
    assert d.verdict == "BLOCK" and "policy argument 'amount' is an integer of" in d.reason, d
    assert "OverflowError" not in d.reason


async def test_a_per_argument_scope_refuses_a_huge_integer_id() -> None:
    gate = PreFlightGate(limits=[BudgetLimit("per-customer", arg="amount", max_total=1000, window=86_400,
                                             scope=by_arg("customer"))], rules=[])
    d = await gate.decide(req(amount=1, customer=10**5000))
    assert d.verdict == "BLOCK" and "policy argument 'customer'" in d.reason, d
    assert "at most 200 characters" in d.reason


async def test_through_a_saga_the_huge_amount_is_a_gate_refusal_on_record(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w.wal")
    gate = PreFlightGate(limits=[BudgetLimit("spend", arg="amount", max_total=1000, window=86_400)], rules=[])
    ran: list[int] = []
    with pytest.raises(GateBlocked, match="policy argument 'amount' is an integer of"):
        async with saga_scope(wal, gate, name="pay") as saga:
            await saga.execute("wire.send", C, lambda: ran.append(1), lambda r: Compensation(fn=lambda: None),
                               policy_args={"amount": 10**400})
    await wal.barrier()
    wal.close()
    assert ran == []
    verdicts = [r for _, r in iter_file_records(tmp_path / "w.wal") if r.type == "GATE_VERDICT"]
    assert verdicts and verdicts[0].payload["verdict"] == "BLOCK"
