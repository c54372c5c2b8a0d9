"""Kill switch on a real cluster: from `kubectl apply` of a KillSwitch to every agent pod
refusing wire.send.

    PYTHONPATH=tests .venv/bin/python bench/bench_node.py [--kubeconfig FILE] [--trials 20] [--agents 3] [--json]

Without --kubeconfig the local single-node cluster is started (tests/fixtures/node.py;
`make node` first), the chart installed from this tree's images with its trial Redis, and
the payments agents of examples/payments/deployment.yaml deployed next to it; all of it
is removed at the end. With --kubeconfig, the cluster must have the images loaded.

Target: every agent pod refusing <= 250 ms p99 over >= 20 trials, >= 3 pods.

Each trial: a thread per agent pod asks its pod "would a wire go out now?" (POST /wire: a
saga of one wire.send, refused by the gate while the switch holds) in a loop; the clock
starts just before `kubectl apply -f examples/k8s/killswitch.yaml` is started and stops,
per pod, at its first refused answer. The path measured is the whole one: kubectl, the
API server, the operator's watch and projection into Redis, the agents' subscription.
Then the switch is deleted and the lift measured the same way; and the same halt again,
the object created through the API by this process (no kubectl), which leaves the path
from the API server's write to the agents. Reported with two floors
measured in the same run: the `kubectl apply` process alone (start to exit), and one
/wire round trip while nothing is halted (the polling resolution). Pods are reached at
their own addresses on the local node, through the API server's pod proxy otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "node"))  # node_support: the node suite's helpers

import _common  # noqa: E402  (bench/_common.py)
from fixtures.binaries import node_images, require_asset  # noqa: E402
from fixtures.controlplane import KubeCluster  # noqa: E402
from fixtures.node import Node  # noqa: E402
from node_support import AGENT_PORT, Agents, Release, pod_http  # noqa: E402

KILLSWITCH = REPO / "examples" / "k8s" / "killswitch.yaml"


def probe_for(cluster: KubeCluster, rel: Release, pod: str, direct: bool) -> Callable[[], bool]:
    """A function answering True when `pod` refuses a wire now."""
    if direct:
        ip = json.loads(rel.kubectl("get", "pod", pod, "-o", "json").stdout)["status"]["podIP"]
        conn = http.client.HTTPConnection(ip, AGENT_PORT, timeout=30)

        def ask() -> bool:
            conn.request("POST", "/wire", body=b'{"amount": 1}', headers={"Content-Type": "application/json"})
            out = json.loads(conn.getresponse().read())
            return bool(out["kind"] == "GateBlocked")
        return ask

    def ask_proxy() -> bool:
        status, out = pod_http(cluster, rel.namespace, pod, "/wire", {"amount": 1})
        assert status == 200, out
        return bool(out["kind"] == "GateBlocked")
    return ask_proxy


def until_all(probes: dict[str, Callable[[], bool]], want: bool, start: Callable[[], None]
              ) -> tuple[dict[str, float], float]:
    """Start every poller, call `start` (which starts the clock), return each pod's
    seconds to its first answer == `want`, and how long `start` itself took."""
    t0: list[float] = []
    seen: dict[str, float] = {}
    go = threading.Event()

    def poll(pod: str, ask: Callable[[], bool]) -> None:
        go.wait()
        while ask() != want:
            time.sleep(0.005)  # a few ms between questions: the agents are not the thing measured
        seen[pod] = time.monotonic() - t0[0]

    threads = [threading.Thread(target=poll, args=(p, a), daemon=True) for p, a in probes.items()]
    for t in threads:
        t.start()
    t0.append(time.monotonic())
    go.set()
    start()
    took = time.monotonic() - t0[0]
    for t in threads:
        t.join(120)
    missing = set(probes) - set(seen)
    if missing:
        raise SystemExit(f"pods never answered refused={want}: {sorted(missing)}")
    return seen, took


def run(cluster: KubeCluster, trials: int, n_agents: int, workdir: Path) -> dict[str, Any]:
    rel = Release(cluster, node_images(), workdir / "helm", name="agent-saga", namespace="agent-saga-bench")
    rel.install()
    rel.wait_ready()
    agents = Agents(rel, replicas=n_agents, interval=0)
    agents.apply()
    kubectl = [str(require_asset("kubectl")), "--kubeconfig", str(cluster.kubeconfig), "-n", rel.namespace]
    direct = cluster.node is not None
    probes = {p: probe_for(cluster, rel, p, direct) for p in agents.pods()}
    for ask in probes.values():  # warm: connections open, every pod sending
        assert ask() is False
    rtt = []
    for _ in range(50):
        ask = next(iter(probes.values()))
        t = time.monotonic()
        ask()
        rtt.append(time.monotonic() - t)
    halt, lift, first, apply_s, api_halt = [], [], [], [], []
    body = yaml.safe_load(KILLSWITCH.read_text())
    crd = client.CustomObjectsApi(cluster.api_client())

    def apply() -> None:
        subprocess.run([*kubectl, "apply", "-f", str(KILLSWITCH)], check=True, capture_output=True)

    def create() -> None:  # the same object, written by this process: no kubectl
        crd.create_namespaced_custom_object("agentsaga.dev", "v1alpha1", rel.namespace, "killswitches", body)

    def delete() -> None:
        subprocess.run([*kubectl, "delete", "-f", str(KILLSWITCH), "--wait=false"], check=True, capture_output=True)

    def lifted() -> float:
        seen, _ = until_all(probes, False, delete)
        # The object is gone (its finalizer removed) before the next trial creates it again.
        subprocess.run([*kubectl, "wait", "--for=delete", "killswitch/halt-wire-send", "--timeout=60s"],
                       capture_output=True)
        return max(seen.values())

    for _ in range(trials):
        seen, took = until_all(probes, True, apply)
        halt.append(max(seen.values()))
        first.append(min(seen.values()))
        apply_s.append(took)
        lift.append(lifted())
        seen, _ = until_all(probes, True, create)
        api_halt.append(max(seen.values()))
        lift.append(lifted())
    rel.uninstall()
    def ms(xs: list[float], q: float) -> float:
        return round(_common.pct(xs, q) * 1000, 1)

    return {
        "trials": trials, "agent_pods": len(probes), "reached": "pod address" if direct else "API server proxy",
        "all_refusing_ms": {"p50": ms(halt, 0.5), "p99": ms(halt, 0.99), "max": ms(halt, 1.0)},
        "first_refusing_ms": {"p50": ms(first, 0.5), "p99": ms(first, 0.99)},
        "all_refusing_after_api_create_ms": {"p50": ms(api_halt, 0.5), "p99": ms(api_halt, 0.99)},
        "all_sending_after_delete_ms": {"p50": ms(lift, 0.5), "p99": ms(lift, 0.99)},
        "floor_kubectl_apply_ms": {"p50": ms(apply_s, 0.5), "p99": ms(apply_s, 0.99)},
        "floor_probe_round_trip_ms": {"p50": ms(rtt, 0.5), "p99": ms(rtt, 0.99)},
        "ratio_all_refusing_p50_to_kubectl_apply_p50": round(_common.pct(halt, 0.5) / _common.pct(apply_s, 0.5), 2),
        "target_p99_ms": 250, "met": _common.pct(halt, 0.99) <= 0.250,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kubeconfig", help="a cluster with the images loaded (default: start the local node)")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args()
    if args.trials < 20 or args.agents < 3:
        ap.error("the target is defined over >= 20 trials with >= 3 agent pods")
    workdir = Path(tempfile.mkdtemp(prefix="bench-node-"))
    node = None
    try:
        if args.kubeconfig:
            cluster = KubeCluster(kubeconfig=Path(args.kubeconfig), local=False)
        else:
            node = Node(workdir / "node").start()
            cluster = node.cluster()
        result = run(cluster, args.trials, args.agents, workdir)
    finally:
        if node is not None:
            left = node.stop()
            if left:
                print("the node left behind: " + "; ".join(left), file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"kill switch on a real cluster: {result['agent_pods']} agent pods, {result['trials']} trials "
          f"(pods reached by {result['reached']})")
    for key in ("all_refusing_ms", "first_refusing_ms", "all_refusing_after_api_create_ms",
                "all_sending_after_delete_ms", "floor_kubectl_apply_ms", "floor_probe_round_trip_ms"):
        print(f"  {key:34} " + "  ".join(f"{k} {v}" for k, v in result[key].items()))
    print(f"  all refusing p50 / kubectl apply p50: {result['ratio_all_refusing_p50_to_kubectl_apply_p50']}x; "
          f"target p99 <= 250 ms: {'met' if result['met'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
