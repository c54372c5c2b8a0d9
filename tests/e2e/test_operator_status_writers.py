"""Two writers of one status: the reconcile handler and the acknowledgement tally.

The reconcile handler computes a KillSwitch's status from the heartbeats it had read and
kopf applies it after the handler returns, as a merge patch without a resourceVersion.
When every agent applies the switch in between, the tally writes ``3/3`` first and the
handler's ``Lagging 0/3`` lands on top. The tally must see that write (kopf's watch) and
correct it at once, not at the next resync. Real operator, API server, Redis and agents;
the handler's late patch is the one ``handlers.reconcile`` computes, applied the way kopf
applies it. Every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga_operator.acks import Fleet, read_fleet
from agent_saga_operator.config import Context, OperatorConfig
from agent_saga_operator.documents import Identity
from agent_saga_operator.handlers import _status_patch
from agent_saga_operator.models import GROUP, VERSION, KillSwitchSpec
from agent_saga_operator.reconcilers import reconcile_killswitch
from agent_saga_operator.testing import OperatorProcess, poll
from fixtures.controlplane import KubeCluster
from fixtures.redis_server import RedisServer
from kubernetes import client
from test_plane_agents import acked, apply, condition, get, killswitch, plane_env, spawn, wait_for

pytestmark = pytest.mark.e2e
NS_PREFIX = "sw"
DEADLINE = 30.0
__all__ = ["spawn"]  # the agents fixture, shared with test_plane_agents


@pytest.fixture
def operator(crds: KubeCluster, fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    # No resync within the test: whatever corrects the status is the tally, not the timer.
    op = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--resync-interval", "3600", "--ack-interval", "0.5",
                                     "--retry-delay", "0.5", "--health-host", "127.0.0.1"])
    op.start()
    op.wait_ready()
    try:
        yield op
    finally:
        op.stop()


async def _fleet(url: str) -> Fleet:
    import redis.asyncio

    r = redis.asyncio.Redis.from_url(url)
    try:
        return await read_fleet(r, "agentsaga:v1")
    finally:
        await r.aclose()


async def _handler_patch(url: str, obj: dict[str, Any], fleet: Fleet) -> dict[str, Any]:
    """The status patch the reconcile handler writes for ``obj`` on its create event
    (status still empty) when the heartbeats it had read are ``fleet``."""
    ctx = Context.create(OperatorConfig(redis_url=url))
    ctx.fleet = fleet
    try:
        meta = obj["metadata"]
        outcome = await reconcile_killswitch(ctx, KillSwitchSpec.model_validate(obj["spec"]),
                                             Identity.from_meta(meta), {}, _now())
        diff, _, _ = _status_patch({}, outcome, int(meta["generation"]), _now())
        return json.loads(json.dumps(diff))  # type: ignore[no-any-return]
    finally:
        await ctx.aclose()


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def test_a_handler_patch_landing_after_the_tally_is_corrected_without_a_resync(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, spawn: Any) -> None:
    for i in range(3):
        spawn(plane_env(fresh_redis.url, ns, "payments-agent", f"pod-{i}"), f"a{i}")
    # The heartbeats as the handler had read them: three agents, none applies the switch yet.
    before = poll(lambda: (f if len((f := asyncio.run(_fleet(fresh_redis.url))).beats) == 3 else None),
                  timeout=DEADLINE, what="three live heartbeats")
    apply(crds, ns, killswitch("halt-wire-send", "wire.send"))
    obj = wait_for(crds, ns, "killswitches", "halt-wire-send", "3/3 acknowledged", acked("True", 3, 1), operator)

    late = asyncio.run(_handler_patch(fresh_redis.url, obj, before))
    assert late["acked"] == "0/3", late
    overwritten = client.CustomObjectsApi(crds.api_client()).patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, "killswitches", "halt-wire-send", {"status": late})
    ack = condition(overwritten, "Acknowledged")
    assert ack is not None and (ack["status"], ack["reason"]) == ("False", "Lagging"), ack  # the race, staged

    obj = wait_for(crds, ns, "killswitches", "halt-wire-send", "3/3 again after the late patch",
                   acked("True", 3, 1), operator)
    assert obj["status"]["acked"] == "3/3"
    assert get(crds, ns, "killswitches", "halt-wire-send")["status"]["agents"]["lagging"] == []


def _events(kube: KubeCluster, ns: str, name: str) -> set[tuple[str, str]]:
    core = client.CoreV1Api(kube.api_client())
    return {(e.type, e.reason) for e in core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}").items}


def test_warning_events_are_for_real_problems_and_every_log_line_names_its_object(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess) -> None:
    from agent_saga.heartbeat import AppliedState, HeartbeatWriter

    # An agent that matches the SagaPolicy but has not applied it (it lists no policy).
    beat = HeartbeatWriter(fresh_redis.url, namespace=ns, agent="payments-agent", pod="pod-0",
                           state=lambda: AppliedState(posture="ok", killswitches=(), policies=(), limits=()),
                           interval=0.3)
    beat.start()
    try:
        apply(crds, ns, {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "SagaPolicy",
                         "metadata": {"name": "payments-agent"}, "spec": {"mode": "Enforce"}})
        wait_for(crds, ns, "sagapolicies", "payments-agent", "NotApplied",
                 lambda o: (condition(o, "Ready") or {}).get("reason") == "NotApplied", operator)
        poll(lambda: ("Normal", "NotApplied") in _events(crds, ns, "payments-agent"), timeout=DEADLINE,
             what="a Normal NotApplied event")
    finally:
        beat.close()
    pending = {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "Approval", "metadata": {"name": "req-1"},
               "spec": {"requestId": "req-1", "tool": "wire.send", "sagaId": "saga-1", "stepId": "s1",
                        "rule": "irreversible", "argumentsDigest": "sha256:" + "ab" * 32,
                        "requestedAt": "2026-07-01T12:00:00Z", "deadline": "2099-01-01T00:00:00Z"}}
    apply(crds, ns, pending)
    poll(lambda: ("Normal", "Pending") in _events(crds, ns, "req-1"), timeout=DEADLINE,
         what="a Normal Pending event")
    # A real problem still warns: a limit whose name the store cannot hold.
    long = "l" * 95
    apply(crds, ns, {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "BudgetLimit", "metadata": {"name": long},
                     "spec": {"kind": "Rate", "maxCalls": 5, "window": "1m"}})
    poll(lambda: ("Warning", "Invalid") in _events(crds, ns, long), timeout=DEADLINE, what="a Warning Invalid event")
    assert all(t == "Normal" for t, _ in _events(crds, ns, "payments-agent") | _events(crds, ns, "req-1"))

    log = operator.log(1_000_000)
    assert f"[{ns}/payments-agent] " in log and f"[{ns}/req-1] " in log, log[-3000:]
    handled = [line for line in log.splitlines() if "Handler " in line]
    assert handled and all(f"[{ns}/" in line for line in handled), handled
    assert "GET /healthz" not in log  # the probes (wait_ready polled it) are not logged


def test_ready_acked_and_acknowledged_mean_the_same_on_every_lever(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, spawn: Any) -> None:
    for i in range(2):
        spawn(plane_env(fresh_redis.url, ns, "payments-agent", f"pod-{i}"), f"a{i}")
    apply(crds, ns, {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "BudgetLimit", "metadata": {"name": "wires"},
                     "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 100, "window": "1h"}})
    apply(crds, ns, killswitch("halt-wire-send", "wire.send"))
    for plural, name, reason in (("budgetlimits", "wires", "Enforced"), ("killswitches", "halt-wire-send", "Engaged")):
        obj = wait_for(crds, ns, plural, name, "acknowledged by both agents", acked("True", 2, 1), operator)
        ready = condition(obj, "Ready")
        assert ready is not None and (ready["status"], ready["reason"]) == ("True", reason), ready
        assert "applied by 2 of 2 agent(s)" in ready["message"] and obj["status"]["acked"] == "2/2"
    table = crds.kubectl("get", "budgetlimits", "-n", ns).stdout
    assert "ACKED" in table.splitlines()[0] and "2/2" in table and "True" in table, table

    # A policy no live agent matches: not Ready, and it says which namespaces agents read.
    apply(crds, ns, {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "SagaPolicy", "metadata": {"name": "billing"},
                     "spec": {"mode": "Enforce", "appliesTo": {"agents": ["billing-*"]}}})
    obj = wait_for(crds, ns, "sagapolicies", "billing", "NoConsumer",
                   lambda o: (condition(o, "Ready") or {}).get("reason") == "NoConsumer", operator)
    assert obj["status"]["acked"] == "0/0"
    assert f"live agents read {ns} (2)" in condition(obj, "Ready")["message"]  # type: ignore[index]
    assert condition(obj, "Acknowledged")["reason"] == "NoAgents"  # type: ignore[index]
