"""The reconciler of ``chaos.charge``: did a dangling charge happen? Ask the bank by the
forward idempotency key (the bank charges at most once per key, so "not found" means a
replay could never charge either: authoritative)."""

from __future__ import annotations

from typing import Any

from agent_saga import Compensation
from agent_saga.recovery import reconciler
from chaos_bank import Bank


@reconciler("chaos.charge")
def find_charge(policy_args: dict[str, Any], idempotency_key: str) -> Compensation | None:
    bank = policy_args["bank"]
    charge = Bank(bank).find_charge(idempotency_key)
    if charge is None:
        return None
    return Compensation(handler="chaos.refund", kwargs={"bank": bank, "charge_id": charge["id"]})
