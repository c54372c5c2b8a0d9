"""A test agent: a separate process using only the runtime library with Redis stores.

    python tests/e2e/operator_agent.py REDIS_URL NAMESPACE WAL_DIR [APPROVAL_TIMEOUT [SWITCH_GRACE]]

It reads the policy plane exactly as a pod would (kill switch, limits from the
operator's BudgetLimit documents, approvals through Redis) and never talks to the
Kubernetes API. Commands arrive as JSON lines on stdin and run concurrently; each
answer is one JSON line ``{"id", "ok", "error", "kind"}`` on stdout:

    {"id": 1, "op": "call", "tool": "wire.send", "amount": 10}      one-step saga
    {"id": 2, "op": "open", "saga": "s1", "tags": ["eu"]}           start a saga, keep it open
    {"id": 3, "op": "step", "saga": "s1", "tool": "...", "amount": 1} a step in an open saga
    {"id": 4, "op": "close", "saga": "s1"}                          leave its scope
    {"id": 5, "op": "call", "tool": "wire.final", "semantics": "IRREVERSIBLE", "amount": 5}
    {"id": 6, "op": "status"}    the readers' state: reloads, data_lost, connected (switch, limits)

A "call" of an IRREVERSIBLE tool waits for a human (ApprovalGateway, RedisApprovalStore)
for APPROVAL_TIMEOUT seconds, or for the command's own ``"approval_timeout"``: a request a
test answers is given long enough for a loaded machine, one meant to expire a short one.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

from agent_process import Answer, serve  # tests/e2e (this script's directory)
from agent_saga import Compensation, FileWAL, saga_scope
from agent_saga.controls import (
    ApprovalGateway,
    ApprovalPolicy,
    KillSwitch,
    PreFlightGate,
    RedisApprovalStore,
    RedisLimitSource,
    RedisLimitStore,
    RedisSwitchStore,
)


async def main() -> None:
    url, namespace, wal_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 30.0
    grace = float(sys.argv[5]) if len(sys.argv) > 5 else 5.0
    wal_dir.mkdir(parents=True, exist_ok=True)
    wal = FileWAL(str(wal_dir / "agent.wal"))
    switch_store = RedisSwitchStore(url, grace=grace, heartbeat=0.2, namespaces=[namespace])
    switch_store.start()
    source = RedisLimitSource(url, namespaces=[namespace], heartbeat=0.5)
    source.start()
    limit_store, approval_store = RedisLimitStore(url), RedisApprovalStore(url)
    gates: dict[float, PreFlightGate] = {}

    def gate_for(deadline: float) -> PreFlightGate:
        """One gate per approval deadline, all over the same stores and WAL."""
        if deadline not in gates:
            gates[deadline] = PreFlightGate(
                limits=source,
                store=limit_store,
                checks=[KillSwitch(switch_store, wal=wal)],
                approval_provider=ApprovalGateway(approval_store, wal=wal, policy=ApprovalPolicy(timeout=deadline),
                                                  poll=0.1, namespace=namespace, agent=f"agent-{wal_dir.name}"),
            )
        return gates[deadline]

    gate = gate_for(timeout)
    open_sagas: dict[str, tuple[Any, Any, asyncio.Event, asyncio.Task[None]]] = {}

    async def step(saga: Any, cmd: dict[str, Any]) -> Any:
        semantics = cmd.get("semantics", "COMPENSABLE")
        amount = cmd.get("amount", 1)

        async def forward() -> dict[str, Any]:
            return {"id": f"tx-{cmd['id']}", "amount": amount}

        async def undo(tx: str) -> None:
            return None

        comp = None if semantics == "IRREVERSIBLE" else (
            lambda r: Compensation(fn=undo, handler="test.undo", kwargs={"tx": (r or {}).get("id", "?")}))
        return await saga.execute(cmd.get("tool", "wire.send"), semantics, forward, comp,
                                  policy_args={"amount": amount})

    async def run_open(name: str, tags: list[str], started: asyncio.Future[None], done: asyncio.Event) -> None:
        try:
            async with saga_scope(wal, gate, name=name, tags=tags) as saga:
                open_sagas[name] = (saga, None, done, asyncio.current_task())  # type: ignore[assignment]
                started.set_result(None)
                await done.wait()
        except BaseException as e:
            if not started.done():
                started.set_exception(e)
            else:
                open_sagas.pop(name, None)

    async def handle(cmd: dict[str, Any], answer: Answer) -> None:
        cid, op = cmd.get("id"), cmd.get("op")
        try:
            if op == "call":
                call_gate = gate_for(float(cmd.get("approval_timeout", timeout)))
                async with saga_scope(wal, call_gate, name=cmd.get("name", "call"), tags=cmd.get("tags", ())) as saga:
                    await step(saga, cmd)
                    saga_id = saga.saga_id
                await answer(cid, True, saga=saga_id)
            elif op == "open":
                started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                done = asyncio.Event()
                asyncio.create_task(run_open(cmd["saga"], list(cmd.get("tags", ())), started, done))
                await started
                await answer(cid, True, saga=open_sagas[cmd["saga"]][0].saga_id)
            elif op == "step":
                await step(open_sagas[cmd["saga"]][0], cmd)
                await answer(cid, True)
            elif op == "status":
                await answer(cid, True, switch={"reloads": switch_store.reloads, "data_lost": switch_store.data_lost,
                                                "connected": switch_store.connected},
                             limits={"reloads": source.reloads, "data_lost": source.data_lost,
                                     "connected": source.connected})
            elif op == "close":
                _, _, done, task = open_sagas.pop(cmd["saga"])
                done.set()
                with contextlib.suppress(Exception):
                    await task
                await answer(cid, True)
            else:
                await answer(cid, False, f"unknown op {op!r}", "Usage")
        except Exception as e:  # noqa: BLE001 - reported to the test
            await answer(cid, False, str(e), type(e).__name__)

    await serve(handle)


if __name__ == "__main__":
    asyncio.run(main())
