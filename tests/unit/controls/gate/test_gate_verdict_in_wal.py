"""Under saga_scope, the GATE_VERDICT record carries the gate's own detail (which limit)."""

from __future__ import annotations

import pytest
from agent_saga import (
    ActionSemantics,
    BudgetLimit,
    GateBlocked,
    InProcessLimitStore,
    PreFlightGate,
    saga_scope,
)
from engine_support import of_type, wal_fixture  # noqa: F401


async def test_verdict_records_name_the_limit_and_the_debit(wal) -> None:
    gate = PreFlightGate(limits=[BudgetLimit("daily", arg="amount", max_total=100, window=86_400)],
                         store=InProcessLimitStore())
    ran: list[int] = []

    async def charge(n: int) -> dict:
        ran.append(n)
        return {"id": n}

    with pytest.raises(GateBlocked) as ei:
        async with saga_scope(wal, gate, name="v") as saga:
            await saga.execute("stripe.charge", ActionSemantics.REVERSIBLE, lambda: charge(60),
                               policy_args={"amount": 60})
            await saga.execute("stripe.charge", ActionSemantics.REVERSIBLE, lambda: charge(60),
                               policy_args={"amount": 60})
    assert ran == [60] and ei.value.decided_by == "limit:daily"
    verdicts = of_type(wal, saga.saga_id, "GATE_VERDICT")
    assert [v.payload["allowed"] for v in verdicts] == [True, False]
    assert verdicts[1].payload["stage"] == "limits"
    assert verdicts[1].payload["detail"], "the refusal's detail (limit, use, max) is in the log"
    assert "daily" in str(verdicts[1].payload["detail"])
