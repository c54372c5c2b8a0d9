"""The examples fit together: the example BudgetLimits and SagaPolicy (examples/k8s/)
let the example payments agent (examples/payments/, the real program, as a process) do
its normal work, refuse what they are meant to refuse, and say so in their status.

The agent runs as its image runs it (``python -m payments_agent``), configured as
examples/payments/deployment.yaml configures it, against a real Redis and a real operator
on a real kube-apiserver; the examples are applied in the test's namespace.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from agent_saga_operator.models import GROUP, VERSION
from agent_saga_operator.testing import OperatorProcess, poll
from example_manifests import EXAMPLES, in_namespace
from fixtures.controlplane import KubeCluster
from fixtures.procs import ManagedProcess, free_ports
from fixtures.redis_server import RedisServer
from kubernetes import client

pytestmark = pytest.mark.e2e
NS_PREFIX = "ex"

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0


@pytest.fixture
def operator(crds: KubeCluster, fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--resync-interval", "2", "--usage-interval", "0.5",
                                     "--retry-delay", "0.5", "--approval-poll-interval", "0.5",
                                     "--ack-interval", "0.5", "--health-host", "127.0.0.1"])
    op.start()
    op.wait_ready()
    try:
        yield op
    finally:
        op.stop()


class PaymentsAgent:
    """examples/payments/payments_agent as a process, wired as its Deployment wires it."""

    def __init__(self, redis_url: str, ns: str, pod: str, workdir: Path) -> None:
        (self.port,) = free_ports(1)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_SAGA_", "PAYMENTS_"))}
        env.update({
            "AGENT_SAGA_REDIS_URL": redis_url, "AGENT_SAGA_NAMESPACE": ns, "AGENT_SAGA_AGENT": "payments-agent",
            "POD_NAME": pod, "AGENT_SAGA_WAL_STREAM": "agent-saga:wal", "AGENT_SAGA_HEARTBEAT_INTERVAL": "0.3",
            "PAYMENTS_PORT": str(self.port), "PAYMENTS_INTERVAL": "0.1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT / "examples" / "payments")]),
        })
        self.proc = ManagedProcess(f"payments-agent {pod}", [sys.executable, "-m", "payments_agent"],
                                   workdir / f"{pod}.log", env=env, cwd=workdir).start()
        poll(lambda: self._ready(), timeout=DEADLINE, what=f"payments agent {pod} ready{self.proc.exited_message()}")

    def _ready(self) -> bool:
        try:
            return self.get("/readyz")["ok"] is True
        except OSError:
            return False

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as resp:
            return cast(dict[str, Any], json.loads(resp.read()))

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return cast(dict[str, Any], json.loads(resp.read()))

    def close(self) -> None:
        self.proc.stop()


def get(kube: KubeCluster, ns: str, plural: str, name: str) -> dict[str, Any]:
    return cast(dict[str, Any], client.CustomObjectsApi(kube.api_client()).get_namespaced_custom_object(
        GROUP, VERSION, ns, plural, name))


def status_of(kube: KubeCluster, ns: str, plural: str, name: str, what: str, pred: Any,
              op: OperatorProcess) -> dict[str, Any]:
    try:
        return poll(lambda: (o if pred(o := get(kube, ns, plural, name)) else None), timeout=DEADLINE, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}\nlast: {json.dumps(get(kube, ns, plural, name).get('status'))}\n"
                             f"--- operator log ---\n{op.log()}") from None


def applied_by_one(o: dict[str, Any]) -> bool:
    return (o.get("status") or {}).get("acked") == "1/1"


def test_the_example_limits_and_policy_let_the_example_agent_work_and_refuse_what_they_should(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, tmp_path: Path) -> None:
    agent = PaymentsAgent(fresh_redis.url, ns, "payments-agent-0", tmp_path)
    try:
        files = [EXAMPLES / "budget.yaml", EXAMPLES / "policy.yaml"]
        crds.kubectl("apply", "-n", ns, "-f", "-", input="---\n".join(in_namespace(f, ns) for f in files))
        for plural, name in (("budgetlimits", "daily-spend"), ("budgetlimits", "per-customer"),
                             ("budgetlimits", "velocity"), ("budgetlimits", "wire-ceiling"),
                             ("sagapolicies", "payments-agent")):
            status_of(crds, ns, plural, name, f"{name} applied by the agent", applied_by_one, operator)

        # Its normal traffic (a $1 payment every 0.1 s, customers in turn) goes through.
        start = agent.get("/stats")
        poll(lambda: agent.get("/stats")["ok"] >= start["ok"] + 30, timeout=DEADLINE, what="30 payments through")
        stats = agent.get("/stats")
        assert stats["refused"] == start["refused"] and stats["failed"] == start["failed"] == 0, stats

        # A charge over one customer's daily budget is refused, by that limit.
        over = agent.post("/pay", {"amount": 1500, "customer_id": "cus-big"})
        assert not over["ok"] and over["kind"] == "GateBlocked" and f"{ns}.per-customer" in over["error"], over
        obj = status_of(crds, ns, "budgetlimits", "per-customer", "the refusal counted",
                        lambda o: ((o.get("status") or {}).get("refusals") or {}).get("refused") == 1, operator)
        assert obj["status"]["refusals"]["last"]["by"] == f"limit:{ns}.per-customer"
        assert obj["status"]["refusals"]["last"]["agent"] == "payments-agent@payments-agent-0"
        assert obj["status"]["refusals"]["heldForHuman"] == 0

        # A payout (IRREVERSIBLE) waits for a human: an Approval, counted as held by the policy.
        saga = agent.post("/payout", {"amount": 500})["saga"]

        def approval() -> dict[str, Any] | None:
            items = client.CustomObjectsApi(crds.api_client()).list_namespaced_custom_object(
                GROUP, VERSION, ns, "approvals")["items"]
            return next((a for a in items if a["spec"].get("sagaId") == saga), None)
        poll(approval, timeout=DEADLINE, what="an Approval for the payout")
        assert agent.get("/payouts")[saga]["state"] == "waiting"
        obj = status_of(crds, ns, "sagapolicies", "payments-agent", "the payout counted as held",
                        lambda o: ((o.get("status") or {}).get("refusals") or {}).get("heldForHuman") == 1, operator)
        assert obj["status"]["refusals"]["refused"] == 0
        assert obj["status"]["refusals"]["last"]["tool"] == "payout.send"
        # The background payments still went through meanwhile: nothing else was refused.
        assert agent.get("/stats")["refused"] == start["refused"] + 1
    finally:
        agent.close()
