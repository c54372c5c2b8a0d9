"""A fleet on one policy plane, measured: N real agents against Redis, the operator and
the API server.

    PYTHONPATH=tests .venv/bin/python bench/fleet/fleet.py --agents 10,100,300 [--processes 4] [--out FILE]
    make bench-fleet                      (N = 10, 100, 300, 1000; JSON in bench/results/)

For each N: a fresh redis-server and operator (resync timer off: no trial is rescued by a
resync), a namespace on the local control plane (etcd + kube-apiserver, as the e2e tests
start it), and N agents packed into ``--processes`` worker processes (``worker.py``:
each agent wired by the environment as an agent pod is, with its own kill switch reader,
SagaPolicy reader, limits, approval gateway and heartbeat). Then:

    halt          KillSwitch ``kubectl apply`` -> every agent's kill switch refuses (per agent,
                  p50/p99 over agents x trials) and -> Acknowledged by all at that generation
    policy        SagaPolicy edit -> applied by all (Acknowledged at the new generation)
    budget        one BudgetLimit shared by the fleet, debited at the fleet's rate: authorised
                  <= cap, recorded >= authorised (never under-counted), debits/s, saga p99
    approvals     ``--approvals`` requests pending at once: mirrored into Approval objects,
                  ``kubectl get approvals`` timed, approved in bulk, every agent sees it
    costs         operator RSS and CPU, Redis memory and ops/s, worker CPU: per agent, in a
                  steady window with every agent beating and reading
    sizes         the largest status object written, the largest Redis key (MEMORY USAGE)

The machine (cores, load average before and after) is recorded with every N.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_saga.plane import DEFAULT_CHECK

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import _common  # noqa: E402
from sim import Fleet, summary  # noqa: E402

RESYNC_OFF = 3600


def redis_cpu(r: Any) -> float:
    """The server's CPU seconds so far (user + system)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def busiest(before: dict[str, Any], after: dict[str, Any], top: int = 4) -> dict[str, dict[str, float]]:
    """The commands that took the server's time between two ``INFO commandstats``: calls,
    seconds in all, microseconds per call (a script's commands count on their own too)."""
    rows = {}
    for k, v in after.items():
        calls = int(v["calls"]) - int(before.get(k, {}).get("calls", 0))
        usec = int(v["usec"]) - int(before.get(k, {}).get("usec", 0))
        if calls > 0:
            rows[k.removeprefix("cmdstat_")] = {"calls": calls, "s": round(usec / 1e6, 2),
                                                "us_per_call": round(usec / calls, 1)}
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["s"])[:top])


def proc_stat(pid: int) -> tuple[float, int]:
    """(CPU seconds, RSS KiB) of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return cpu, rss


def threads(pid: int) -> int:
    """Threads of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def largest_status(cluster: Any, ns: str) -> dict[str, Any]:
    from agent_saga_operator.models import GROUP, KINDS, VERSION
    from kubernetes import client

    api = client.CustomObjectsApi(cluster.api_client())
    best: dict[str, Any] = {"bytes": 0, "object": None}
    for m in KINDS:
        try:
            items = api.list_namespaced_custom_object(GROUP, VERSION, ns, m.info.plural)["items"]  # type: ignore[index]
        except Exception:  # noqa: BLE001 - a cluster-scoped kind
            continue
        for o in items:
            size = len(json.dumps(o.get("status") or {}, separators=(",", ":")))
            if size > best["bytes"]:
                best = {"bytes": size, "object": f"{m.info.kind}/{o['metadata']['name']}"}
    return best


def largest_redis(r: Any) -> dict[str, Any]:
    best: dict[str, Any] = {"bytes": 0, "key": None}
    for k in r.scan_iter(count=1000):
        size = r.memory_usage(k, samples=0) or 0
        if size > best["bytes"]:
            best = {"bytes": size, "key": k.decode(errors="replace")}
    return best


def steady(r: Any, pids: dict[str, list[int]], seconds: float) -> dict[str, Any]:
    """CPU seconds per second of each process group and Redis commands/s over ``seconds``."""
    before = {k: sum(proc_stat(p)[0] for p in ps) for k, ps in pids.items()}
    cmds = int(r.info("stats")["total_commands_processed"])
    time.sleep(seconds)  # a measuring window, not a wait for a condition
    after = {k: sum(proc_stat(p)[0] for p in ps) for k, ps in pids.items()}
    cmds2 = int(r.info("stats")["total_commands_processed"])
    out = {f"{k}_cpu_cores": round((after[k] - before[k]) / seconds, 3) for k in pids}
    out["redis_ops_per_s"] = round((cmds2 - cmds) / seconds, 1)
    return out


def run_n(cluster: Any, n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import redis
    from agent_saga_operator.testing import OperatorProcess
    from kubernetes import client

    load_before = machine()["loadavg"]
    url, redis_proc, redis_dir = _common.start_redis("bench-fleet-redis-")
    r = redis.Redis.from_url(url)
    r.config_set("maxclients", 16000)
    ns = f"fleet-{n}-{secrets.token_hex(2)}"
    client.CoreV1Api(cluster.api_client()).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    op = OperatorProcess(cluster.kubeconfig, url, work / f"operator-{n}.log", namespaces=[ns],
                         extra_args=["--standalone", "--health-host", "127.0.0.1", "--log-level", "WARNING",
                                     "--resync-interval", str(RESYNC_OFF)])
    fleet = None
    out: dict[str, Any] = {"agents": n, "processes": min(args.processes, n), "heartbeat_interval_s": args.heartbeat,
                           "plane_check_interval_s": args.check_interval or DEFAULT_CHECK}
    try:
        op.start()
        op.wait_ready(timeout=120)
        time.sleep(2)  # the operator's first steps: a baseline window, not a condition
        op_cpu0, op_rss0 = proc_stat(op.pid)
        m0 = r.info("memory")
        mem0, cl0, ds0 = int(m0["used_memory"]), int(m0["mem_clients_normal"]), int(m0["used_memory_dataset"])
        clients0 = len(r.client_list())  # the operator's and this script's
        t0 = time.monotonic()
        fleet = Fleet(url, ns, n, args.processes, work / f"fleet-{n}", heartbeat=args.heartbeat,
                      check_interval=args.check_interval)
        out["start_s"] = round(time.monotonic() - t0, 1)
        # the first trial (a SagaPolicy create) proves every agent is counted by the operator
        fleet.policy_trial(cluster, 0, timeout=args.timeout)
        costs = steady(r, {"operator": [op.pid], "workers": fleet.pids()}, args.window)
        op_cpu1, op_rss1 = proc_stat(op.pid)
        m1 = r.info("memory")
        mem1, cl1, ds1 = int(m1["used_memory"]), int(m1["mem_clients_normal"]), int(m1["used_memory_dataset"])
        clients = len(r.client_list())
        out["costs"] = {
            **costs,
            "operator_rss_kb": op_rss1, "operator_rss_growth_kb": op_rss1 - op_rss0,
            "operator_rss_per_agent_kb": round((op_rss1 - op_rss0) / n, 2),
            "operator_cpu_per_agent_ms_per_s": round(costs["operator_cpu_cores"] * 1000 / n, 3),
            "worker_cpu_per_agent_ms_per_s": round(costs["workers_cpu_cores"] * 1000 / n, 3),
            "worker_rss_kb": sum(proc_stat(p)[1] for p in fleet.pids()),
            # every thread of the worker processes (their 64-thread I/O pool included)
            "worker_threads_per_agent": round(sum(threads(p) for p in fleet.pids()) / n, 2),
            "redis_memory_per_agent_bytes": round((mem1 - mem0) / n, 1),
            # the documents the agents keep (heartbeats, parts) vs their connections' buffers
            "redis_data_per_agent_bytes": round(((mem1 - cl1) - (mem0 - cl0)) / n, 1),
            "redis_dataset_per_agent_bytes": round((ds1 - ds0) / n, 1),
            "redis_client_buffers_per_agent_bytes": round((cl1 - cl0) / n, 1),
            "redis_ops_per_s_per_agent": round(costs["redis_ops_per_s"] / n, 2),
            "redis_connected_clients": clients,
            "redis_clients_before_agents": clients0,
            # CLIENT LIST with every agent connected, less the operator's and this script's
            "redis_connections_per_agent": round((clients - clients0) / n, 2),
        }
        def measure(key: str, fn: Any) -> None:
            """One measurement; a failure (a trial past --timeout, an API server that timed
            out on a starved machine) is recorded, not fatal: the other rows still count."""
            try:
                out.update(fn())
            except Exception as e:  # noqa: BLE001 - recorded in the JSON with its type
                out[key] = {"error": f"{type(e).__name__}: {str(e)[:1000]}"}

        def halt() -> dict[str, Any]:
            halts = [fleet.halt_trial(cluster, i, timeout=args.timeout) for i in range(args.trials)]
            refused = [x for h in halts for x in h["refused_ms"]]
            return {"halt_until_every_agent_refuses": {**summary([max(h["refused_ms"]) for h in halts]),
                                                       "per_agent": summary(refused)},
                    "halt_until_acknowledged": summary([h["acknowledged_ms"] for h in halts])}

        def policy() -> dict[str, Any]:
            return {"sagapolicy_edit_until_applied_by_all": summary(
                [fleet.policy_trial(cluster, i, timeout=args.timeout) for i in range(1, args.trials + 1)])}

        def budget() -> dict[str, Any]:
            cap = max(10.0, round(n * args.rate * args.budget_seconds * 0.5))
            # where the run's CPU went: Redis, the operator, the workers (the whole run:
            # the BudgetLimit's apply, every agent holding it, the debits)
            def cpu() -> dict[str, float]:
                return {"redis": redis_cpu(r), "operator": proc_stat(op.pid)[0],
                        "workers": sum(proc_stat(p)[0] for p in fleet.pids())}

            cpu0, cmd0, t0 = cpu(), r.info("commandstats"), time.monotonic()
            b = fleet.budget(cluster, cap=cap, rate=args.rate, seconds=args.budget_seconds, timeout=args.timeout)
            wall = time.monotonic() - t0
            cpu1, cmd1 = cpu(), r.info("commandstats")
            b["exact"] = b["authorised"] <= b["cap"] and b["recorded"] >= b["authorised"]
            b["run_s"] = round(wall, 1)
            b["cpu_cores"] = {k: round((cpu1[k] - cpu0[k]) / wall, 2) for k in cpu1}
            b["redis_busiest"] = busiest(cmd0, cmd1)
            return {"budget": b}

        measure("halt_until_every_agent_refuses", halt)
        measure("sagapolicy_edit_until_applied_by_all", policy)
        measure("budget", budget)
        if args.approvals:
            measure("approvals", lambda: {"approvals": fleet.approvals(cluster, args.approvals,
                                                                       timeout=args.timeout * 10)})
        out["largest_status_object"] = largest_status(cluster, ns)
        out["largest_redis_key"] = largest_redis(r)
        out["operator_rss_kb_end"] = proc_stat(op.pid)[1]
        out["operator_cpu_s_total"] = round(proc_stat(op.pid)[0] - op_cpu0, 2)
    finally:
        if fleet is not None:
            fleet.close()
        op.stop()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        shutil.rmtree(redis_dir, ignore_errors=True)
        client.CoreV1Api(cluster.api_client()).delete_namespace(ns)
    out["loadavg_before"] = load_before
    out["loadavg_after"] = machine()["loadavg"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default="10,100,300,1000", help="comma-separated fleet sizes")
    ap.add_argument("--processes", type=int, default=4, help="worker processes the agents are packed into")
    ap.add_argument("--trials", type=int, default=5, help="KillSwitch and SagaPolicy trials per N")
    ap.add_argument("--rate", type=float, default=0.5, help="sagas per second per agent (the budget run)")
    ap.add_argument("--budget-seconds", type=float, default=10.0)
    ap.add_argument("--approvals", type=int, default=500, help="approval requests pending at once (0: skip)")
    ap.add_argument("--heartbeat", type=float, default=2.0, help="AGENT_SAGA_HEARTBEAT_INTERVAL of the agents")
    ap.add_argument("--check-interval", type=float, default=None,
                    help="AGENT_SAGA_PLANE_CHECK_INTERVAL of the agents (default: theirs, "
                         f"{DEFAULT_CHECK:g} s)")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of the steady cost window")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--kubeconfig", help="an existing cluster (default: start the local control plane)")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    cp = None
    result: dict[str, Any] = {"bench": "fleet", "machine": machine(), "runs": []}
    try:
        cluster, cp = _common.kube_cluster(args.kubeconfig, work)
        for n in (int(x) for x in args.agents.split(",")):
            run = run_n(cluster, n, args, work)
            result["runs"].append(run)
            print(json.dumps(run), flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if cp is not None:
            cp.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["machine"]["loadavg_end"] = machine()["loadavg"]
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
