"""The fleet simulator's driver: N real agents in a few worker processes, and the trials.

    fleet = Fleet(redis_url, namespace, agents=300, processes=4, work=Path(...))
    halt = fleet.halt_trial(cluster, 0)        # KillSwitch apply -> every agent refuses, Acknowledged
    fleet.close()

Each worker (``worker.py``) hosts ``agents / processes`` agents wired from the environment
as agent pods are. Used by ``bench/fleet/fleet.py`` (the measurements) and by the smoke
test (``tests/e2e/test_fleet_smoke.py``: behaviour only, no timing).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (ROOT / "tests" / "e2e", ROOT / "runtime", ROOT / "operator", ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from agent_process import AgentProcess  # noqa: E402
from agent_saga_operator.testing import poll  # noqa: E402
from bench_acks import acknowledged_by as acknowledged  # noqa: E402

AGENT = "fleet-agent"


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (nearest rank)."""
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def summary(ms: list[float]) -> dict[str, Any]:
    return {"n": len(ms), "p50_ms": round(pct(ms, 0.5), 1), "p99_ms": round(pct(ms, 0.99), 1),
            "max_ms": round(max(ms), 1) if ms else None}


class Fleet:
    """``agents`` agents in ``processes`` worker processes (see the module doc)."""

    def __init__(self, url: str, ns: str, agents: int, processes: int, work: Path, *,
                 heartbeat: float = 2.0, check_interval: float | None = None,
                 start_timeout: float = 600.0) -> None:
        self.n = agents
        self.ns = ns
        self.workers: list[AgentProcess] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "runtime"), env.get("PYTHONPATH", "")])
        env["AGENT_SAGA_SINGLE_PROCESS"] = "1"  # the limit store is Redis; no "one of many" warning
        plane = {"AGENT_SAGA_REDIS_URL": url, "AGENT_SAGA_NAMESPACE": ns, "AGENT_SAGA_AGENT": AGENT,
                 "AGENT_SAGA_HEARTBEAT_INTERVAL": str(heartbeat)}
        if check_interval is not None:
            plane["AGENT_SAGA_PLANE_CHECK_INTERVAL"] = str(check_interval)
        work.mkdir(parents=True, exist_ok=True)
        processes = max(1, min(processes, agents))
        try:
            for w in range(processes):
                self.workers.append(AgentProcess([sys.executable, str(HERE / "worker.py")], env,
                                                 work / f"worker-{w}.stderr", ready_timeout=60))
            pods = [f"fleet-{i:05d}" for i in range(agents)]
            self.each("start", timeout=start_timeout,
                      args=lambda w: {"pods": pods[w::processes], "env": plane, "wal": str(work / f"worker-{w}.wal")})
        except BaseException:
            self.close()
            raise

    def each(self, op: str, *, timeout: float = 60.0, args: Callable[[int], dict[str, Any]] | None = None,
             **kw: Any) -> list[dict[str, Any]]:
        """``op`` sent to every worker at once; their answers (an error raises)."""
        ids = [w.submit(op, **(args(i) if args else kw)) for i, w in enumerate(self.workers)]
        out = [w.wait(cid, timeout) for w, cid in zip(self.workers, ids, strict=True)]
        for a in out:
            if not a["ok"]:
                raise AssertionError(f"a worker failed {op}: {a['error']}")
        return out

    def usage(self, timeout: float) -> list[dict[str, Any]]:
        """The limit windows as the first agent's gate reads them. Right after a run that
        overloaded the limit store a read may time out: it is asked again, once a second,
        for up to ``timeout`` seconds (only a read; what the run authorised is counted)."""
        worker, deadline = self.workers[0], time.monotonic() + timeout
        while True:
            a = worker.wait(worker.submit("usage"), timeout)
            if a["ok"]:
                return cast(list[dict[str, Any]], a["windows"])
            if "LimitStoreUnavailable" not in str(a["error"]) or time.monotonic() > deadline:
                raise AssertionError(f"a worker failed usage: {a['error']}")
            time.sleep(1.0)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    # ------------------------------------------------------------------ trials
    def halt_trial(self, cluster: Any, i: int, *, timeout: float = 60.0) -> dict[str, Any]:
        """Apply a KillSwitch halting ``fleet.halt-<i>``; until every agent's kill switch
        refuses it (per agent, ms after kubectl returned) and until Acknowledged by all."""
        from agent_saga_operator.models import API_VERSION

        tool = f"fleet.halt-{i}"
        self.each("arm", tool=tool)
        ks: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "KillSwitch", "metadata": {"name": f"halt-{i}"},
              "spec": {"action": "Halt", "scope": {"tool": tool}, "reason": "fleet bench",
                       "requestedBy": "bench@corp"}}
        cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=json.dumps(ks))
        returned = time.time()
        at = [t for a in self.each("refused", tool=tool, timeout=timeout) for t in a["at"]]
        out: dict[str, Any] = {"refused_ms": [(t - returned) * 1000 for t in at]}
        try:
            gen, acked = self._watch(cluster, "killswitches", ks["metadata"]["name"], timeout)
            out["acknowledged_ms"] = (acked - returned) * 1000
        except AssertionError as e:  # every agent refused, but the status never said so
            out["acknowledged_error"] = str(e)[:500]
        return out

    def policy_trial(self, cluster: Any, i: int, *, timeout: float = 60.0) -> float:
        """Create or edit the SagaPolicy ``fleet-policy``: ms until applied by all (Acknowledged)."""
        from agent_saga_operator.models import API_VERSION

        spec = {"mode": "Enforce", "undeclaredTools": "Allow",
                "tools": {"search_docs": {"semantics": "REVERSIBLE"}},
                "rules": [{"name": "big", "argExceeds": {"arg": "amount", "threshold": 1_000_000 + i}}]}
        doc = {"apiVersion": API_VERSION, "kind": "SagaPolicy", "metadata": {"name": "fleet-policy"}, "spec": spec}
        cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=json.dumps(doc))
        returned = time.time()
        _, acked = self._watch(cluster, "sagapolicies", "fleet-policy", timeout)
        return (acked - returned) * 1000

    def _watch(self, cluster: Any, plural: str, name: str, timeout: float) -> tuple[int, float]:
        """(the generation, when ``name`` was Acknowledged by all N at that generation: a
        watch, no polling interval)."""
        from agent_saga_operator.models import GROUP, VERSION
        from kubernetes import client, watch

        api = client.CustomObjectsApi(cluster.api_client())
        obj: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, self.ns, plural, name)  # type: ignore[assignment]
        gen = int(obj["metadata"]["generation"])
        if acknowledged(obj, self.n, gen):
            return gen, time.time()
        w = watch.Watch()  # type: ignore[no-untyped-call]  # the kubernetes client is untyped
        deadline = time.monotonic() + timeout
        for ev in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, self.ns, plural,  # type: ignore[no-untyped-call]
                           field_selector=f"metadata.name={name}", resource_version=obj["metadata"]["resourceVersion"],
                           timeout_seconds=int(timeout)):
            obj = ev["object"]
            if acknowledged(obj, self.n, gen):
                w.stop()  # type: ignore[no-untyped-call]
                return gen, time.time()
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"{plural}/{name} not acknowledged by {self.n} agents at generation {gen} within "
                             f"{timeout}s; last status: {json.dumps(obj.get('status') or {})[:2000]}")

    def budget(self, cluster: Any, *, cap: float, rate: float, seconds: float, amount: float = 1.0,
               timeout: float = 120.0) -> dict[str, Any]:
        """A BudgetLimit of ``cap`` shared by the fleet; every agent debits ``amount`` at
        ``rate``/s for ``seconds``. What was authorised, and what the windows hold."""
        from agent_saga_operator.models import API_VERSION

        doc = {"apiVersion": API_VERSION, "kind": "BudgetLimit", "metadata": {"name": "fleet-budget"},
               "spec": {"kind": "Budget", "arg": "amount", "maxTotal": cap, "window": "1h", "tools": ["wire.*"]}}
        cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=json.dumps(doc))
        # every agent holds the limit before the first debit
        self.each("limit", name="fleet-budget", timeout=timeout)
        t0 = time.monotonic()
        runs = self.each("loop", rate=rate, amount=amount, seconds=seconds, timeout=seconds + timeout)
        wall = time.monotonic() - t0
        refused: dict[str, int] = {}
        for r in runs:
            for k, v in r["refused"].items():
                refused[k] = refused.get(k, 0) + v
        latencies = [x for r in runs for x in r["latency_ms"]]
        windows = self.usage(timeout)
        used = sum(w["used"] for w in windows if w["limit"].endswith("fleet-budget"))
        return {"cap": cap, "authorised": sum(r["authorised"] for r in runs), "ran": sum(r["ran"] for r in runs),
                "refused": refused, "recorded": used, "debits": len(latencies),
                "debits_per_s": round(len(latencies) / wall, 1), "saga_latency": summary(latencies)}

    def approvals(self, cluster: Any, count: int, *, timeout: float = 600.0) -> dict[str, Any]:
        """``count`` IRREVERSIBLE sagas wait for a human at once; once all are mirrored into
        Approval objects, ``kubectl get approvals`` is timed and every one approved through
        the API (16 at a time); every agent must see its decision."""
        from agent_saga_operator.models import GROUP, VERSION
        from kubernetes import client

        api = client.CustomObjectsApi(cluster.api_client())
        per = [count // len(self.workers) + (1 if i < count % len(self.workers) else 0)
               for i in range(len(self.workers))]
        ids = [w.submit("approve", count=c, timeout=timeout) for w, c in zip(self.workers, per, strict=True)]
        t0 = time.monotonic()

        def mirrored_all() -> list[dict[str, Any]] | None:
            items: list[dict[str, Any]] = api.list_namespaced_custom_object(  # type: ignore[index]
                GROUP, VERSION, self.ns, "approvals")["items"]
            return items if len(items) >= count else None
        items = poll(mirrored_all, timeout=timeout, what=f"{count} Approval objects", interval=2.0)
        # a request the agent's gateway denied on its own (its store did not answer) shows Denied
        names = [o["metadata"]["name"] for o in items if (o.get("status") or {}).get("phase") in (None, "Pending")]
        mirrored = time.monotonic() - t0
        t1 = time.perf_counter()
        listed = cluster.kubectl("get", "approvals", "-n", self.ns).stdout
        get_ms = (time.perf_counter() - t1) * 1000
        body = {"spec": {"decision": "Approved", "approver": "bench@corp", "note": "fleet bench"}}
        t2 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: api.patch_namespaced_custom_object(GROUP, VERSION, self.ns, "approvals", n, body),
                          names))
        decided = time.monotonic() - t2
        answers = [w.wait(cid, timeout) for w, cid in zip(self.workers, ids, strict=True)]
        seen = time.monotonic() - t2
        other: dict[str, int] = {}
        for a in answers:
            for k, v in (a.get("other") or {}).items():
                other[k] = other.get(k, 0) + v
        return {"requests": count, "mirrored_s": round(mirrored, 2), "pending_when_mirrored": len(names),
                "kubectl_get_ms": round(get_ms, 1), "kubectl_get_lines": len(listed.splitlines()) - 1, "decided_s": round(decided, 2),
                "all_seen_s": round(seen, 2), "approved": sum(a.get("approved", 0) for a in answers),
                "not_approved": other}

    def close(self) -> None:
        if self.workers:
            try:
                self.each("close", timeout=120)
            except Exception:  # noqa: BLE001 - killed below anyway
                pass
        for w in self.workers:
            w.close()
        self.workers = []
