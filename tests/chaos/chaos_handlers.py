"""The named handlers of the chaos suite: imported by the worker and by every daemon.

``KILL_HOOK`` is set only inside a worker process, so a crash point inside a compensation
fires in the worker's own rollback and never in a daemon.
"""

from __future__ import annotations

from collections.abc import Callable

from agent_saga import compensator
from chaos_bank import Bank

KILL_HOOK: Callable[[str], None] | None = None


def _hook(point: str) -> None:
    if KILL_HOOK is not None:
        KILL_HOOK(point)


@compensator("chaos.refund")
def refund(bank: str, charge_id: str, idempotency_key: str) -> str:
    _hook("compensation_before_effect")
    status = Bank(bank).refund(charge_id, idempotency_key)
    _hook("compensation_after_effect")
    return status


@compensator("chaos.gated_refund")
def gated_refund(bank: str, charge_id: str, gate: str, idempotency_key: str) -> str:
    """A refund that waits until the file ``gate`` exists: a slow network call, held open
    by the test (it announces itself with ``<gate>.entered``)."""
    import os
    import time

    open(gate + ".entered", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return Bank(bank).refund(charge_id, idempotency_key)
