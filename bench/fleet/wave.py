"""One worker process's halt wave, without the API server: where the time goes.

    python bench/fleet/wave.py --agents 250 [--trials 3] [--heartbeat 10] [--no-heartbeat] [--switch-interval S] [--turns K]

Builds ``--agents`` agents in this process exactly as ``bench/fleet/worker.py`` does
(``open_plane`` each, one shared FileWAL, the worker's probe), against a throwaway
redis-server, then per trial projects a KillSwitch the way the operator does (its
``Projector.LUA_PUT``: document, INCR rev, PUBLISH) and times, from that write:

    applied    each agent's kill switch reader holds the lever (a listener on its watcher thread)
    refused    the worker's probe (``kill_switch.check`` on the event loop) refuses the tool
    beat       the agent's heartbeat has written the applied change (what Acknowledged reads)

and, over the wave, the CPU of each kind of thread (``/proc/self/task/*/schedstat``),
the context switches and the Redis commands (``INFO commandstats``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (HERE, ROOT / "bench", ROOT / "runtime", ROOT / "operator", ROOT / "tests" / "e2e"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from _common import start_redis  # noqa: E402
from worker import Worker  # noqa: E402

NS = "fleet"


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1) if s else float("nan")


def threads() -> dict[str, tuple[float, int]]:
    """Per thread kind (its Python name without the number): (CPU seconds, context switches) so far."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for task in Path("/proc/self/task").iterdir():
        try:
            name = names.get(int(task.name)) or (task / "comm").read_text().strip()
            name = name.split(" (")[0]
            cpu = int((task / "schedstat").read_text().split()[0]) / 1e9
            status = (task / "status").read_text()
        except OSError:
            continue
        cs = sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)
        kind = name.rstrip("0123456789_-") or name
        out[kind][0] += cpu
        out[kind][1] += cs
    return {k: (v[0], int(v[1])) for k, v in out.items()}


def loads(w: Worker) -> dict[str, int]:
    """Reads made by each kind of reader of every agent, and heartbeats written."""
    return {"killswitch": sum(a.conn.switch_store.reloads for a in w.agents),
            "sagapolicy": sum(a.conn.policy.reloads for a in w.agents),
            "budgetlimit": sum(a.conn.limit_source.reloads for a in w.agents),
            "beats": sum(a.conn.heartbeat.beats for a in w.agents if a.conn.heartbeat is not None)}


def commandstats(client: Any) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client.info("commandstats").items()}


def projection(client: Any, tool: str, name: str) -> Any:
    """A call writing the KillSwitch ``name`` halting ``tool`` as the operator projects it."""
    from agent_saga_operator.documents import Identity, killswitch_doc
    from agent_saga_operator.models.killswitch import KillSwitchSpec
    from agent_saga_operator.projection import Keys, Projector, _canonical

    spec = KillSwitchSpec.model_validate({"action": "Halt", "scope": {"tool": tool}, "reason": "fleet bench",
                                          "requestedBy": "bench@corp"})
    who = Identity(NS, name, f"uid-{name}", 1, datetime.now(UTC))
    keys = Keys("agentsaga")
    doc = killswitch_doc(spec, who)
    return lambda: client.eval(Projector.LUA_PUT, 3, keys.doc("killswitch", who.id), keys.index("killswitch"), keys.rev,
                who.id, _canonical(doc), keys.channel, Projector._notification("KillSwitch", who.id, "put"))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import redis

    url, proc, _ = start_redis("fleet-wave-")
    client = redis.Redis.from_url(url)
    client.sadd("agentsaga:v1:namespaces", NS)
    work = Path(tempfile.mkdtemp(prefix="fleet-wave-"))
    env = {"AGENT_SAGA_REDIS_URL": url, "AGENT_SAGA_NAMESPACE": NS, "AGENT_SAGA_AGENT": "fleet-agent",
           "AGENT_SAGA_HEARTBEAT_INTERVAL": str(args.heartbeat)}
    os.environ["AGENT_SAGA_SINGLE_PROCESS"] = "1"
    from concurrent.futures import ThreadPoolExecutor

    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(64, thread_name_prefix="fleet-io"))
    w = Worker()
    t = time.monotonic()
    await w.start({"pods": [f"fleet-{i:05d}" for i in range(args.agents)], "env": env, "wal": str(work / "w.wal")})
    started = time.monotonic() - t
    if args.no_heartbeat:
        for a in w.agents:
            if a.conn.heartbeat is not None:
                a.conn.heartbeat.close()
    trials = []
    for i in range(args.trials):
        tool, name = f"fleet.halt-{i}", f"halt-{i}"
        applied: dict[int, float] = {}
        beat: dict[int, float] = {}
        all_beat = asyncio.Event()
        loop = asyncio.get_running_loop()
        all_done = lambda e=all_beat, lp=loop: lp.call_soon_threadsafe(e.set)  # noqa: E731

        def on_read(k: int, store: Any, lever: str = f"{NS}/{name}", applied: dict[int, float] = applied) -> None:
            if k not in applied and any(lv.id == lever for lv in store.view().levers):
                applied[k] = time.time()

        for k, a in enumerate(w.agents):
            a.conn.switch_store._listeners.insert(0, lambda k=k, s=a.conn.switch_store, f=on_read: f(k, s))
            hb = a.conn.heartbeat
            if hb is not None and not args.no_heartbeat:
                real = type(hb).beat.__get__(hb)

                def wrapped(k: int = k, real: Any = real, beat: dict[int, float] = beat, done: Any = all_done) -> bool:
                    changed = real()
                    if changed and k not in beat:
                        beat[k] = time.time()
                        if len(beat) == len(w.agents):
                            done()
                    return bool(changed)
                hb.beat = wrapped  # type: ignore[method-assign]
            a.arm(tool)
        await asyncio.sleep(0.5)  # the arm probes ran
        write = projection(client, tool, name)
        cpu0, cmd0, loads0 = threads(), commandstats(client), loads(w)
        t0 = time.time()
        write()
        at = (await w.refused({"tool": tool, "timeout": 120}))["at"]
        refused_done = time.time()
        if not args.no_heartbeat:
            await asyncio.wait_for(all_beat.wait(), 60)
        wall = time.time() - t0
        await asyncio.sleep(args.settle)  # what the wave leaves for the next backstop tick
        cpu1, cmd1 = threads(), commandstats(client)
        cpu = {k: round((cpu1[k][0] - cpu0.get(k, (0.0, 0))[0]) * 1000, 1) for k in cpu1}
        cs = {k: cpu1[k][1] - cpu0.get(k, (0.0, 0))[1] for k in cpu1}
        trials.append({
            "applied_ms": {"p50": pct([(v - t0) * 1000 for v in applied.values()], 0.5),
                           "max": pct([(v - t0) * 1000 for v in applied.values()], 1.0), "n": len(applied)},
            "refused_ms": {"p50": pct([(v - t0) * 1000 for v in at], 0.5), "max": round((refused_done - t0) * 1000, 1)},
            "beat_ms": {"p50": pct([(v - t0) * 1000 for v in beat.values()], 0.5),
                        "max": pct([(v - t0) * 1000 for v in beat.values()], 1.0), "n": len(beat)},
            "wall_s": round(wall, 2),
            "loads_and_beats": {k: v - loads0[k] for k, v in loads(w).items()},
            "cpu_ms": {k: v for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 1},
            "ctx_switches": {k: v for k, v in sorted(cs.items(), key=lambda kv: -kv[1]) if v >= 10},
            "redis_calls": {k: cmd1[k] - cmd0.get(k, 0) for k in cmd1 if cmd1[k] - cmd0.get(k, 0) > 2},
        })
        for a in w.agents:
            a.conn.switch_store._listeners.pop(0)
        await asyncio.sleep(1.0)
    await w.close({})
    proc.kill()
    return {"agents": args.agents, "heartbeat": args.heartbeat, "no_heartbeat": args.no_heartbeat,
            "switchinterval": sys.getswitchinterval(), "start_s": round(started, 1), "trials": trials,
            "threads": threading.active_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=250)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--heartbeat", type=float, default=10.0)
    ap.add_argument("--no-heartbeat", action="store_true")
    ap.add_argument("--settle", type=float, default=1.5, help="seconds counted after the last beat")
    ap.add_argument("--switch-interval", type=float, default=None)
    ap.add_argument("--turns", type=int, default=0, help="experiment: a process-wide bound on plane reads and beats")
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.turns:  # an experiment: at most this many of the process's plane reads and beats at once
        from agent_saga.controls._planewatch import PlaneWatcher
        from agent_saga.heartbeat import HeartbeatWriter

        sem = threading.BoundedSemaphore(args.turns)
        for cls, name in ((PlaneWatcher, "_load"), (PlaneWatcher, "_backstop"), (HeartbeatWriter, "beat")):
            method = getattr(cls, name)

            def turn(self: Any, *a: Any, real: Any = method, **kw: Any) -> Any:
                with sem:
                    return real(self, *a, **kw)
            setattr(cls, name, turn)
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()
