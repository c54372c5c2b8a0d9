"""The policy-plane contract: the runtime reads exactly what the operator writes.

First without Kubernetes (the projection code against a real Redis), then end to end:
a BudgetLimit applied with kubectl is projected by the operator process, loaded by a
runtime ``PreFlightGate`` backed by ``RedisLimitStore``, enforced, and its spend shows up
in the object's status; editing ``maxTotal`` takes effect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from agent_saga.controls import PreFlightGate, RedisLimitStore
from agent_saga.gates import StepRequest
from agent_saga.wal.file import read_log
from agent_saga_operator.documents import Identity, budget_limit_doc, killswitch_doc, runtime_limit
from agent_saga_operator.models import API_VERSION, GROUP, VERSION, BudgetLimitSpec, KillSwitchSpec
from agent_saga_operator.projection import DecisionConflict, Projector, load_limits
from agent_saga_operator.testing import OperatorProcess, poll
from fixtures.controlplane import KubeCluster
from fixtures.redis_server import RedisServer
from fixtures.steps import req as step_request
from kubernetes import client

NS_PREFIX = "proj"  # the tests' namespaces: proj-<hex>
DEADLINE = 20.0
WHO = Identity("payments", "daily-spend", "uid-1", 1, datetime(2026, 7, 1, 12, 0, tzinfo=UTC))


def req(amount: float, tool: str = "stripe.charge", customer: str = "c1") -> StepRequest:
    return step_request(tool, saga="saga-1", step="s1", amount=amount, customer_id=customer)


# ---------------------------------------------------------------- without Kubernetes
async def _contract(url: str) -> None:
    projector = Projector(url)
    reader = aioredis.Redis.from_url(url)
    try:
        specs = {
            "daily-spend": BudgetLimitSpec.model_validate(
                {"kind": "Budget", "arg": "amount", "maxTotal": 1000, "window": "24h",
                 "scope": {"byArgs": ["customer_id"]}, "tools": ["stripe.*"], "escalateToHuman": False}),
            "velocity": BudgetLimitSpec.model_validate(
                {"kind": "Rate", "maxCalls": 3, "window": "1m", "scope": {"byTool": True}}),
        }
        expected = []
        for name, spec in specs.items():
            who = Identity("payments", name, "u", 1, WHO.created)
            assert await projector.put("BudgetLimit", who.id, budget_limit_doc(spec, who)) > 0
            expected.append(runtime_limit(spec, who))
        # A limit of another namespace is not this namespace's business.
        other = Identity("other", "daily-spend", "u", 1, WHO.created)
        await projector.put("BudgetLimit", other.id, budget_limit_doc(specs["daily-spend"], other))

        loaded = await load_limits(reader, "payments")
        assert loaded == expected  # the very objects the runtime would build from the spec
        assert [lim.name for lim in loaded] == ["payments.daily-spend", "payments.velocity"]
        assert len(await load_limits(reader)) == 3

        # The loaded limits enforce through the runtime's gate and Redis store.
        store = RedisLimitStore(url)
        try:
            gate = PreFlightGate(limits=loaded, store=store, default_rules=())
            assert (await gate.decide(req(600))).verdict == "ALLOW"
            refused = await gate.decide(req(500))
            assert refused.verdict == "BLOCK" and refused.decided_by == "limit:payments.daily-spend"
            assert (await gate.decide(req(500, customer="c2"))).verdict == "ALLOW"  # its own window
            assert (await gate.decide(req(1, customer="c3"))).verdict == "ALLOW"  # 3rd stripe.charge call
            refused = await gate.decide(req(1, customer="c4"))  # velocity: 3 calls per tool per minute
            assert refused.verdict == "BLOCK" and refused.decided_by == "limit:payments.velocity"
            assert (await gate.decide(req(1, tool="stripe.refund", customer="c5"))).verdict == "ALLOW"  # another tool's window
            assert (await gate.decide(req(1, tool="wire.send"))).verdict == "ALLOW"  # not a stripe.* tool
            usage = {(u.name, u.key): u.used for u in await store.usage([lim.spec() for lim in loaded])}
            assert usage[("payments.daily-spend", "customer_id=c1")] == 600
            assert usage[("payments.velocity", "tool=stripe.charge")] == 3
        finally:
            await store.aclose()

        # Unchanged re-projection writes nothing; delete removes document and index entry.
        spec = specs["velocity"]
        who = Identity("payments", "velocity", "u", 1, WHO.created)
        assert await projector.put("BudgetLimit", who.id, budget_limit_doc(spec, who)) == 0
        assert await projector.delete("BudgetLimit", who.id) > 0
        assert await projector.delete("BudgetLimit", who.id) == 0
        assert [lim.name for lim in await load_limits(reader, "payments")] == ["payments.daily-spend"]

        # KillSwitch documents are exactly the documented shape.
        ks = KillSwitchSpec.model_validate({"action": "Halt", "scope": {"tool": "wire.send"}, "reason": "fraud",
                                            "requestedBy": "soc@corp", "ttlSeconds": 600})
        ks_who = Identity("payments", "halt", "u", 2, WHO.created)
        rev = await projector.put("KillSwitch", ks_who.id, killswitch_doc(ks, ks_who))
        doc = json.loads(await reader.get(f"agentsaga:v1:killswitch:{ks_who.id}"))
        assert list(doc)[:2] == ["rev", "v"] and doc["rev"] == rev
        assert {k: doc[k] for k in ("action", "scope", "reason", "requestedBy", "ttl", "engagedAt", "expiresAt")} == {
            "action": "Halt", "scope": "tool:wire.send", "reason": "fraud", "requestedBy": "soc@corp",
            "ttl": 600, "engagedAt": "2026-07-01T12:00:00Z", "expiresAt": "2026-07-01T12:10:00Z"}

        # A decision is written once: the same one again is a no-op, a different one conflicts.
        decision = {"v": 1, "requestId": "af83c011", "decision": "approved", "approver": "risk@corp",
                    "argumentsDigest": "sha256:" + "0" * 64}
        assert await projector.decide("af83c011", decision) > 0
        assert await projector.decide("af83c011", dict(decision)) == 0
        with pytest.raises(DecisionConflict):
            await projector.decide("af83c011", {**decision, "decision": "denied"})
        assert (await projector.get_decision("af83c011"))["decision"] == "approved"  # type: ignore[index]
    finally:
        await projector.aclose()
        await reader.aclose()


def test_runtime_reads_exactly_what_the_projection_writes(fresh_redis: RedisServer) -> None:
    asyncio.run(_contract(fresh_redis.url))


# ---------------------------------------------------------------- end to end
@pytest.fixture
def operator(crds: KubeCluster, fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--resync-interval", "5", "--usage-interval", "0.5",
                                     "--health-host", "127.0.0.1"])
    op.start()
    try:
        op.wait_ready()
        yield op
    finally:
        op.stop()


def _status(kube: KubeCluster, ns: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(kube.api_client()).get_namespaced_custom_object(
        GROUP, VERSION, ns, "budgetlimits", name)
    return obj.get("status") or {}  # type: ignore[no-any-return]


async def _charge(url: str, ns: str, amounts: list[float]) -> list[str]:
    """An agent's view: load this namespace's limits from the policy plane, then charge."""
    reader = aioredis.Redis.from_url(url)
    store = RedisLimitStore(url)
    try:
        gate = PreFlightGate(limits=await load_limits(reader, ns), store=store, default_rules=())
        return [(await gate.decide(req(a))).verdict for a in amounts]
    finally:
        await reader.aclose()
        await store.aclose()


def test_budget_limit_applied_with_kubectl_is_enforced_and_reports_spend(
    crds: KubeCluster, ns: str, operator: OperatorProcess, fresh_redis: RedisServer
) -> None:
    body = {"apiVersion": API_VERSION, "kind": "BudgetLimit", "metadata": {"name": "daily-spend"},
            "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 1000, "window": "24h"}}
    crds.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
    r = redis.Redis.from_url(fresh_redis.url)
    try:
        poll(lambda: r.exists(f"agentsaga:v1:budgetlimit:{ns}/daily-spend"), timeout=DEADLINE,
             what="the BudgetLimit projected")
    finally:
        r.close()
    assert asyncio.run(_charge(fresh_redis.url, ns, [400, 400, 400])) == ["ALLOW", "ALLOW", "BLOCK"]

    st = poll(lambda: (s := _status(crds, ns, "daily-spend")).get("used") == 800 and s, timeout=DEADLINE,
              what="status.used = 800")
    assert st["limitName"] == f"{ns}.daily-spend" and st["max"] == 1000 and st["remaining"] == 200
    assert st["windowSeconds"] == 86400 and st["windows"] == 1
    table = crds.kubectl("get", "budgetlimits", "-n", ns).stdout
    # No agent reads this namespace: enforced by the store, applied by nobody (ACKED 0/0).
    assert "Budget" in table and "1000" in table and "800" in table and "0/0" in table and "False" in table

    # Raising maxTotal takes effect for the next agent that loads the limits.
    body["spec"]["maxTotal"] = 1500
    crds.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
    poll(lambda: _status(crds, ns, "daily-spend").get("max") == 1500, timeout=DEADLINE, what="status.max = 1500")
    assert asyncio.run(_charge(fresh_redis.url, ns, [400, 400])) == ["ALLOW", "BLOCK"]
    poll(lambda: _status(crds, ns, "daily-spend").get("used") == 1200, timeout=DEADLINE, what="status.used = 1200")


def test_approval_decision_reaches_the_policy_plane_and_expiry_denies(
    crds: KubeCluster, ns: str, operator: OperatorProcess, fresh_redis: RedisServer
) -> None:
    a = client.CustomObjectsApi(crds.api_client())
    now = datetime.now(UTC)

    def approval(name: str, deadline_s: int) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": "Approval", "metadata": {"name": name}, "spec": {
            "requestId": name, "tool": "wire.send", "sagaId": "saga-1", "stepId": "s1", "rule": "irreversible",
            "argumentsDigest": "sha256:" + "ab" * 32, "display": {"amount": "80000"},
            "requestedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "deadline": datetime.fromtimestamp(now.timestamp() + deadline_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}

    a.create_namespaced_custom_object(GROUP, VERSION, ns, "approvals", approval("req-approve", 600))
    a.create_namespaced_custom_object(GROUP, VERSION, ns, "approvals", approval("req-expire", 2))

    def phase(name: str) -> str | None:
        obj = a.get_namespaced_custom_object(GROUP, VERSION, ns, "approvals", name)
        return (obj.get("status") or {}).get("phase")  # type: ignore[no-any-return]

    poll(lambda: phase("req-approve") == "Pending", timeout=DEADLINE, what="Pending")
    # A request that needs a passkey says how to approve it (kubectl can only deny it).
    a.create_namespaced_custom_object(GROUP, VERSION, ns, "approvals",
                                      {**approval("req-passkey", 600), "spec": {
                                          **approval("req-passkey", 600)["spec"], "passkeyRequired": True}})

    def ready_message(name: str) -> str:
        obj = a.get_namespaced_custom_object(GROUP, VERSION, ns, "approvals", name)
        return next((c["message"] for c in (obj.get("status") or {}).get("conditions") or ()
                     if c["type"] == "Ready"), "")

    poll(lambda: phase("req-passkey") == "Pending", timeout=DEADLINE, what="passkey request Pending")
    said = ready_message("req-passkey")
    assert "agent-saga approvals sign req-passkey" in said and "kubectl can only deny it" in said, said
    assert "kubectl patch approval req-approve" in ready_message("req-approve")
    crds.kubectl("patch", "-n", ns, "approval", "req-approve", "--type=merge", "-p",
                 json.dumps({"spec": {"decision": "Approved", "approver": "risk@corp", "note": "verified by phone"}}))
    poll(lambda: phase("req-approve") == "Approved", timeout=DEADLINE, what="Approved")
    r = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    try:
        doc = json.loads(r.get("agentsaga:v1:approval:decision:req-approve"))  # type: ignore[arg-type]
        assert (doc["decision"], doc["approver"], doc["note"]) == ("approved", "risk@corp", "verified by phone")
        assert doc["argumentsDigest"] == "sha256:" + "ab" * 32 and doc["source"] == f"kubernetes:{ns}/req-approve"

        poll(lambda: phase("req-expire") == "Expired", timeout=2 + DEADLINE, what="Expired")
        doc = json.loads(r.get("agentsaga:v1:approval:decision:req-expire"))  # type: ignore[arg-type]
        assert doc["decision"] == "expired" and doc["approver"] is None
    finally:
        r.close()
    out = crds.kubectl("get", "approvals", "-n", ns).stdout
    assert "Approved" in out and "risk@corp" in out and "Expired" in out


def _route_status(kube: KubeCluster, ns: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(kube.api_client()).get_namespaced_custom_object(
        GROUP, VERSION, ns, "modelroutes", name)
    return obj.get("status") or {}  # type: ignore[no-any-return]


def _ready(status: dict[str, Any]) -> tuple[str, str] | None:
    c = next((c for c in status.get("conditions") or () if c["type"] == "Ready"), None)
    return None if c is None else (c["status"], c["reason"])


def test_a_model_route_edited_with_kubectl_changes_the_next_decision(
    crds: KubeCluster, ns: str, operator: OperatorProcess, fresh_redis: RedisServer, tmp_path: Path
) -> None:
    """A router in this process reads its ModelRoute from the policy plane: Ready follows
    its heartbeat, a kubectl edit of the preference decides the next call, and a route no
    host satisfies refuses naming every candidate and why."""
    from agent_saga.plane import connect_policy_plane, disconnect_policy_plane, plane_router
    from agent_saga.routing import Message, ModelRequest, RoutingRefused
    from agent_saga.wal import FileWAL
    from fixtures.openai_server import ChatServer

    ask = ModelRequest((Message("user", "hello"),), max_tokens=16)
    with ChatServer() as a, ChatServer() as b:
        a.always(ChatServer.reply("from a"))
        b.always(ChatServer.reply("from b"))
        host = {"model": "m", "capabilities": {"contextTokens": 4096, "costClass": "Medium"}}
        body = {"apiVersion": API_VERSION, "kind": "ModelRoute", "metadata": {"name": "default"},
                "spec": {"hosts": [{"name": "a", "endpoint": a.url, **host}, {"name": "b", "endpoint": b.url, **host}],
                         "preference": ["a", "b"]}}
        crds.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))
        poll(lambda: _ready(_route_status(crds, ns, "default")) == ("False", "NoConsumer"), timeout=DEADLINE,
             what="Ready=False NoConsumer before any router reads the route")
        wal = FileWAL(tmp_path / "agent.wal")
        connect_policy_plane(fresh_redis.url, namespace=ns, agent="router-agent")
        try:
            router = plane_router(wal=wal, timeout=5.0)
            assert router.complete(ask).host == "a"
            st = poll(lambda: (s := _route_status(crds, ns, "default")) and _ready(s) == ("True", "Routed") and s,
                      timeout=DEADLINE, what="Ready=True Routed once the router applied the route")
            assert st["acked"] == "1/1"

            crds.kubectl("patch", "-n", ns, "modelroute", "default", "--type=merge",
                         "-p", json.dumps({"spec": {"preference": ["b", "a"]}}))
            poll(lambda: router.source.route().generation == 2, timeout=DEADLINE, what="generation 2 read")
            second = router.complete(ask)
            assert (second.host, second.decision.route["generation"]) == ("b", 2)
            assert [(c.host, c.outcome) for c in second.decision.candidates] == [("b", "chosen"), ("a", "untried")]

            crds.kubectl("patch", "-n", ns, "modelroute", "default", "--type=merge",
                         "-p", json.dumps({"spec": {"constraints": {"maxCostClass": "Low"}}}))
            poll(lambda: router.source.route().generation == 3, timeout=DEADLINE, what="generation 3 read")
            with pytest.raises(RoutingRefused) as err:
                router.complete(ask)
            assert {c.host: c.reasons for c in err.value.decision.candidates} == {
                "b": ("cost class Medium is above the Low allowed",),
                "a": ("cost class Medium is above the Low allowed",)}
            poll(lambda: _route_status(crds, ns, "default").get("acked") == "1/1"
                 and _ready(_route_status(crds, ns, "default")) == ("True", "Routed"), timeout=DEADLINE,
                 what="generation 3 acknowledged")
        finally:
            disconnect_policy_plane()
            wal.close()
        assert (len(a.requests), len(b.requests)) == (1, 1)
        types = [t for t in (r.type for _, r in read_log(tmp_path / "agent.wal"))]
        assert types.count("ROUTING_DECISION") == 2 and types.count("ROUTING_REFUSED") == 1
