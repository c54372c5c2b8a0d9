"""The reconciler of ``chaos.charge``: did a dangling charge happen? Ask the bank by the
forward idempotency key (the bank charges at most once per key, so "not found" means a
replay could never charge either: authoritative)."""

from __future__ import annotations

from typing import Any

from agent_saga import Compensation, Observation
from agent_saga.recovery import reconciler
from chaos_bank import Bank


@reconciler("chaos.charge")
def find_charge(*, bank: str, idempotency_key: str, **_: Any) -> Observation:
    charge = Bank(bank).find_charge(idempotency_key)
    if charge is None:
        return Observation(exists=False, detail="no charge under the forward key")
    state = Bank(bank).state()[charge["id"]]
    return Observation(
        exists=True, reversed_=bool(state.applied), amount=charge["amount"], detail=charge["id"],
        compensation=Compensation(handler="chaos.refund", kwargs={"bank": bank, "charge_id": charge["id"]}),
    )
