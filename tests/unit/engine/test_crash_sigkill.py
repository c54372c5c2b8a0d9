"""A real child process killed with SIGKILL mid-saga: the log verifies and holds the intent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_saga import verify_records
from agent_saga.history import COMMITTED, IN_FLIGHT, INTENT, fold
from agent_saga.wal.file import iter_file_records
from fixtures.polling import until

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from agent_saga import ActionSemantics, Compensation, FileWAL, saga_scope

    wal_path, ready = sys.argv[1], sys.argv[2]

    async def charge(amount):
        return {"id": "ch_1", "amount": amount}

    def wire_in_flight():
        open(ready, "w").write("in forward")   # the parent kills us now
        time.sleep(60)

    async def main():
        wal = FileWAL(wal_path)
        async with saga_scope(wal, name="crash") as saga:
            await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE,
                               forward=lambda: charge(4200),
                               compensate=lambda r: Compensation(handler="stripe.refund",
                                                                 kwargs={"charge_id": r["id"]}),
                               policy_args={"amount": 4200})
            for i in range(50):   # REVERSIBLE noise that nobody waits for
                await saga.execute("cache.put", ActionSemantics.REVERSIBLE,
                                   forward=lambda: asyncio.sleep(0))
            await saga.execute("ledger.transfer", ActionSemantics.COMPENSABLE,
                               forward=wire_in_flight,
                               compensate=lambda r: Compensation(handler="ledger.reverse",
                                                                 kwargs={"id": r["id"]}),
                               policy_args={"amount": 9900})

    asyncio.run(main())
    """
)


@pytest.mark.crash
def test_sigkill_mid_step_leaves_a_verifiable_log_with_the_intent(tmp_path: Path) -> None:
    wal_path, ready = tmp_path / "crash.wal", tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(wal_path), str(ready)])
    try:
        until("the child reaching the forward call", ready.exists, timeout=60, interval=0.01, proc=child)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()

    result = verify_records(iter_file_records(wal_path))
    assert result.ok, result.describe()
    sagas = fold(r for _, r in iter_file_records(wal_path))
    (saga,) = sagas.values()
    assert saga.status == IN_FLIGHT  # no terminal record: a recovery daemon must resolve it
    steps = list(saga.steps.values())
    assert steps[0].tool == "stripe.charge" and steps[0].state == COMMITTED
    assert steps[0].compensation == {"handler": "stripe.refund", "kwargs": {"charge_id": "ch_1"}, "description": ""}
    in_flight = steps[-1]
    assert in_flight.tool == "ledger.transfer" and in_flight.state == INTENT  # durable before the call
    assert [s.step_id for s in saga.dangling] == [in_flight.step_id]
