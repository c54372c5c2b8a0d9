"""The operator process against the local control plane and a real Redis.

Each test starts ``python -m agent_saga_operator`` watching one fresh namespace, drives it
with the Kubernetes API, and checks status, Events, finalizers and the documents in
Redis. The operator is stopped (process group reaped) at the end of every test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from agent_saga_operator.handlers import FINALIZER
from agent_saga_operator.models import API_VERSION, GROUP, KINDS, VERSION
from agent_saga_operator.testing import OperatorProcess, poll
from example_manifests import EXAMPLES, in_namespace
from fixtures.controlplane import KubeCluster
from fixtures.redis_server import RedisServer
from kubernetes import client
from kubernetes.client.rest import ApiException

NS_PREFIX = "op"  # the tests' namespaces: op-<hex>
DEADLINE = 20.0  # seconds: generous for a loaded 2-core CI machine; typical is < 1 s


@pytest.fixture
def r(fresh_redis: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def operator(crds: KubeCluster, fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--resync-interval", "2", "--usage-interval", "1",
                                     "--retry-delay", "0.5", "--health-host", "127.0.0.1"])
    op.start()
    try:
        op.wait_ready()
        yield op
    finally:
        op.stop()
        assert op.proc is not None and op.proc.poll() is not None, "operator still running"


def api(kube: KubeCluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api_client())


def get(kube: KubeCluster, ns: str, plural: str, name: str) -> dict[str, Any]:
    return api(kube).get_namespaced_custom_object(GROUP, VERSION, ns, plural, name)  # type: ignore[no-any-return]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions") or ():
        if c["type"] == type_:
            return c  # type: ignore[no-any-return]
    return None


def wait_status(kube: KubeCluster, ns: str, plural: str, name: str, what: str, op: OperatorProcess,
                pred: Any, timeout: float = DEADLINE) -> dict[str, Any]:
    try:
        return poll(lambda: (o if pred(o := get(kube, ns, plural, name)) else None), timeout=timeout, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator log ---\n{op.log()}") from None


def ready_is(status: str, reason: str | None = None, generation: int | None = None) -> Any:
    def pred(o: dict[str, Any]) -> bool:
        c = condition(o, "Ready")
        return (c is not None and c["status"] == status and (reason is None or c["reason"] == reason)
                and (generation is None or o["status"].get("observedGeneration") == generation))
    return pred


def events_for(kube: KubeCluster, ns: str, name: str) -> list[tuple[str, str, str]]:
    core = client.CoreV1Api(kube.api_client())
    evs = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [(e.type, e.reason, e.message) for e in evs]


KS = {"apiVersion": API_VERSION, "kind": "KillSwitch", "metadata": {"name": "halt-wires"},
      "spec": {"action": "Halt", "scope": {"tool": "wire.send"}, "reason": "fraud pattern",
               "requestedBy": "soc@corp"}}


def test_killswitch_is_projected_updated_and_removed(
    crds: KubeCluster, ns: str, operator: OperatorProcess, r: redis.Redis
) -> None:
    a = api(crds)
    a.create_namespaced_custom_object(GROUP, VERSION, ns, "killswitches", KS)
    obj = wait_status(crds, ns, "killswitches", "halt-wires", "KillSwitch engaged, no agent", operator,
                      ready_is("False", "NoConsumer", generation=1))
    st = obj["status"]
    assert st["engaged"] is True and st["scope"] == "tool:wire.send" and st["observedGeneration"] == 1
    assert condition(obj, "Synced")["reason"] == "Projected"  # type: ignore[index]
    assert FINALIZER in obj["metadata"]["finalizers"]

    key = f"agentsaga:v1:killswitch:{ns}/halt-wires"
    doc = json.loads(r.get(key))  # type: ignore[arg-type]
    assert doc["v"] == 1 and doc["rev"] == st["revision"]
    assert {k: doc[k] for k in ("action", "scope", "reason", "requestedBy", "ttl", "expiresAt")} == {
        "action": "Halt", "scope": "tool:wire.send", "reason": "fraud pattern", "requestedBy": "soc@corp",
        "ttl": None, "expiresAt": None}
    assert doc["engagedAt"] == obj["metadata"]["creationTimestamp"]
    assert r.smembers("agentsaga:v1:killswitch:index") == {f"{ns}/halt-wires"}
    # No agent runs here: engaged in the policy plane, not Ready (nothing applies it), and
    # a Normal Event says so (not a Warning: no agent yet is not a fault).
    assert "Halt: agents refuse new side effects for tool:wire.send" in condition(obj, "Ready")["message"]  # type: ignore[index]
    poll(lambda: ("Normal", "NoConsumer") in {(t, rs) for t, rs, _ in events_for(crds, ns, "halt-wires")},
         timeout=DEADLINE, what="a NoConsumer event")

    # An edit is projected (new generation, new revision) and announced on the channel.
    sub = r.pubsub()
    sub.subscribe("agentsaga:v1:events")
    poll(lambda: sub.get_message(timeout=0.1), timeout=5, what="subscribed")
    a.patch_namespaced_custom_object(GROUP, VERSION, ns, "killswitches", "halt-wires",
                                     {"spec": {"scope": {"tool": "stripe.*"}}})
    obj = wait_status(crds, ns, "killswitches", "halt-wires", "generation 2 reconciled", operator,
                      ready_is("False", "NoConsumer", generation=2))
    assert obj["status"]["scope"] == "tool:stripe.*" and obj["status"]["revision"] > st["revision"]
    assert json.loads(r.get(key))["scope"] == "tool:stripe.*"  # type: ignore[arg-type]
    note = poll(lambda: (m := sub.get_message(timeout=0.2)) and m["type"] == "message" and json.loads(m["data"]),
                timeout=5, what="a change notification")
    assert note == {"rev": obj["status"]["revision"], "v": 1, "kind": "KillSwitch",
                    "id": f"{ns}/halt-wires", "op": "put"}
    sub.close()
    # The edit posts an Event too (still NoConsumer, now for the new scope).
    poll(lambda: [m for t, rs, m in events_for(crds, ns, "halt-wires") if rs == "NoConsumer" and "stripe.*" in m],
         timeout=DEADLINE, what="an Event for the new scope")

    # The periodic resync writes nothing when nothing changed (the revision stays).
    rev = obj["status"]["revision"]
    metrics = poll(lambda: (m := operator.metrics()) and 'trigger="resync"' in m and m, timeout=DEADLINE,
                   what="a resync in /metrics")
    assert 'agentsaga_operator_reconciles_total{kind="KillSwitch",result="ok",trigger="create"} 1.0' in metrics
    assert json.loads(r.get(key))["rev"] == rev  # type: ignore[arg-type]

    # Delete: the finalizer removes the document, then lets the object go.
    a.delete_namespaced_custom_object(GROUP, VERSION, ns, "killswitches", "halt-wires")

    def gone() -> bool:
        try:
            get(crds, ns, "killswitches", "halt-wires")
            return False
        except ApiException as e:
            return e.status == 404

    poll(gone, timeout=DEADLINE, what="the KillSwitch deleted (finalizer removed)")
    assert r.get(key) is None and r.smembers("agentsaga:v1:killswitch:index") == set()
    assert "agentsaga_operator_killswitches_engaged 0.0" in operator.metrics()


def test_ttl_expiry_lifts_the_switch_and_shows_it(
    crds: KubeCluster, ns: str, operator: OperatorProcess, r: redis.Redis
) -> None:
    body = json.loads(json.dumps(KS))
    body["metadata"]["name"] = "drain"
    body["spec"] = {"action": "Drain", "reason": "deploying", "requestedBy": "ci@corp", "ttlSeconds": 3}
    api(crds).create_namespaced_custom_object(GROUP, VERSION, ns, "killswitches", body)
    obj = wait_status(crds, ns, "killswitches", "drain", "engaged", operator, ready_is("False", "NoConsumer"))
    assert obj["status"]["expiresAt"] and r.exists(f"agentsaga:v1:killswitch:{ns}/drain")
    obj = wait_status(crds, ns, "killswitches", "drain", "expired", operator, ready_is("False", "Expired"),
                      timeout=3 + DEADLINE)
    assert obj["status"]["engaged"] is False
    assert condition(obj, "Synced")["reason"] == "Removed"  # type: ignore[index]
    assert not r.exists(f"agentsaga:v1:killswitch:{ns}/drain")
    poll(lambda: ("Normal", "Expired") in {(t, rs) for t, rs, _ in events_for(crds, ns, "drain")},
         timeout=DEADLINE, what="an Expired event")


def test_resync_restores_a_flushed_policy_plane(
    crds: KubeCluster, ns: str, operator: OperatorProcess, fresh_redis: RedisServer, r: redis.Redis
) -> None:
    api(crds).create_namespaced_custom_object(GROUP, VERSION, ns, "killswitches", KS)
    wait_status(crds, ns, "killswitches", "halt-wires", "engaged", operator, ready_is("False", "NoConsumer"))
    key = f"agentsaga:v1:killswitch:{ns}/halt-wires"
    before = json.loads(r.get(key))  # type: ignore[arg-type]
    r.flushall()
    # One resync period (2 s here) plus slack.
    restored = poll(lambda: r.get(key), timeout=2 + DEADLINE, what="the document restored after FLUSHALL")
    after = json.loads(restored)
    assert {k: v for k, v in after.items() if k != "rev"} == {k: v for k, v in before.items() if k != "rev"}
    assert r.smembers("agentsaga:v1:killswitch:index") == {f"{ns}/halt-wires"}


def test_the_synced_marker_comes_back_with_the_resync_and_agents_hold_the_halt_meanwhile(
    crds: KubeCluster, ns: str, operator: OperatorProcess, fresh_redis: RedisServer, r: redis.Redis
) -> None:
    from agent_saga.controls import RedisSwitchStore

    marker = "agentsaga:v1:synced"
    poll(lambda: r.hexists(marker, "operator"), timeout=DEADLINE, what="the marker after start-up")
    api(crds).create_namespaced_custom_object(GROUP, VERSION, ns, "killswitches", KS)
    wait_status(crds, ns, "killswitches", "halt-wires", "engaged", operator, ready_is("False", "NoConsumer"))
    with RedisSwitchStore(fresh_redis.url, grace=60, heartbeat=0.1, namespaces=[ns]) as agent:
        agent.start()
        assert [lv.scope for lv in agent.view().levers] == ["tool:wire.send"]
        assert agent.writers_seen == {"operator"}
        r.flushall()
        poll(lambda: agent.data_lost, timeout=DEADLINE, what="the agent to notice the data loss")
        view = agent.view()
        assert view.usable and view.degraded and [lv.scope for lv in view.levers] == ["tool:wire.send"]
        # The resync re-projects the document, then the marker (never the other way round).
        poll(lambda: r.hexists(marker, "operator"), timeout=2 + DEADLINE, what="the marker after FLUSHALL")
        assert r.get(f"agentsaga:v1:killswitch:{ns}/halt-wires") is not None
        poll(lambda: agent.data_lost is None, timeout=DEADLINE, what="the agent to trust the plane again")
        view = agent.view()
        assert view.usable and view.degraded is None and [lv.scope for lv in view.levers] == ["tool:wire.send"]
    assert "synced marker" in operator.log()




#: With no agent running, what each example's status honestly says: nothing applies any of
#: them, so none is Ready (each is Synced: in the policy plane).
NO_AGENT_READY = ("False", "NoConsumer")


def test_examples_apply_cleanly_and_become_ready(crds: KubeCluster, ns: str, operator: OperatorProcess,
                                                 r: redis.Redis) -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert {f.name for f in files} >= {"killswitch.yaml", "budget.yaml", "policy.yaml", "modelroute.yaml"}
    out = crds.kubectl("apply", "-n", ns, "-f", "-", input="---\n".join(in_namespace(f, ns) for f in files)).stdout
    objects = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert len(objects) == 7, out  # 4 BudgetLimits, 1 each of the others
    for ref in objects:
        kind_singular, name = ref.split("/")
        singular = kind_singular.split(".")[0]
        plural = {m.info.singular: m.info.plural for m in KINDS}[singular]
        status, reason = NO_AGENT_READY
        obj = wait_status(crds, ns, plural, name, f"{ref} Ready={status}", operator, ready_is(status, reason))
        synced = condition(obj, "Synced")
        assert synced is not None and synced["status"] == "True", obj
    assert r.scard("agentsaga:v1:budgetlimit:index") == 4
    policy = json.loads(r.get(f"agentsaga:v1:sagapolicy:{ns}/payments-agent"))  # type: ignore[arg-type]
    assert policy["policy"]["tools"]["stripe__create_charge"] == {
        "semantics": "COMPENSABLE", "compensate": {"tool": "stripe__create_refund", "args": {"charge": "$.id"}},
        "policyArgs": {"amount": "$.amount", "customer_id": "$.customer"}}
    assert policy["policy"]["undeclaredTools"] == "Refuse"
    listing = crds.kubectl("get", "agentsaga", "-n", ns).stdout
    for name in ("halt-wire-send", "daily-spend", "payments-agent", "default"):
        assert name in listing


def test_redis_outage_is_reported_and_retried(
    crds: KubeCluster, ns: str, operator: OperatorProcess, fresh_redis: RedisServer
) -> None:
    fresh_redis.stop()
    api(crds).create_namespaced_custom_object(GROUP, VERSION, ns, "killswitches", KS)

    def synced_false(o: dict[str, Any]) -> bool:
        c = condition(o, "Synced")
        return c is not None and c["status"] == "False" and c["reason"] == "RedisUnavailable"

    obj = wait_status(crds, ns, "killswitches", "halt-wires", "Synced=False RedisUnavailable", operator, synced_false)
    assert condition(obj, "Ready")["status"] == "Unknown"  # type: ignore[index]
    fresh_redis.start()
    wait_status(crds, ns, "killswitches", "halt-wires", "projected once Redis is back", operator,
                ready_is("False", "NoConsumer"))
    assert 'agentsaga_operator_redis_errors_total{kind="KillSwitch"}' in operator.metrics()


def test_a_standby_replica_does_not_double_process(
    crds: KubeCluster, ns: str, fresh_redis: RedisServer, tmp_path: Path
) -> None:
    # A KopfPeering named like the operator's --peering makes the replicas see each other;
    # the lower priority pauses in favour of the higher.
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "agent-saga"}}
    crds.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(peering))
    common = ["--health-host", "127.0.0.1", "--resync-interval", "60"]
    active = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "active.log", namespaces=[ns],
                             extra_args=[*common, "--priority", "10"])
    # The standby logs at DEBUG: kopf says when each watch-stream is actually paused.
    standby = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "standby.log", namespaces=[ns],
                              extra_args=[*common, "--priority", "5", "--log-level", "DEBUG"])
    with active, standby:
        active.wait_ready()
        standby.wait_ready()
        poll(lambda: "Pausing operations in favour of" in standby.log(100_000), timeout=DEADLINE,
             what="the standby decides to pause")
        # The decision is logged before the streams close: an object created in between
        # reaches the standby's still-open KillSwitch stream and both replicas process it.
        # Only once kopf reports that stream paused is the standby deaf to a new object.
        paused = f"Pausing the watch-stream for killswitches.{VERSION}.{GROUP} in {ns!r}"
        poll(lambda: paused in standby.log(100_000), timeout=DEADLINE, what="the standby's KillSwitch stream pauses")
        api(crds).create_namespaced_custom_object(GROUP, VERSION, ns, "killswitches", KS)
        wait_status(crds, ns, "killswitches", "halt-wires", "projected", active, ready_is("False", "NoConsumer"))
        assert 'kind="KillSwitch",result="ok",trigger="create"} 1.0' in active.metrics()
        assert 'kind="KillSwitch"' not in standby.metrics()
    assert active.proc is not None and active.proc.poll() is not None
    assert standby.proc is not None and standby.proc.poll() is not None


def _approval(name: str, deadline: str, **decision: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Approval", "metadata": {"name": name}, "spec": {
        "requestId": name, "tool": "wire.send", "sagaId": "saga-1", "stepId": "s1", "rule": "irreversible",
        "argumentsDigest": "sha256:" + "ab" * 32, "requestedAt": "2026-07-01T12:00:00Z", "deadline": deadline,
        **decision}}


def test_finished_approvals_are_deleted_after_their_ttl(
    crds: KubeCluster, ns: str, fresh_redis: RedisServer, tmp_path: Path
) -> None:
    """--approval-ttl-after-finished: a decided Approval is deleted that long after its
    decision (like a Job's ttlSecondsAfterFinished); a pending one stays."""
    op = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--health-host", "127.0.0.1",
                                     "--approval-ttl-after-finished", "1"])
    with op:
        op.wait_ready()
        custom = api(crds)
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, "approvals",
                                               _approval("pending-one", "2099-01-01T00:00:00Z"))
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, "approvals", _approval(
            "decided-one", "2099-01-01T00:00:00Z", decision="Approved", approver="risk@corp"))
        decided = wait_status(crds, ns, "approvals", "decided-one", "Approved", op,
                              lambda o: (o.get("status") or {}).get("phase") == "Approved")
        assert decided["status"]["decidedAt"]

        def gone() -> bool | None:
            try:
                get(crds, ns, "approvals", "decided-one")
            except ApiException as e:
                return True if e.status == 404 else None
            return None
        poll(gone, timeout=DEADLINE, what="the decided Approval deleted after its TTL")
        assert "deleted finished Approval" in op.log()
        # The pending one is never a janitor's business.
        assert (get(crds, ns, "approvals", "pending-one").get("status") or {}).get("phase") == "Pending"
