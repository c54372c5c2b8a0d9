"""The compensator the recovery-fleet benchmark's orphans name (imported by each daemon)."""

from __future__ import annotations

from agent_saga import compensator


@compensator("bench.fleet.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    """Nothing to undo in a benchmark: the cost measured is the fleet's, not a server's."""
