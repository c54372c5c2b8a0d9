"""Acceptance: kubectl drives real agent processes through the operator and Redis.

The agents (``operator_agent.py``) are separate processes that import only the runtime
and read the policy plane (kill switch, limits, approvals) from Redis; they never talk
to the Kubernetes API. Each test applies resources with kubectl and waits, with a
deadline, for the agents' next calls to change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from agent_process import AgentProcess
from agent_saga_operator.models import GROUP, VERSION
from agent_saga_operator.testing import OperatorProcess, poll
from example_manifests import in_namespace
from fixtures.controlplane import KubeCluster
from fixtures.redis_server import RedisServer
from kubernetes import client

pytestmark = pytest.mark.e2e
NS_PREFIX = "ag"  # the tests' namespaces: ag-<hex>

ROOT = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("operator_agent.py")
DEADLINE = 20.0
ANSWERED = 60.0  # seconds an answered approval request may wait: a CLI start on a loaded machine
# Seconds a request made while the operator is down stays pending: the restart must see it
# pending (a decided one is no longer in the pending set), and one takes ~8 s at load 11.
ACROSS_RESTART = 20.0
STARTED = 60.0  # seconds an agent process may take to start and connect on a loaded machine


# ---------------------------------------------------------------------- parts
def start_operator(kube: KubeCluster, url: str, ns: str, log: Path) -> OperatorProcess:
    op = OperatorProcess(kube.kubeconfig, url, log, namespaces=[ns],
                         extra_args=["--standalone", "--resync-interval", "2", "--usage-interval", "0.5",
                                     "--retry-delay", "0.5", "--approval-poll-interval", "0.5",
                                     "--health-host", "127.0.0.1"])
    op.start()
    op.wait_ready()
    return op


@pytest.fixture
def operator(crds: KubeCluster, fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = start_operator(crds, fresh_redis.url, ns, tmp_path / "operator.log")
    try:
        yield op
    finally:
        op.stop()


class Agent(AgentProcess):
    """One ``operator_agent.py`` process; ``send`` a command and wait for its answer."""

    def __init__(self, url: str, ns: str, wal_dir: Path, approval_timeout: float = 30.0, grace: float = 5.0) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "runtime"), env.get("PYTHONPATH", "")])
        super().__init__([sys.executable, str(AGENT), url, ns, str(wal_dir), str(approval_timeout), str(grace)], env,
                         wal_dir.with_suffix(".stderr"), ready_timeout=STARTED)

    def send(self, op: str, timeout: float = DEADLINE, **kw: Any) -> dict[str, Any]:
        return super().send(op, timeout, **kw)


@pytest.fixture
def agents(fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[list[Agent]]:
    made: list[Agent] = []
    try:
        made.extend(Agent(fresh_redis.url, ns, tmp_path / f"agent{i}", approval_timeout=8.0) for i in range(2))
        yield made
    finally:
        for a in made:
            a.close()


def co(kube: KubeCluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api_client())


def get(kube: KubeCluster, ns: str, plural: str, name: str) -> dict[str, Any]:
    return cast(dict[str, Any], co(kube).get_namespaced_custom_object(GROUP, VERSION, ns, plural, name))


def apply(kube: KubeCluster, ns: str, manifest: dict[str, Any] | Path) -> None:
    if isinstance(manifest, Path):
        kube.kubectl("apply", "-n", ns, "-f", "-", input=in_namespace(manifest, ns))
    else:
        kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def approval_events(kube: KubeCluster, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    """The Events about Approval ``name`` with ``reason`` (newest last)."""
    out = kube.kubectl("get", "events", "-n", ns, "-o", "json",
                       "--field-selector", f"involvedObject.kind=Approval,involvedObject.name={name}").stdout
    return [e for e in json.loads(out)["items"] if e["reason"] == reason]


def switch(name: str, action: str, scope: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"action": action, "reason": "e2e", "requestedBy": "soc@corp"}
    if scope:
        spec["scope"] = scope
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KillSwitch", "metadata": {"name": name}, "spec": spec}


def until_call(agent: Agent, ok: bool, op: OperatorProcess, **kw: Any) -> dict[str, Any]:
    """Call until the agent's answer is ``ok`` (refusals cost nothing: nothing runs)."""
    def attempt() -> dict[str, Any] | None:
        a = agent.send("call", **kw)
        return a if a["ok"] is ok else None
    try:
        return cast(dict[str, Any], poll(attempt, timeout=DEADLINE,
                                         what=f"agent call {'allowed' if ok else 'refused'}", interval=0.05))
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator log ---\n{op.log()}") from None


# ---------------------------------------------------------------------- kill switch
def test_kill_switch_halts_drains_and_quarantines_running_agents(
    crds: KubeCluster, ns: str, operator: OperatorProcess, agents: list[Agent]
) -> None:
    agent = agents[0]
    assert agent.send("call", tool="wire.send", amount=1)["ok"]

    # Halt: kubectl apply -> the agent's next wire.send is refused; others still run.
    apply(crds, ns, ROOT / "examples/k8s/killswitch.yaml")
    refused = until_call(agent, False, operator, tool="wire.send", amount=1)
    assert "fraud pattern" in refused["error"], refused
    assert agent.send("call", tool="ledger.post", amount=1)["ok"]
    crds.kubectl("delete", "-n", ns, "-f", "-", input=in_namespace(ROOT / "examples/k8s/killswitch.yaml", ns))
    until_call(agent, True, operator, tool="wire.send", amount=1)

    # Drain: the running saga finishes its steps; new sagas are refused.
    opened = agent.send("open", saga="long")
    assert opened["ok"], opened
    apply(crds, ns, switch("drain-all", "Drain"))
    until_call(agent, False, operator, tool="wire.send", amount=1)
    step = agent.send("step", saga="long", tool="wire.send", amount=1)
    assert step["ok"], step
    assert agent.send("close", saga="long")["ok"]
    crds.kubectl("delete", "-n", ns, "killswitch", "drain-all")
    until_call(agent, True, operator, tool="wire.send", amount=1)

    # Quarantine: one saga stops; its sibling carries on.
    a, b = agent.send("open", saga="q-a"), agent.send("open", saga="q-b")
    assert a["ok"] and b["ok"], (a, b)
    apply(crds, ns, switch("freeze-a", "Quarantine", {"sagaId": a["saga"]}))

    def frozen() -> dict[str, Any] | None:
        s = agent.send("step", saga="q-a", tool="wire.send", amount=1)
        return s if not s["ok"] else None
    stopped = poll(frozen, timeout=DEADLINE, what="quarantined saga refused")
    assert "Quarantine" in stopped["kind"] or "quarantin" in stopped["error"].lower(), stopped
    assert agent.send("step", saga="q-b", tool="wire.send", amount=1)["ok"]
    assert agent.send("close", saga="q-b")["ok"]
    agent.send("close", saga="q-a")


# ---------------------------------------------------------------------- limits
def test_budget_limit_is_enforced_fleet_wide_follows_edits_and_reports_spend(
    crds: KubeCluster, ns: str, operator: OperatorProcess, agents: list[Agent]
) -> None:
    one, two = agents
    limit = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BudgetLimit", "metadata": {"name": "wires"},
             "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 100, "window": "1h", "tools": ["wire.*"]}}
    apply(crds, ns, limit)
    # Both agents have the definition once a call over the whole budget is refused (a
    # refused call debits nothing).
    for agent in (one, two):
        refused = until_call(agent, False, operator, tool="wire.send", amount=1000)
        assert f"limit:{ns}.wires" in refused["error"] or "wires" in refused["error"], refused
    assert one.send("call", tool="wire.send", amount=40)["ok"]
    assert two.send("call", tool="wire.send", amount=40)["ok"]
    over = one.send("call", tool="wire.send", amount=40)   # 120 > 100, whichever process asks
    assert not over["ok"] and "wires" in over["error"], over
    assert not two.send("call", tool="wire.send", amount=40)["ok"]

    crds.kubectl("patch", "-n", ns, "budgetlimit", "wires", "--type=merge", "-p",
                 json.dumps({"spec": {"maxTotal": 200}}))
    until_call(two, True, operator, tool="wire.send", amount=40)   # 120 <= 200 now

    def spend() -> dict[str, Any] | None:
        o = get(crds, ns, "budgetlimits", "wires")
        st = o.get("status") or {}
        return st if st.get("used") == 120 and st.get("max") == 200 else None
    st = poll(spend, timeout=DEADLINE, what="status shows the spend")
    assert st["remaining"] == 80
    assert "120" in crds.kubectl("get", "budgetlimits", "-n", ns, "-o", "wide").stdout or st["used"] == 120


# ---------------------------------------------------------------------- approvals
def approvals(kube: KubeCluster, ns: str) -> list[dict[str, Any]]:
    listing = cast(dict[str, Any], co(kube).list_namespaced_custom_object(GROUP, VERSION, ns, "approvals"))
    return cast(list[dict[str, Any]], listing["items"])


def test_irreversible_calls_become_approvals_answered_with_kubectl_or_the_cli(
    crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, agents: list[Agent],
    tmp_path: Path,
) -> None:
    agent = agents[0]
    # 1. kubectl approves: the waiting saga proceeds.
    # Requests the test answers wait long enough for a loaded machine; the one left
    # unanswered (5.) keeps the agents' short deadline.
    waiting = agent.submit("call", name="wire-final", tool="wire.final", semantics="IRREVERSIBLE", amount=900,
                           approval_timeout=ANSWERED)
    first = poll(lambda: approvals(crds, ns), timeout=DEADLINE, what="an Approval appears")[0]
    name = first["metadata"]["name"]
    assert first["spec"]["tool"] == "wire.final" and first["spec"]["display"] == {"amount": "900"}
    assert name in crds.kubectl("get", "approvals", "-n", ns).stdout
    crds.kubectl("patch", "-n", ns, "approval", name, "--type=merge", "-p",
                 json.dumps({"spec": {"decision": "Approved", "approver": "risk@corp", "note": "phoned"}}))
    answer = agent.wait(waiting)
    assert answer["ok"], answer
    # The decision is the runtime's document, at the runtime's key.
    r = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    doc = json.loads(r.get(f"agentsaga:v1:approval:decision:{name}") or "{}")
    assert (doc["decision"], doc["approver"]) == ("approved", "risk@corp")
    # 2. Changing a decision afterwards is refused by the API server.
    changed = crds.kubectl("patch", "-n", ns, "approval", name, "--type=merge", "-p",
                           json.dumps({"spec": {"decision": "Denied"}}), check=False)
    assert changed.returncode != 0 and "immutable" in changed.stderr, changed.stderr

    # 3. Decided with the CLI (Redis only, no cluster): reflected in the Approval's status.
    cli_call = agent.submit("call", name="wire-cli", tool="wire.final", semantics="IRREVERSIBLE", amount=5,
                            approval_timeout=ANSWERED)
    second = poll(lambda: [a for a in approvals(crds, ns) if a["metadata"]["name"] != name], timeout=DEADLINE,
                  what="a second Approval")[0]["metadata"]["name"]
    env = {**os.environ, "AGENT_SAGA_APPROVAL_STORE": fresh_redis.url}
    cli = subprocess.run([sys.executable, "-m", "agent_saga.cli", "approvals", "approve", second,
                          "--approver", "cfo@corp"], capture_output=True, text=True, env=env, timeout=30)
    assert cli.returncode == 0, cli.stderr
    assert agent.wait(cli_call)["ok"]

    def reflected() -> dict[str, Any] | None:
        st = get(crds, ns, "approvals", second).get("status") or {}
        return st if st.get("phase") == "Approved" and st.get("approver") == "cfo@corp" else None
    st = poll(reflected, timeout=DEADLINE, what="CLI decision reflected in status")
    assert st["source"].startswith("cli")
    # ... with the Event a kubectl decision gets, posted by the operator (not "kopf").
    for approval, approver in ((second, "cfo@corp"), (name, "risk@corp")):
        event = poll(lambda a=approval: approval_events(crds, ns, a, "Approved"), timeout=DEADLINE,
                     what=f"an Approved Event for {approval}")[0]
        assert approver in event["message"] and event["type"] == "Normal", event
        assert event["source"]["component"] == "agent-saga-operator", event
    # A kubectl decision made after the CLI's loses: the phase is the CLI's, and Ready
    # follows that phase (True: the saga proceeds), saying the other was not written.
    crds.kubectl("patch", "-n", ns, "approval", second, "--type=merge", "-p",
                 json.dumps({"spec": {"decision": "Denied", "approver": "late@corp"}}))

    def conflicted() -> dict[str, Any] | None:
        o = get(crds, ns, "approvals", second)
        conds = {c["type"]: c for c in (o.get("status") or {}).get("conditions", [])}
        return o if conds.get("Synced", {}).get("reason") == "Conflict" else None
    lost = poll(conflicted, timeout=DEADLINE, what="the late kubectl decision reported as a Conflict")["status"]
    ready = {c["type"]: c for c in lost["conditions"]}["Ready"]
    assert lost["phase"] == "Approved" and lost["approver"] == "cfo@corp", lost
    assert ready["status"] == "True" and ready["reason"] == "Conflict", ready
    assert "approved by cfo@corp" in ready["message"] and "was not written" in ready["message"], ready

    # 4. Operator killed and restarted while a request is pending: no duplicate.
    operator.kill()
    late = agent.submit("call", name="wire-late", tool="wire.final", semantics="IRREVERSIBLE", amount=7,
                        approval_timeout=ACROSS_RESTART)
    poll(lambda: r.zcard("agentsaga:v1:approval:pending") == 1, timeout=DEADLINE, what="request pending")
    op2 = start_operator(crds, fresh_redis.url, ns, tmp_path / "operator2.log")
    try:
        third = poll(lambda: [a for a in approvals(crds, ns) if a["metadata"]["name"] not in (name, second)],
                     timeout=DEADLINE, what="Approval made after the restart")[0]["metadata"]["name"]
        op2.stop()
        op3 = start_operator(crds, fresh_redis.url, ns, tmp_path / "operator3.log")
        try:
            # 5. Unanswered: the deadline passes, the agent is refused, the Approval shows Expired.
            expired = agent.wait(late, timeout=ACROSS_RESTART + DEADLINE)
            assert not expired["ok"] and "expiry denies" in expired["error"], expired

            def shown() -> dict[str, Any] | None:
                o = get(crds, ns, "approvals", third)
                return o if (o.get("status") or {}).get("phase") == "Expired" else None
            poll(shown, timeout=DEADLINE, what="Approval shown as Expired")
            names = [a["metadata"]["name"] for a in approvals(crds, ns)]
            assert sorted(names) == sorted({name, second, third}), names   # no duplicates
            out = crds.kubectl("get", "approvals", "-n", ns).stdout
            assert "Expired" in out and "risk@corp" in out and "cfo@corp" in out, out
            # An expiry has no approver: the column is empty, not the runtime's name.
            expired_obj = get(crds, ns, "approvals", third)
            assert "approver" not in expired_obj["status"], expired_obj["status"]
            row = crds.kubectl("get", "approval", third, "-n", ns, "--no-headers").stdout.split()
            assert row[3] == "Expired" and row[4].startswith(expired_obj["spec"]["deadline"][:19]), row
        finally:
            op3.stop()
    finally:
        op2.stop()
        r.close()


def test_requests_decided_or_expired_while_no_operator_ran_still_become_approvals(
    crds: KubeCluster, fresh_redis: RedisServer, ns: str, agents: list[Agent], tmp_path: Path,
) -> None:
    """No operator runs while one request expires and another is denied with the CLI:
    neither is pending any more, and both become Approvals showing their decision when an
    operator starts; a second operator makes no duplicate."""
    agent = agents[0]
    r = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    try:
        # 1. Unanswered: the agent's deadline passes and it denies (an `expired` decision).
        expired = agent.send("call", name="wire-unseen", tool="wire.final", semantics="IRREVERSIBLE", amount=3,
                             approval_timeout=1.0, timeout=DEADLINE + 1.0)
        assert not expired["ok"] and "expiry denies" in expired["error"], expired
        (expired_id,) = r.zrange("agentsaga:v1:approval:unmirrored", 0, -1)
        # 2. Denied with the CLI (Redis only) while nobody mirrors it.
        denied_call = agent.submit("call", name="wire-denied", tool="wire.final", semantics="IRREVERSIBLE",
                                   amount=4, approval_timeout=ANSWERED)
        poll(lambda: r.zcard("agentsaga:v1:approval:pending") == 1, timeout=DEADLINE, what="request pending")
        (denied_id,) = r.zrange("agentsaga:v1:approval:pending", 0, -1)
        env = {**os.environ, "AGENT_SAGA_APPROVAL_STORE": fresh_redis.url}
        cli = subprocess.run([sys.executable, "-m", "agent_saga.cli", "approvals", "deny", denied_id,
                              "--approver", "cfo@corp", "--note", "no operator"], capture_output=True, text=True,
                             env=env, timeout=30)
        assert cli.returncode == 0, cli.stderr
        answer = agent.wait(denied_call)
        assert not answer["ok"] and "cfo@corp" in answer["error"], answer
        assert r.zcard("agentsaga:v1:approval:pending") == 0, "both decided: nothing is pending"
        assert sorted(r.zrange("agentsaga:v1:approval:unmirrored", 0, -1)) == sorted([expired_id, denied_id])
        assert approvals(crds, ns) == []

        # 3. An operator starts: both become Approvals, each with its decision in the status.
        op = start_operator(crds, fresh_redis.url, ns, tmp_path / "operator.log")
        try:
            def shown() -> dict[str, str] | None:
                phases = {a["metadata"]["name"]: (a.get("status") or {}).get("phase") for a in approvals(crds, ns)}
                return phases if phases == {expired_id: "Expired", denied_id: "Denied"} else None
            try:
                poll(shown, timeout=DEADLINE, what="both decisions shown on Approvals")
            except AssertionError as e:
                raise AssertionError(f"{e}\n--- operator log ---\n{op.log()}") from None
            assert get(crds, ns, "approvals", denied_id)["status"]["approver"] == "cfo@corp"
            poll(lambda: r.zcard("agentsaga:v1:approval:unmirrored") == 0, timeout=DEADLINE,
                 what="the mirrored requests leave the unmirrored set")
        finally:
            op.stop()
        # 4. Another operator: nothing left to mirror, no duplicate.
        op2 = start_operator(crds, fresh_redis.url, ns, tmp_path / "operator2.log")
        try:
            names = sorted(a["metadata"]["name"] for a in approvals(crds, ns))
            assert names == sorted([expired_id, denied_id]), names
        finally:
            op2.stop()
    finally:
        r.close()
