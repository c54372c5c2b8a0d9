"""The fleet simulator, small: fifty real agents on one policy plane behave as a fleet must.

Fifty agents (``bench/fleet/worker.py``: each wired from the environment as an agent pod
is, with its own kill switch reader, limits, approvals, SagaPolicy reader and heartbeat)
in two processes, against a real Redis, the real operator and the API server. Behaviour
only, no timing (``make bench-fleet`` measures): every agent refuses after a halt, the
acknowledgements are counted exactly, a budget shared by the fleet is exact, and a burst
of heartbeat notifications is read once, not once per notification.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from agent_saga_operator.models import GROUP, VERSION
from agent_saga_operator.testing import OperatorProcess, poll
from fixtures.controlplane import KubeCluster
from fixtures.redis_server import RedisServer
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "fleet"))
from sim import Fleet  # noqa: E402
from test_operator_status_writers import operator  # noqa: E402 - the operator, its resync timer off

pytestmark = pytest.mark.e2e
NS_PREFIX = "fl"
AGENTS = 50
DEADLINE = 60.0
__all__ = ["operator"]


def metric(op: OperatorProcess, name: str) -> float:
    for line in op.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def status(kube: KubeCluster, ns: str, plural: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(kube.api_client()).get_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
    return dict(obj.get("status") or {})


def test_fifty_agents_refuse_after_a_halt_are_counted_exactly_share_an_exact_budget_and_are_read_once_per_burst(
    crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    fleet = Fleet(fresh_redis.url, ns, AGENTS, 2, tmp_path / "fleet", heartbeat=1.0)
    try:
        # The halt: every agent's own kill switch refuses the tool, and a saga calling it
        # is refused by the kill switch in every agent.
        halt = fleet.halt_trial(crds, 0, timeout=DEADLINE)
        assert len(halt["refused_ms"]) == AGENTS and all(t is not None for t in halt["refused_ms"])
        assert "acknowledged_ms" in halt, halt  # Acknowledged by all 50 at the generation applied
        calls = fleet.each("call", tool="fleet.halt-0", timeout=DEADLINE)
        assert sum(c["ran"] for c in calls) == 0, calls
        refused: dict[str, int] = {}
        for c in calls:
            for k, v in c["refused"].items():
                refused[k] = refused.get(k, 0) + v
        assert refused == {"GateBlocked:kill-switch": AGENTS}, refused
        # Acknowledged counts every agent once: 50 matched, 50 acknowledged, nobody lagging.
        st = status(crds, ns, "killswitches", "halt-0")
        assert st["agents"] == {"matched": AGENTS, "acknowledged": AGENTS, "lagging": []}, st["agents"]
        assert st["acked"] == f"{AGENTS}/{AGENTS}"

        # One budget for the fleet, spent from every agent at once: never more than the cap
        # authorised, never less recorded than authorised, and the cap is reached.
        b = fleet.budget(crds, cap=40, rate=2.0, seconds=2.0, timeout=DEADLINE)
        assert b["authorised"] <= 40, b
        assert b["recorded"] >= b["authorised"], b
        assert b["authorised"] == 40 and any("fleet-budget" in k for k in b["refused"]), b
        assert b["ran"] + sum(b["refused"].values()) == b["debits"], b
    finally:
        fleet.close()

    # A thousand agents applying one change notify within a second; the tally must read
    # the heartbeats once per burst (O(agents) per change), not once per notification.
    r = redis.Redis.from_url(fresh_redis.url)
    poll(lambda: metric(operator, "agentsaga_operator_ack_reads_total") >= 1, timeout=DEADLINE,
         what="the tally's first read")
    notified = metric(operator, "agentsaga_operator_ack_notifications_total")
    reads = metric(operator, "agentsaga_operator_ack_reads_total")
    pipe = r.pipeline(transaction=False)
    for i in range(1000):
        pipe.publish("agentsaga:v1:agents:events",
                     json.dumps({"v": 1, "kind": "AgentHeartbeat", "id": f"{ns}/pod-{i}.1", "op": "put"}))
    pipe.execute()
    poll(lambda: metric(operator, "agentsaga_operator_ack_notifications_total") >= notified + 1000,
         timeout=DEADLINE, what="every notification received")
    assert metric(operator, "agentsaga_operator_ack_reads_total") - reads <= 100
