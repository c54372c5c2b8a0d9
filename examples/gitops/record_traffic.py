"""Record a day of the payments agent's traffic in a FileWAL, under the reviewed SagaPolicy.

    python examples/gitops/record_traffic.py agent-saga.wal

The calls go through a real PreFlightGate enforcing examples/k8s/policy.yaml (the agent is
``payments-agent``, which the policy's ``appliesTo`` governs): charges and wires, large
charges a human approves, payouts a human approves, payments of sagas tagged ``eu``
refused, and a call to a tool nobody declared refused. The log is what
``agent-saga policy replay`` and ``agent-saga limits replay`` read (docs/gitops.md).
Offline and deterministic: no server, no network.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from agent_saga import (
    ActionSemantics,
    ApprovalOutcome,
    Compensation,
    FileWAL,
    GateBlocked,
    PreFlightGate,
    compensator,
    saga_scope,
)
from agent_saga.controls.policy import StaticPolicySource

POLICY = Path(__file__).resolve().parents[1] / "k8s" / "policy.yaml"
C, IRR, R = ActionSemantics.COMPENSABLE, ActionSemantics.IRREVERSIBLE, ActionSemantics.REVERSIBLE


@compensator("payments.refund")
def refund(charge_id: str) -> None:
    """The bank's refund (nothing to do in this offline example)."""


@compensator("payments.wire_recall")
def recall(wire: str) -> None:
    """The bank's wire recall."""


class Approver:
    """A named human who approves what the gate sends them (risk@example.com)."""

    async def request_approval(self, request: Any, verdict: Any) -> ApprovalOutcome:
        return ApprovalOutcome(True, "risk@example.com", "reviewed")


async def payment(wal: FileWAL, gate: PreFlightGate, n: int, amount: int, tags: tuple[str, ...]) -> None:
    customer = f"cus-{n % 7:04d}"
    async with saga_scope(wal, gate, name="payment", tags=tags) as saga:
        await saga.execute("payments.charge", C, lambda: {"id": f"ch-{n}"},
                           compensate=lambda r: Compensation(handler="payments.refund", kwargs={"charge_id": r["id"]}),
                           policy_args={"amount": amount, "customer_id": customer})
        await saga.execute("wire.send", C, lambda: {"wire": f"w-{n}"},
                           compensate=lambda r: Compensation(handler="payments.wire_recall", kwargs={"wire": r["wire"]}),
                           policy_args={"amount": amount})


async def main(path: str) -> int:
    wal = FileWAL(path)
    gate = PreFlightGate(policy=StaticPolicySource.from_file(POLICY, agent="payments-agent"),
                         approval_provider=Approver(), checks=())
    amounts = [120, 900, 15_000, 40, 2_500, 12_000, 75, 600, 30_000, 310]
    refused = 0
    for n in range(60):
        tags = ("eu",) if n % 10 == 3 else ("us",)
        try:
            await payment(wal, gate, n, amounts[n % len(amounts)], tags)
        except GateBlocked:
            refused += 1
        if n % 6 == 0:
            async with saga_scope(wal, gate, name="lookup", tags=("us",)) as saga:
                await saga.execute("search_docs", R, lambda: {"hits": 3}, policy_args={"query_chars": 12})
        if n % 15 == 0:
            async with saga_scope(wal, gate, name="payout", tags=("us",)) as saga:
                await saga.execute("payout.send", IRR, lambda: {"payout": "po-1"}, policy_args={"amount": 500})
        if n % 20 == 7:
            try:
                async with saga_scope(wal, gate, name="crm", tags=("us",)) as saga:
                    await saga.execute("crm.update", R, lambda: {"ok": True}, policy_args={})
            except GateBlocked:
                refused += 1
    wal.close()
    print(f"wrote {path}: 60 payments, lookups, payouts and CRM updates; {refused} saga(s) refused by the gate")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "agent-saga.wal")))
