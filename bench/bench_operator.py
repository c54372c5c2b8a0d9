"""The operator, end to end: kubectl -> API server -> operator -> Redis -> a running agent.

    PYTHONPATH=tests .venv/bin/python bench/bench_operator.py [--trials 50] [--limits 1000] [--kubeconfig PATH] [--json]

Starts a throwaway redis-server and the local control plane (etcd + kube-apiserver built
by hack/, as the e2e tests do; or uses --kubeconfig), installs the CRDs, and runs
``python -m agent_saga_operator`` on one fresh namespace.

Targets:
    kill switch: `kubectl apply -f killswitch.yaml` returning -> a running agent
    process refusing its next call                      p50, p99 over >= 50 trials; p99 <= 500 ms
    1,000 BudgetLimit objects created -> all projected (in Redis) and their status written
    (Synced=True at their generation; no agent runs here, so Ready stays False, NoConsumer)

The propagation trial: a child process (the agent) calls ``KillSwitch.check`` about once
a millisecond through a ``RedisSwitchStore`` and prints the wall time of the first call
whose answer changed. This process runs ``kubectl apply -f examples/k8s/killswitch.yaml``
and measures from the moment kubectl returns (also reported: from the moment kubectl was
started, which adds kubectl's own start-up) to the agent's first refusal; then
``kubectl delete`` lifts it and the agent's resume is timed the same way. Same host,
same clock. Reported with a bare Redis PING and a bare ``kubectl get`` for scale.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "runtime"), str(ROOT / "operator")]

import _common  # noqa: E402
from bench_killswitch import AGENT, bare_ping, histogram, pct, start_redis  # noqa: E402

KILLSWITCH_YAML = ROOT / "examples" / "k8s" / "killswitch.yaml"


def in_namespace(example: Path, ns: str, where: Path) -> Path:
    """A copy of ``example`` whose ``metadata.namespace`` is ``ns`` (the examples name the
    namespace the docs install into; kubectl refuses ``-n`` with another one)."""
    text, n = re.subn(r"^(\s+namespace:\s*)\S+", rf"\g<1>{ns}", example.read_text(), count=1, flags=re.M)
    if n != 1:
        sys.exit(f"{example} names no metadata.namespace to replace")
    where.write_text(text)
    return where


def bench_killswitch(cluster: Any, ns: str, url: str, trials: int) -> dict[str, Any]:
    manifest = in_namespace(KILLSWITCH_YAML, ns, Path(tempfile.mkdtemp(prefix="bench-operator-")) / "killswitch.yaml")
    agent = subprocess.Popen([sys.executable, "-c", AGENT, url, str(ROOT / "runtime")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, bufsize=1)
    halt_ms: list[float] = []
    halt_from_start_ms: list[float] = []
    lift_ms: list[float] = []
    kubectl_ms: list[float] = []
    try:
        assert agent.stdout is not None
        if agent.stdout.readline().strip() != "ready":
            sys.exit(f"agent did not start: {agent.stderr.read() if agent.stderr else ''}")
        for i in range(trials):
            time.sleep(0.02 + (i % 7) * 0.005)  # vary the phase against the agent's call loop
            started = time.time()
            cluster.kubectl("apply", "-n", ns, "-f", str(manifest))
            returned = time.time()
            line = agent.stdout.readline().split()
            if not line or line[0] != "halted":
                sys.exit(f"agent said {line!r}, expected halted")
            halt_ms.append((float(line[1]) - returned) * 1000)
            halt_from_start_ms.append((float(line[1]) - started) * 1000)
            cluster.kubectl("delete", "-n", ns, "-f", str(manifest), "--wait=false")
            returned = time.time()
            line = agent.stdout.readline().split()
            if not line or line[0] != "running":
                sys.exit(f"agent said {line!r}, expected running")
            lift_ms.append((float(line[1]) - returned) * 1000)
        for _ in range(10):
            t = time.perf_counter()
            cluster.kubectl("get", "killswitches", "-n", ns)
            kubectl_ms.append((time.perf_counter() - t) * 1000)
    finally:
        agent.kill()
        agent.communicate()

    def summary(ms: list[float]) -> dict[str, Any]:
        return {"trials": len(ms), "p50_ms": round(pct(ms, 0.5), 1), "p90_ms": round(pct(ms, 0.9), 1),
                "p99_ms": round(pct(ms, 0.99), 1), "max_ms": round(max(ms), 1)}

    return {"halt_after_apply_returns": {**summary(halt_ms), "histogram": histogram(halt_ms)},
            "halt_from_apply_start": summary(halt_from_start_ms),
            "lift_after_delete_returns": summary(lift_ms),
            "bare_kubectl_get_p50_ms": round(pct(kubectl_ms, 0.5), 1)}


def bench_limits(cluster: Any, ns: str, url: str, n: int, workers: int) -> dict[str, Any]:
    import redis
    from agent_saga_operator.models import API_VERSION, GROUP, VERSION
    from kubernetes import client

    api = client.CustomObjectsApi(cluster.api_client())
    r = redis.Redis.from_url(url)

    def create(i: int) -> None:
        body = {"apiVersion": API_VERSION, "kind": "BudgetLimit", "metadata": {"name": f"limit-{i:04d}"},
                "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 1000 + i, "window": "24h"}}
        api.create_namespaced_custom_object(GROUP, VERSION, ns, "budgetlimits", body)

    def synced_count() -> int:
        """Objects whose status the operator wrote for their generation: Synced=True.
        (Ready=True needs an agent applying the limit; none runs here: Ready is False,
        NoConsumer, an honest status this bench used to wait for in vain.)"""
        synced, cont = 0, None
        while True:
            page = cast(dict[str, Any], api.list_namespaced_custom_object(GROUP, VERSION, ns, "budgetlimits",
                                                                          limit=500, _continue=cont))
            for o in page["items"]:
                status = o.get("status") or {}
                conds = status.get("conditions") or ()
                synced += status.get("observedGeneration") == o["metadata"].get("generation") and any(
                    c["type"] == "Synced" and c["status"] == "True" for c in conds)
            cont = page["metadata"].get("continue")
            if not cont:
                return synced

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, range(n)))
    created = time.perf_counter() - t0
    projected_at = None
    deadline = t0 + 600
    while time.perf_counter() < deadline:
        if projected_at is None and r.scard("agentsaga:v1:budgetlimit:index") >= n:
            projected_at = time.perf_counter() - t0
        if projected_at is not None and synced_count() >= n:
            break
        time.sleep(0.25)
    else:
        sys.exit(f"{n} BudgetLimits not Synced within 600 s")
    synced = time.perf_counter() - t0
    r.close()
    return {"objects": n, "create_workers": workers, "all_created_s": round(created, 2),
            "all_projected_s": round(projected_at or synced, 2), "all_synced_s": round(synced, 2),
            "objects_per_s": round(n / synced, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=50, help="kill switch apply/delete trials (>= 50 for the target)")
    ap.add_argument("--limits", type=int, default=1000, help="BudgetLimit objects to create")
    ap.add_argument("--workers", type=int, default=16, help="threads creating BudgetLimits")
    ap.add_argument("--kubeconfig", help="an existing cluster (default: start the local control plane)")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args()

    from agent_saga_operator.testing import OperatorProcess
    from kubernetes import client

    work = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    url, redis_proc, redis_dir = start_redis()
    cp = None
    ping_ms = 0.0
    try:
        cluster, cp = _common.kube_cluster(args.kubeconfig, work)
        ns = f"bench-{secrets.token_hex(3)}"
        client.CoreV1Api(cluster.api_client()).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        op = OperatorProcess(cluster.kubeconfig, url, work / "operator.log", namespaces=[ns],
                             extra_args=["--standalone", "--health-host", "127.0.0.1", "--log-level", "WARNING"])
        with op:
            op.wait_ready()
            ks = bench_killswitch(cluster, ns, url, args.trials)
            limits = bench_limits(cluster, ns, url, args.limits, args.workers)
        ping_ms = round(bare_ping(url), 3)
        client.CoreV1Api(cluster.api_client()).delete_namespace(ns)
        cluster.close()
    finally:
        if cp is not None:
            cp.stop()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        shutil.rmtree(redis_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    halt = ks["halt_after_apply_returns"]
    targets: dict[str, dict[str, Any]] = {
        "killswitch_apply_to_refusal_p99_ms": {"value": halt["p99_ms"], "target": 500.0,
                                               "ok": halt["p99_ms"] <= 500.0 and halt["trials"] >= 50},
        "budgetlimits_all_synced_s": {"value": limits["all_synced_s"], "objects": limits["objects"]},
    }
    result: dict[str, Any] = {"bench": "operator", "python": sys.version.split()[0], "killswitch": ks, "budget_limits": limits,
              "targets": targets}
    result["bare_redis_ping_p50_ms"] = ping_ms
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'kill switch (kubectl -> running agent)':44} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8}")
    for label, key in (("halt: apply returned -> next call refused", "halt_after_apply_returns"),
                       ("halt: apply started -> next call refused", "halt_from_apply_start"),
                       ("lift: delete returned -> next call allowed", "lift_after_delete_returns")):
        s = ks[key]
        print(f"{label:44} {s['trials']:>4} {s['p50_ms']:>8.1f} {s['p90_ms']:>8.1f} {s['p99_ms']:>8.1f} "
              f"{s['max_ms']:>8.1f}")
    print(f"{'(scale: a bare kubectl get, p50)':44} {'':>4} {ks['bare_kubectl_get_p50_ms']:>8.1f}")
    print()
    print(f"{limits['objects']} BudgetLimits ({limits['create_workers']} creating threads): created in "
          f"{limits['all_created_s']} s, all projected in {limits['all_projected_s']} s, all Synced in "
          f"{limits['all_synced_s']} s ({limits['objects_per_s']}/s)")
    print()
    for name, t in targets.items():
        verdict = "" if "ok" not in t else ("  OK" if t["ok"] else "  MISSED")
        print(f"target {name}: {t['value']}{' (goal ' + str(t['target']) + ')' if 'target' in t else ''}{verdict}")
    print()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
