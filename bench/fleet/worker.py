"""One process of the fleet simulator: many real agents, each wired as an agent pod is.

    python bench/fleet/worker.py    (driven by bench/fleet/fleet.py over stdin/stdout)

The first command, ``start``, names the agents (``pods``) and the environment every one
of them gets (``env``: AGENT_SAGA_REDIS_URL, AGENT_SAGA_NAMESPACE, AGENT_SAGA_AGENT, ...,
plus its own POD_NAME). Each agent is ``open_plane(env)``: its own kill switch reader,
SagaPolicy reader, limit source and store, approval gateway and heartbeat, exactly the
controls ``AGENT_SAGA_REDIS_URL`` gives a pod, and an ``AgentKit`` gated by them. The
agents share this process's event loop (their sagas are asyncio tasks) and one WAL file
(the log is local to a pod and is not what the simulator measures).

Commands (JSON lines; answers as ``tests/e2e/agent_process.py`` writes them):

    start      {pods, env, wal}                 build the agents
    arm        {tool}                           note when each agent's kill switch first refuses ``tool``
    refused    {tool, timeout}                  wait until every agent refuses it: {"at": [epoch s, ...]}
    call       {tool, amount}                   one saga per agent: {"ok": n, "refused": {kind: n}}
    loop       {rate, amount, seconds}          each agent runs sagas of ``wire.send`` at ``rate``/s:
                                                {"authorised", "debits", "refused", "latency_ms"}
    approve    {count, timeout}                 ``count`` IRREVERSIBLE sagas wait for a human at once:
                                                {"approved", "denied", "other"} once every one is decided
    limit      {name, timeout}                  wait until every agent's limit source holds the BudgetLimit ``name``
    usage      {}                               the BudgetLimit windows as the first agent's gate reads them
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "tests" / "e2e")]

from agent_process import Answer, serve  # noqa: E402
from agent_saga import AgentKit, compensator  # noqa: E402
from agent_saga.gates import StepRequest  # noqa: E402
from agent_saga.plane import open_plane  # noqa: E402
from agent_saga.semantics import ActionSemantics  # noqa: E402


@compensator("fleet.refund")
async def refund(charge: str) -> None:
    return None


async def _send(amount: float = 0, **_: Any) -> dict[str, Any]:
    return {"id": f"tx-{amount}", "amount": amount}


class Agent:
    """One agent: its plane connection, its kit, and what its probe saw."""

    def __init__(self, env: dict[str, str], wal: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.pod = env["POD_NAME"]
        self.conn = open_plane(env, wal=wal)
        self.kit = AgentKit(name=env["AGENT_SAGA_AGENT"], wal=wal, gate=self.conn.gate())
        comp = lambda r: {"handler": "fleet.refund", "kwargs": {"charge": r["id"]}}  # noqa: E731
        self.tools = {
            "wire.send": self.kit.safe_tool(_send, semantics="COMPENSABLE", compensate=comp, name="wire.send"),
            "sms.send": self.kit.safe_tool(_send, semantics="IRREVERSIBLE", name="sms.send"),
        }
        self.loop = loop
        self.armed: str | None = None
        self.refused_at: float | None = None
        self.seen = asyncio.Event()
        self.conn.switch_store.add_listener(self._read)

    # the kill switch's reader thread: after every read of the levers
    def _read(self) -> None:
        if self.armed is not None and self.refused_at is None:
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._probe()))

    async def _probe(self) -> None:
        tool = self.armed
        if tool is None or self.refused_at is not None:
            return
        req = StepRequest("fleet-probe", "fleet-probe/0", tool, ActionSemantics.REVERSIBLE)
        if await self.conn.kill_switch.check(req) is not None:
            self.refused_at = time.time()
            self.seen.set()

    def arm(self, tool: str) -> None:
        self.armed, self.refused_at = tool, None
        self.seen.clear()
        self.loop.create_task(self._probe())  # already refusing: seen at once

    async def call(self, tool: str, amount: float) -> str:
        """One saga of one step: "" if it ran, else the refusal's type."""
        fn = self.tools.get(tool) or self.kit.safe_tool(_send, semantics="REVERSIBLE", name=tool)
        self.tools[tool] = fn
        try:
            async with self.kit.transaction():
                await fn(amount=amount)
        except Exception as e:  # noqa: BLE001 - counted by kind
            by = getattr(e, "decided_by", "")
            return type(e).__name__ + (f":{by}" if by else "")
        return ""


class Worker:
    def __init__(self) -> None:
        self.agents: list[Agent] = []

    async def start(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from agent_saga.wal import FileWAL

        wal = FileWAL(cmd["wal"], sync=False)
        loop = asyncio.get_running_loop()
        for pod in cmd["pods"]:
            env = {**cmd["env"], "POD_NAME": pod}
            self.agents.append(await asyncio.to_thread(Agent, env, wal, loop))
        return {"agents": len(self.agents)}

    async def refused(self, cmd: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(asyncio.gather(*(a.seen.wait() for a in self.agents)), cmd.get("timeout", 60))
        return {"at": [a.refused_at for a in self.agents]}

    async def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        outcomes = await asyncio.gather(*(a.call(cmd["tool"], cmd.get("amount", 1)) for a in self.agents))
        refused: dict[str, int] = {}
        for o in outcomes:
            if o:
                refused[o] = refused.get(o, 0) + 1
        return {"ran": sum(1 for o in outcomes if not o), "refused": refused}

    async def loop(self, cmd: dict[str, Any]) -> dict[str, Any]:
        rate, amount, seconds = float(cmd["rate"]), float(cmd["amount"]), float(cmd["seconds"])
        latencies: list[float] = []
        refused: dict[str, int] = {}
        authorised = [0.0, 0]
        end = time.monotonic() + seconds

        async def run(a: Agent) -> None:
            await asyncio.sleep(random.random() / rate)  # spread over one period: no herd at t=0
            while time.monotonic() < end:
                t0 = time.perf_counter()
                why = await a.call("wire.send", amount)
                latencies.append((time.perf_counter() - t0) * 1000)
                if why:
                    refused[why] = refused.get(why, 0) + 1
                else:
                    authorised[0] += amount
                    authorised[1] += 1
                await asyncio.sleep(max(0.0, 1 / rate - (time.perf_counter() - t0)))

        await asyncio.gather(*(run(a) for a in self.agents))
        return {"authorised": authorised[0], "ran": authorised[1], "refused": refused, "latency_ms": latencies}

    async def approve(self, cmd: dict[str, Any]) -> dict[str, Any]:
        count = int(cmd["count"])
        chosen = [self.agents[i % len(self.agents)] for i in range(count)]
        outcomes = await asyncio.wait_for(asyncio.gather(*(a.call("sms.send", 1) for a in chosen)),
                                          cmd.get("timeout", 600))
        approved = sum(1 for o in outcomes if not o)
        return {"approved": approved, "other": {o: outcomes.count(o) for o in set(outcomes) if o}}

    async def limit(self, cmd: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + float(cmd.get("timeout", 60))
        while not all(any(lim.name.endswith(cmd["name"]) for lim in a.conn.limit_source.snapshot().limits)
                      for a in self.agents):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every agent holds the BudgetLimit {cmd['name']}")
            await asyncio.sleep(0.05)
        return {}

    async def usage(self, cmd: dict[str, Any]) -> dict[str, Any]:
        rows = await self.agents[0].kit.gate.usage()  # type: ignore[union-attr]  # the kit's PreFlightGate
        return {"windows": [{"limit": u.name, "key": u.key, "used": u.used, "entries": u.entries} for u in rows]}

    async def close(self, cmd: dict[str, Any]) -> dict[str, Any]:
        await asyncio.gather(*(asyncio.to_thread(a.conn.close) for a in self.agents))
        return {"closed": len(self.agents)}


#: The GIL switch interval of a worker process (CPython's default: 5 ms). A worker packs
#: hundreds of agents, each with its plane watcher and heartbeat threads, behind one GIL,
#: which no pod does: when one notification wakes them all, every thread waiting for the
#: GIL asks the holder to drop it each interval, and with the default the process spends
#: the wave handing the GIL around (1,000 agents in one process: 1.3-2.4 million context
#: switches and 15-25 CPU-seconds for one halt, 7-13 s until all refused; at 50 ms,
#: 0.16-0.18 million, 4-4.5 CPU-seconds and 2.5-3.5 s: bench/fleet/wave.py). Threads
#: still give the GIL up at once when they wait for Redis.
SWITCH_INTERVAL = 0.05


async def main() -> None:
    from concurrent.futures import ThreadPoolExecutor

    sys.setswitchinterval(SWITCH_INTERVAL)

    # Each pod has its own threads for the controls' blocking reads (an approval waiter's
    # poll, a first start): a pool as large as a few pods', not one pod's six threads
    # shared by hundreds of agents.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(64, thread_name_prefix="fleet-io"))
    w = Worker()

    async def handle(cmd: dict[str, Any], answer: Answer) -> None:
        cid = cmd.get("id")
        try:
            op = cmd["op"]
            if op == "arm":
                for a in w.agents:
                    a.arm(cmd["tool"])
                await answer(cid, True)
                return
            result = await getattr(w, op)(cmd)
            await answer(cid, True, **result)
        except Exception as e:  # noqa: BLE001 - reported to the driver
            await answer(cid, False, f"{type(e).__name__}: {e}", type(e).__name__)

    await serve(handle)


if __name__ == "__main__":
    asyncio.run(main())
