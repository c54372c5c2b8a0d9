"""Acknowledgement: how long until every agent applies a lever, as status reports it.

    PYTHONPATH=tests .venv/bin/python bench/bench_acks.py [--agents 10] [--trials 100] [--kubeconfig PATH] [--json]

Starts a throwaway redis-server, the local control plane (etcd + kube-apiserver built by
hack/, as the e2e tests do; or --kubeconfig), the operator, and ``--agents`` agent
processes wired by the environment alone (``tests/e2e/plane_agent.py``: AGENT_SAGA_REDIS_URL,
AGENT_SAGA_NAMESPACE, AGENT_SAGA_AGENT), each keeping its heartbeat.

Targets (the policy plane governs):
    `kubectl apply` of a KillSwitch returns -> status Acknowledged by all N     p50, p99; p99 <= 1 s
    SagaPolicy edit (`kubectl apply`) returns -> applied by all N (Acknowledged
    at the new generation)                                                     p50, p99; p99 <= 1 s

A trial applies the resource with kubectl and, from the moment kubectl returns, watches
the object (a Kubernetes watch, no polling interval) until ``Acknowledged=True`` at the
new generation with ``acknowledged == N``. The operator runs with its resync timer off
(``--resync-interval 3600``): a status only the timer would correct fails the run (a trial
waits at most ``--timeout`` seconds), so no trial is rescued by a resync. What is measured is what an operator waiting
with ``kubectl wait --for=condition=Acknowledged`` sees: projection, every agent's
reader, every heartbeat, the operator's tally and its status patch. A bare ``kubectl
get`` is reported for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "runtime"), str(ROOT / "operator")]

import _common  # noqa: E402

AGENT = ROOT / "tests" / "e2e" / "plane_agent.py"


def start_agents(url: str, ns: str, n: int, work: Path) -> list[subprocess.Popen[str]]:
    procs = []
    for i in range(n):
        d = work / f"agent-{i}"
        d.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
        env.update({"AGENT_SAGA_REDIS_URL": url, "AGENT_SAGA_NAMESPACE": ns, "AGENT_SAGA_AGENT": "bench-agent",
                    "POD_NAME": f"bench-{i}", "AGENT_SAGA_WAL_PATH": str(d / "agent.wal"),
                    "PYTHONPATH": str(ROOT / "runtime")})
        procs.append(subprocess.Popen([sys.executable, str(AGENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=open(d / "stderr", "wb"), text=True, env=env, cwd=d))  # noqa: SIM115
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if '"ready"' not in line:
            sys.exit(f"an agent did not start: {line!r}")
    return procs


def acknowledged_by(obj: dict[str, Any], n: int, generation: int) -> bool:
    st = obj.get("status") or {}
    for c in st.get("conditions") or ():
        if c["type"] == "Acknowledged":
            return (c["status"] == "True" and c.get("observedGeneration") == generation
                    and (st.get("agents") or {}).get("acknowledged") == n)
    return False


#: The operator's resync interval in the bench: longer than any run, so it never fires.
RESYNC_OFF = 3600


def wait_acked(api: Any, ns: str, plural: str, name: str, n: int, generation: int, timeout: float = 30) -> float:
    """Watch ``name`` until acknowledged by ``n`` agents at ``generation``: the wall time."""
    from agent_saga_operator.models import GROUP, VERSION
    from kubernetes import watch

    obj = api.get_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
    if acknowledged_by(obj, n, generation):
        return time.time()
    w = watch.Watch()  # type: ignore[no-untyped-call]  # the kubernetes client is untyped
    deadline = time.monotonic() + timeout
    for ev in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, ns, plural,  # type: ignore[no-untyped-call]
                       field_selector=f"metadata.name={name}", resource_version=obj["metadata"]["resourceVersion"],
                       timeout_seconds=int(timeout)):
        if acknowledged_by(ev["object"], n, generation):
            w.stop()  # type: ignore[no-untyped-call]
            return time.time()
        if time.monotonic() > deadline:
            break
    sys.exit(f"{plural}/{name} not acknowledged by {n} agents at generation {generation} within {timeout}s: "
             f"only a resync (off in this bench) would have corrected its status; last: "
             f"{json.dumps(api.get_namespaced_custom_object(GROUP, VERSION, ns, plural, name).get('status') or {})}")


def trial(cluster: Any, api: Any, ns: str, manifest: dict[str, Any], plural: str, n: int, timeout: float) -> float:
    from agent_saga_operator.models import GROUP, VERSION

    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))
    returned = time.time()
    gen = int(api.get_namespaced_custom_object(GROUP, VERSION, ns, plural, manifest["metadata"]["name"])
              ["metadata"]["generation"])
    return (wait_acked(api, ns, plural, manifest["metadata"]["name"], n, gen, timeout) - returned) * 1000


def summary(ms: list[float]) -> dict[str, Any]:
    return {"trials": len(ms), "p50_ms": round(_common.pct(ms, 0.5), 1), "p90_ms": round(_common.pct(ms, 0.9), 1),
            "p99_ms": round(_common.pct(ms, 0.99), 1), "max_ms": round(max(ms), 1),
            "over_1s": sum(1 for m in ms if m > 1000)}


def run(cluster: Any, url: str, ns: str, n: int, trials: int, work: Path, timeout: float = 30) -> dict[str, Any]:
    from agent_saga_operator.models import API_VERSION
    from kubernetes import client

    api = client.CustomObjectsApi(cluster.api_client())
    agents = start_agents(url, ns, n, work)
    ks_ms, sp_ms, kubectl_ms = [], [], []
    try:
        for i in range(trials):
            ks = {"apiVersion": API_VERSION, "kind": "KillSwitch", "metadata": {"name": f"halt-{i}"},
                  "spec": {"action": "Halt", "scope": {"tool": "wire.send"}, "reason": "bench",
                           "requestedBy": "bench@corp"}}
            ks_ms.append(trial(cluster, api, ns, ks, "killswitches", n, timeout))
            cluster.kubectl("delete", "-n", ns, "killswitch", f"halt-{i}", "--wait=false")
        for i in range(trials + 1):  # a create, then ``trials`` edits
            spec = {"mode": "Enforce", "undeclaredTools": "Allow",
                    "tools": {"search_docs": {"semantics": "REVERSIBLE"}},
                    "rules": [{"name": "big", "argExceeds": {"arg": "amount", "threshold": 1000 + i}}]}
            sp_ms.append(trial(cluster, api, ns, {"apiVersion": API_VERSION, "kind": "SagaPolicy",
                                                  "metadata": {"name": "bench-policy"}, "spec": spec},
                               "sagapolicies", n, timeout))
        for _ in range(10):
            t = time.perf_counter()
            cluster.kubectl("get", "killswitches", "-n", ns)
            kubectl_ms.append((time.perf_counter() - t) * 1000)
    finally:
        for p in agents:
            p.kill()
            p.communicate()
    return {"agents": n, "killswitch_apply_to_acknowledged_by_all": summary(ks_ms),
            # the first SagaPolicy trial is a create, the others edits (a new generation each)
            "sagapolicy_edit_to_applied_by_all": summary(sp_ms[1:] or sp_ms),
            "bare_kubectl_get_p50_ms": round(_common.pct(kubectl_ms, 0.5), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--trials", type=int, default=100, help="trials per kind (at least 100 for a p99)")
    ap.add_argument("--timeout", type=float, default=30.0,
                    help="seconds a trial may wait; longer fails the run (the resync timer is off)")
    ap.add_argument("--kubeconfig", help="an existing cluster (default: start the local control plane)")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args()

    from agent_saga_operator.testing import OperatorProcess
    from kubernetes import client

    work = Path(tempfile.mkdtemp(prefix="bench-acks-"))
    url, redis_proc, redis_dir = _common.start_redis("bench-acks-redis-")
    cp = None
    try:
        cluster, cp = _common.kube_cluster(args.kubeconfig, work)
        ns = f"bench-{secrets.token_hex(3)}"
        client.CoreV1Api(cluster.api_client()).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        op = OperatorProcess(cluster.kubeconfig, url, work / "operator.log", namespaces=[ns],
                             extra_args=["--standalone", "--health-host", "127.0.0.1", "--log-level", "WARNING",
                                         "--resync-interval", str(RESYNC_OFF)])
        with op:
            op.wait_ready()
            result = run(cluster, url, ns, args.agents, args.trials, work, args.timeout)
        client.CoreV1Api(cluster.api_client()).delete_namespace(ns)
        cluster.close()
    finally:
        if cp is not None:
            cp.stop()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        shutil.rmtree(redis_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    ks, sp = result["killswitch_apply_to_acknowledged_by_all"], result["sagapolicy_edit_to_applied_by_all"]
    result["targets"] = {
        "killswitch_acknowledged_by_all_p99_ms": {"value": ks["p99_ms"], "target": 1000.0, "ok": ks["p99_ms"] <= 1000},
        "sagapolicy_applied_by_all_p99_ms": {"value": sp["p99_ms"], "target": 1000.0, "ok": sp["p99_ms"] <= 1000},
    }
    result = {"bench": "acks", "python": sys.version.split()[0], "resync_interval_s": RESYNC_OFF, **result}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.agents} agents, resync off{'':20} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'>1 s':>5}")
    for label, s in (("KillSwitch apply -> Acknowledged by all", ks), ("SagaPolicy edit -> applied by all", sp)):
        print(f"{label:42} {s['trials']:>4} {s['p50_ms']:>8.1f} {s['p90_ms']:>8.1f} {s['p99_ms']:>8.1f} "
              f"{s['max_ms']:>8.1f} {s['over_1s']:>5}")
    print(f"{'(scale: a bare kubectl get, p50)':42} {'':>4} {result['bare_kubectl_get_p50_ms']:>8.1f}")
    for name, t in result["targets"].items():
        print(f"target {name}: {t['value']} (goal {t['target']}){'  OK' if t['ok'] else '  MISSED'}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
