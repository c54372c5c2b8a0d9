"""A worker that runs one saga against the bank and dies at a chosen boundary.

Boundaries, in the order a saga meets them (a step's ``before_effect`` is inside its
forward call, after the intent is durable):

    before_effect               intent fsynced, the charge not made      (after_intent)
    after_effect                charge made, its inverse not yet durable (after_effect)
    after_commit                execute() returned: the descriptor is durable
    compensation_before_effect  inside a compensation, before the refund
    compensation_after_effect   inside a compensation, the refund made, DONE not written
    after_terminal              the saga's terminal record is durable

``kill = {"point": name or None, "nth": n, "mode": "exit" | "sigkill"}`` dies at the n-th
boundary named ``point`` (any boundary if None) with ``os._exit(137)`` or SIGKILL: no
atexit, no finally, no event-loop shutdown. Every boundary reached is appended to
``trace`` first, so the test knows exactly where it died.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

STEP_KINDS = ("charge", "cache", "notify", "charge_local")


def child_main(wal_path: str, bank_path: str, trace_path: str, scenario_json: str) -> None:
    """Entry point of the child process (forkserver or ``python chaos_worker.py``)."""
    scenario = json.loads(scenario_json)
    kill = scenario.get("kill") or {}
    state = {"hits": 0}
    trace = open(trace_path, "a", buffering=1)

    def hook(point: str) -> None:
        trace.write(point + "\n")
        if kill and (kill.get("point") in (None, point)):
            state["hits"] += 1
            if state["hits"] == kill["nth"]:
                trace.write("KILLED\n")
                if kill.get("mode") == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(137)

    import chaos_handlers

    chaos_handlers.KILL_HOOK = hook
    try:
        asyncio.run(_saga(wal_path, bank_path, scenario, hook))
    except Exception:  # noqa: BLE001 - the scenario's own failure: rolled back in-process
        pass
    trace.write("END\n")
    trace.close()
    os._exit(0)


class _AllowAll:
    async def decide(self, request: Any) -> Any:
        from agent_saga import GateDecision

        return GateDecision("ALLOW", "chaos suite: allow", decided_by="chaos")


async def _saga(wal_path: str, bank_path: str, scenario: dict[str, Any], hook: Any) -> None:
    from agent_saga import ActionSemantics, Compensation, FileWAL, saga_scope
    from chaos_bank import Bank

    saga_id = scenario["saga_id"]
    bank = Bank(bank_path)
    steps = scenario["steps"]
    gate = _AllowAll() if "notify" in steps else None
    wal = FileWAL(wal_path)
    async with saga_scope(wal, gate, saga_id=saga_id, lease_seconds=scenario.get("lease", 30.0)) as saga:
        for i, kind in enumerate(steps):
            amount = 100 * (i + 1)
            if kind in ("charge", "charge_local"):

                def charge(idempotency_key: str, amount: int = amount) -> dict[str, Any]:
                    hook("before_effect")
                    r = bank.charge(saga_id, amount, idempotency_key)
                    hook("after_effect")
                    return r

                if kind == "charge":
                    comp = lambda r: Compensation(  # noqa: E731
                        handler="chaos.refund", kwargs={"bank": bank_path, "charge_id": r["id"]}
                    )
                else:  # in-process only: a recovery daemon cannot replay it
                    comp = lambda r: Compensation(  # noqa: E731
                        fn=lambda idempotency_key, cid=r["id"]: bank.refund(cid, idempotency_key)
                    )
                await saga.execute(
                    "chaos.charge", ActionSemantics.COMPENSABLE, forward=charge, compensate=comp,
                    policy_args={"bank": bank_path, "account": saga_id, "amount": amount},
                )
                hook("after_commit")
            elif kind == "cache":
                await saga.execute("chaos.cache", ActionSemantics.REVERSIBLE, forward=lambda: asyncio.sleep(0))
            elif kind == "notify":

                def notify() -> str:
                    hook("before_effect")
                    with open(bank_path + ".sms", "a") as f:
                        f.write(saga_id + "\n")
                    hook("after_effect")
                    return "sent"

                await saga.execute("chaos.notify", ActionSemantics.IRREVERSIBLE, forward=notify,
                                   policy_args={"to": "+15550100"})
                hook("after_commit")
        if scenario.get("end") == "fail":
            raise RuntimeError("the agent gave up: roll back")
    hook("after_terminal")



def child_many(wal_path: str, bank_path: str, trace_path: str, n: int, lease: float) -> None:
    """Run ``n`` sagas of two charges each at once, then die with every one of them in
    flight (both charges committed, no terminal record): ``n`` orphans for the daemons."""

    async def main() -> None:
        from agent_saga import ActionSemantics, Compensation, FileWAL, saga_scope
        from agent_saga.wal.base import BaseWAL
        from chaos_bank import Bank

        bank = Bank(bank_path)
        wal: BaseWAL
        if "://" in wal_path:  # a fleet log (RedisWAL): this agent is one writer in it
            from agent_saga.recovery.targets import open_fleet_wal

            wal = open_fleet_wal(wal_path, writer="agent-1")
        else:
            wal = FileWAL(wal_path)
        committed = 0
        all_in = asyncio.Event()
        never = asyncio.Event()

        async def one(i: int) -> None:
            nonlocal committed
            saga_id = f"orphan-{i:04d}"
            async with saga_scope(wal, saga_id=saga_id, lease_seconds=lease) as saga:
                for j in range(2):
                    amount = 10 * (j + 1)

                    def charge(idempotency_key: str, amount: int = amount) -> dict[str, Any]:
                        return bank.charge(saga_id, amount, idempotency_key)

                    await saga.execute(
                        "chaos.charge", ActionSemantics.COMPENSABLE, forward=charge,
                        compensate=lambda r: Compensation(handler="chaos.refund", kwargs={"bank": bank_path, "charge_id": r["id"]}),
                        policy_args={"bank": bank_path, "account": saga_id, "amount": amount},
                    )
                committed += 1
                if committed == n:
                    all_in.set()
                await never.wait()

        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        await all_in.wait()
        await wal.barrier()
        with open(trace_path, "w") as f:
            f.write(f"{n} committed\n")
        os._exit(137)  # every saga in flight, nothing rolled back
        await asyncio.gather(*tasks)  # pragma: no cover

    asyncio.run(main())


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "many":
        child_many(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
    else:
        child_main(*sys.argv[1:5])
