"""Acceptance: agents wired by one setting obey every lever, and status says which obey.

The agents (``plane_agent.py``) are separate processes configured by the environment
alone — exactly the block the chart's NOTES.txt prints — and use only ``AgentKit``'s
defaults. kubectl drives them through the operator and Redis; status comes from their
heartbeats. Every wait polls with a deadline.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from agent_process import AgentProcess
from agent_saga_operator.models import GROUP, VERSION
from agent_saga_operator.testing import OperatorProcess, poll
from chart_helpers import CHART, Helm, container_env
from fixtures.controlplane import KubeCluster
from fixtures.redis_server import RedisServer
from kubernetes import client

pytestmark = pytest.mark.e2e
NS_PREFIX = "pa"  # the tests' namespaces: pa-<hex>

ROOT = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("plane_agent.py")
DEADLINE = 30.0
API = f"{GROUP}/{VERSION}"


# ---------------------------------------------------------------------- parts
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


def plane_env(url: str, ns: str, agent: str, pod: str, **extra: str) -> dict[str, str]:
    return {"AGENT_SAGA_REDIS_URL": url, "AGENT_SAGA_NAMESPACE": ns, "AGENT_SAGA_AGENT": agent,
            "POD_NAME": pod, "AGENT_SAGA_HEARTBEAT_INTERVAL": "0.3", **extra}


class PlaneAgent(AgentProcess):
    """One ``plane_agent.py`` process wired by ``env`` alone."""

    def __init__(self, env: dict[str, str], workdir: Path, *, expect_ready: bool = True) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
        full.update(env)
        full["AGENT_SAGA_WAL_PATH"] = str(workdir / "agent.wal")
        full["PYTHONPATH"] = os.pathsep.join([str(ROOT / "runtime"), full.get("PYTHONPATH", "")])
        super().__init__([sys.executable, str(AGENT)], full, workdir / "agent.stderr", cwd=workdir,
                         ready_timeout=DEADLINE if expect_ready else None)

    def call(self, tool: str, amount: float = 1, timeout: float = DEADLINE) -> dict[str, Any]:
        return self.wait(self.submit("call", tool=tool, amount=amount), timeout)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    made: list[PlaneAgent] = []

    def make(env: dict[str, str], name: str, **kw: Any) -> PlaneAgent:
        a = PlaneAgent(env, tmp_path / name, **kw)
        made.append(a)
        return a

    yield make
    for a in made:
        a.close()


def co(kube: KubeCluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api_client())


def get(kube: KubeCluster, ns: str, plural: str, name: str) -> dict[str, Any]:
    return cast(dict[str, Any], co(kube).get_namespaced_custom_object(GROUP, VERSION, ns, plural, name))


def apply(kube: KubeCluster, ns: str, manifest: dict[str, Any]) -> None:
    kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == type_), None)


def wait_for(kube: KubeCluster, ns: str, plural: str, name: str, what: str, pred: Any,
             op: OperatorProcess, timeout: float = DEADLINE) -> dict[str, Any]:
    try:
        return poll(lambda: (o if pred(o := get(kube, ns, plural, name)) else None), timeout=timeout, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}\nlast: {json.dumps(get(kube, ns, plural, name).get('status'))}\n"
                             f"--- operator log ---\n{op.log()}") from None


def acked(status: str, n: int, generation: int | None = None) -> Any:
    def pred(o: dict[str, Any]) -> bool:
        c = condition(o, "Acknowledged")
        agents = (o.get("status") or {}).get("agents") or {}
        return (c is not None and c["status"] == status and agents.get("acknowledged") == n
                and (generation is None or c.get("observedGeneration") == generation))
    return pred


def until_call(agent: PlaneAgent, ok: bool, tool: str, amount: float = 1) -> dict[str, Any]:
    """Call until the agent's answer is ``ok`` (refusals cost nothing: nothing runs)."""
    def attempt() -> dict[str, Any] | None:
        a = agent.call(tool, amount)
        return a if a["ok"] is ok else None
    return cast(dict[str, Any], poll(attempt, timeout=DEADLINE, what=f"{tool} {'allowed' if ok else 'refused'}",
                                     interval=0.05))


def killswitch(name: str, tool: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "KillSwitch", "metadata": {"name": name},
            "spec": {"action": "Halt", "scope": {"tool": tool}, "reason": "e2e halt", "requestedBy": "soc@corp"}}


def saga_policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "SagaPolicy", "metadata": {"name": name}, "spec": spec}


POLICY = {
    "mode": "Enforce", "undeclaredTools": "Refuse",
    "tools": {"wire.send": {"semantics": "COMPENSABLE",
                            "compensate": {"handler": "test.refund", "args": {"charge": "$.id"}}},
              "search_docs": {"semantics": "REVERSIBLE"}},
    "rules": [{"name": "large-wires", "argExceeds": {"arg": "amount", "threshold": 1000},
               "verdict": "RequireApproval", "reason": "wires above 1,000 need a second pair of eyes"}],
}


# ---------------------------------------------------------------------- NOTES.txt
def notes_env(kube: KubeCluster, redis: RedisServer, tmp_path: Path, ns: str, pod: str) -> dict[str, str]:
    """The environment of an agent container configured exactly as NOTES.txt says."""
    helm = Helm(tmp_path / "helm", kube.kubeconfig)
    port = redis.url.rsplit(":", 1)[1].split("/")[0]
    out = helm.run("install", f"n{secrets.token_hex(3)}", str(CHART), "--dry-run=server", "--namespace", ns,
                   "--set", "redis.host=127.0.0.1", "--set", f"redis.port={port}").stdout
    notes = out.split("NOTES:", 1)[1]
    lines = notes.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "env:")
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        block.append(line)
    container = yaml.safe_load(textwrap.dedent("\n".join(block)))
    return container_env(container, {}, {"metadata.namespace": ns, "metadata.name": pod})


def test_an_agent_configured_as_the_notes_say_obeys_every_lever(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, spawn: Any,
        tmp_path: Path) -> None:
    env = notes_env(crds, fresh_redis, tmp_path, ns, "notes-pod-1")
    assert set(env) == {"AGENT_SAGA_REDIS_URL", "AGENT_SAGA_NAMESPACE", "AGENT_SAGA_AGENT", "POD_NAME",
                        "AGENT_SAGA_WAL_STREAM"}, env
    assert env["AGENT_SAGA_REDIS_URL"] == fresh_redis.url and env["AGENT_SAGA_NAMESPACE"] == ns
    agent = spawn(env, "notes")
    name = env["AGENT_SAGA_AGENT"]
    assert agent.call("wire.send", 5)["ok"]

    # KillSwitch: acknowledged by the one agent, which refuses what it halts.
    apply(crds, ns, killswitch("halt-wire-send", "wire.send"))
    obj = wait_for(crds, ns, "killswitches", "halt-wire-send", "Acknowledged 1/1", acked("True", 1), operator)
    assert obj["status"]["acked"] == "1/1" and obj["status"]["agents"]["lagging"] == []
    crds.kubectl("wait", "--for=condition=Acknowledged", "killswitch/halt-wire-send", "-n", ns, "--timeout=5s")
    refused = agent.call("wire.send", 5)
    assert not refused["ok"] and "e2e halt" in refused["error"], refused
    crds.kubectl("delete", "-n", ns, "killswitch", "halt-wire-send")
    until_call(agent, True, "wire.send", 5)

    # BudgetLimit: the spend counted in Redis refuses the call over budget.
    apply(crds, ns, {"apiVersion": API, "kind": "BudgetLimit", "metadata": {"name": "wires"},
                     "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 100, "window": "1h",
                              "tools": ["wire.*"]}})
    until_call(agent, False, "wire.send", 1000)  # the definition arrived (a refusal debits nothing)
    wait_for(crds, ns, "budgetlimits", "wires", "Acknowledged 1/1", acked("True", 1), operator)
    assert agent.call("wire.send", 60)["ok"]
    over = agent.call("wire.send", 60)
    assert not over["ok"] and f"{ns}.wires" in over["error"], over
    crds.kubectl("delete", "-n", ns, "budgetlimit", "wires")
    until_call(agent, True, "wire.send", 60)

    # SagaPolicy: Ready once this agent enforces it; undeclared refused; a rule asks a human.
    apply(crds, ns, saga_policy("payments", {**POLICY, "appliesTo": {"agents": [name]}}))
    obj = wait_for(crds, ns, "sagapolicies", "payments", "enforced", acked("True", 1), operator)
    ready = condition(obj, "Ready")
    assert ready is not None and ready["status"] == "True" and ready["reason"] == "Enforced", ready
    assert obj["status"]["enforcedBy"] == [f"{name}@notes-pod-1"]
    undeclared = agent.call("undeclared.tool")
    assert not undeclared["ok"] and "not declared in SagaPolicy" in undeclared["error"], undeclared
    assert undeclared["decided_by"] == f"policy:{ns}/payments"
    assert agent.call("search_docs")["ok"]

    # Approval: the large wire waits for a named human; kubectl approves; the call runs.
    cid = agent.submit("call", tool="wire.send", amount=5000)

    def pending() -> dict[str, Any] | None:
        items = co(crds).list_namespaced_custom_object(GROUP, VERSION, ns, "approvals")["items"]
        return items[0] if items else None
    approval = poll(pending, timeout=DEADLINE, what="an Approval for the large wire")
    assert approval["spec"]["tool"] == "wire.send" and "second pair of eyes" in approval["spec"]["reason"]
    # The CLI on the agent's own settings sees the same request, and says where it looked.
    listed = subprocess.run([sys.executable, "-m", "agent_saga.cli", "approvals", "list"], capture_output=True,
                            text=True, timeout=60, env={**os.environ, **env,
                                                        "PYTHONPATH": str(ROOT / "runtime")})
    assert listed.returncode == 0, listed.stderr
    assert "(from $AGENT_SAGA_REDIS_URL)" in listed.stdout and approval["spec"]["requestId"][:8] in listed.stdout
    crds.kubectl("patch", "approval", approval["metadata"]["name"], "-n", ns, "--type", "merge", "-p",
                 json.dumps({"spec": {"decision": "Approved", "approver": "risk@corp"}}))
    done = agent.wait(cid)
    assert done["ok"], done


def test_a_policy_edit_takes_effect_and_deleting_it_reverts_to_the_codes_declarations(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, spawn: Any) -> None:
    agent = spawn(plane_env(fresh_redis.url, ns, "payments-agent", "p-1"), "a")
    assert agent.call("undeclared.tool")["ok"]  # no policy: the code's declarations
    apply(crds, ns, saga_policy("payments", POLICY))
    wait_for(crds, ns, "sagapolicies", "payments", "applied", acked("True", 1, generation=1), operator)
    assert not agent.call("undeclared.tool")["ok"]

    edited = json.loads(json.dumps(POLICY))
    edited["tools"]["undeclared.tool"] = {"semantics": "IRREVERSIBLE"}  # a reviewer declares it: a human decides
    apply(crds, ns, saga_policy("payments", edited))
    wait_for(crds, ns, "sagapolicies", "payments", "generation 2 applied", acked("True", 1, generation=2), operator)
    # IRREVERSIBLE beats the code's REVERSIBLE: the call now waits for a human; a denial refuses it.
    cid = agent.submit("call", tool="undeclared.tool")

    def asked() -> dict[str, Any] | None:
        items = co(crds).list_namespaced_custom_object(GROUP, VERSION, ns, "approvals")["items"]
        return items[0] if items else None
    approval = poll(asked, timeout=DEADLINE, what="an Approval for the tightened tool")
    assert approval["spec"]["tool"] == "undeclared.tool" and approval["spec"]["rule"] == "irreversible"
    crds.kubectl("patch", "approval", approval["metadata"]["name"], "-n", ns, "--type", "merge", "-p",
                 json.dumps({"spec": {"decision": "Denied", "approver": "risk@corp"}}))
    denied = agent.wait(cid)
    assert not denied["ok"] and "denied by risk@corp" in denied["error"], denied

    crds.kubectl("delete", "-n", ns, "sagapolicy", "payments")
    until_call(agent, True, "undeclared.tool")


def test_redis_lost_the_last_policy_holds_for_the_grace_window_then_everything_is_refused(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, spawn: Any) -> None:
    agent = spawn(plane_env(fresh_redis.url, ns, "payments-agent", "p-1", AGENT_SAGA_SWITCH_GRACE="8"), "a")
    apply(crds, ns, saga_policy("payments", POLICY))
    wait_for(crds, ns, "sagapolicies", "payments", "applied", acked("True", 1), operator)
    fresh_redis.kill()
    # Within the grace window (8 s from the moment the loss is seen) the last policy holds:
    # undeclared still refused (never the code's declarations), a declared tool still runs.
    held = agent.call("undeclared.tool")
    assert not held["ok"] and "not declared" in held["error"], held
    declared = agent.call("search_docs")
    assert declared["ok"], declared
    closed = until_call(agent, False, "search_docs")
    assert "grace" in closed["error"], closed


def test_acknowledgement_counts_follow_agents_as_they_start_die_and_lag(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, spawn: Any) -> None:
    apply(crds, ns, killswitch("halt-wire-send", "wire.send"))
    obj = wait_for(crds, ns, "killswitches", "halt-wire-send", "NoAgents",
                   lambda o: (condition(o, "Acknowledged") or {}).get("reason") == "NoAgents", operator)
    assert f"no live agent reads namespace {ns}" in condition(obj, "Acknowledged")["message"]  # type: ignore[index]
    assert obj["status"]["acked"] == "0/0"

    a = spawn(plane_env(fresh_redis.url, ns, "payments-agent", "pod-a"), "a")
    wait_for(crds, ns, "killswitches", "halt-wire-send", "1/1", acked("True", 1), operator)
    b = spawn(plane_env(fresh_redis.url, ns, "payments-agent", "pod-b"), "b")
    wait_for(crds, ns, "killswitches", "halt-wire-send", "2/2", acked("True", 2), operator)
    # A slow agent (heartbeat every 5 s, so it stays counted while stopped) lags behind an edit.
    slow = spawn(plane_env(fresh_redis.url, ns, "payments-agent", "pod-slow", AGENT_SAGA_HEARTBEAT_INTERVAL="5"),
                 "slow")
    wait_for(crds, ns, "killswitches", "halt-wire-send", "3/3", acked("True", 3), operator)
    os.kill(slow.proc.pid, signal.SIGSTOP)
    try:
        edited = killswitch("halt-wire-send", "wire.*")
        apply(crds, ns, edited)
        obj = wait_for(crds, ns, "killswitches", "halt-wire-send", "2 of 3, pod-slow lagging",
                       acked("False", 2, generation=2), operator)
        assert obj["status"]["agents"] == {"matched": 3, "acknowledged": 2, "lagging": ["payments-agent@pod-slow"]}
        assert obj["status"]["acked"] == "2/3"
    finally:
        os.kill(slow.proc.pid, signal.SIGCONT)
    wait_for(crds, ns, "killswitches", "halt-wire-send", "3/3 at generation 2", acked("True", 3, generation=2),
             operator)
    # A killed agent stops beating and drops out (after its heartbeat's TTL).
    b.proc.kill()
    b.proc.wait()
    obj = wait_for(crds, ns, "killswitches", "halt-wire-send", "2/2 after a SIGKILL",
                   lambda o: (o.get("status") or {}).get("acked") == "2/2", operator)
    assert "payments-agent@pod-b" not in json.dumps(obj["status"]["agents"])
    assert not a.call("wire.send")["ok"]


def refusals(refused: int, held: int) -> Any:
    def pred(o: dict[str, Any]) -> bool:
        return ((o.get("status") or {}).get("refusals") or {}).get("refused") == refused \
            and o["status"]["refusals"].get("heldForHuman") == held
    return pred


def test_budget_and_policy_status_count_what_they_refused_and_held_for_a_human(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, operator: OperatorProcess, spawn: Any) -> None:
    agent = spawn(plane_env(fresh_redis.url, ns, "payments-agent", "p-1"), "a")
    apply(crds, ns, {"apiVersion": API, "kind": "BudgetLimit", "metadata": {"name": "wires"},
                     "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 100, "window": "1h",
                              "tools": ["wire.*"]}})
    obj = wait_for(crds, ns, "budgetlimits", "wires", "Acknowledged 1/1 with nothing refused",
                   lambda o: acked("True", 1)(o) and refusals(0, 0)(o), operator)
    assert "last" not in obj["status"]["refusals"]
    # Another control's refusal is not the limit's: a halted tool is refused before any limit.
    apply(crds, ns, killswitch("halt-wire-send", "wire.send"))
    halted = until_call(agent, False, "wire.send", 1)
    assert "e2e halt" in halted["error"], halted
    crds.kubectl("delete", "-n", ns, "killswitch", "halt-wire-send")
    until_call(agent, True, "wire.send", 60)
    over = agent.call("wire.send", 60)  # over the budget: the one refusal the limit decides
    assert not over["ok"] and f"{ns}.wires" in over["error"], over
    obj = wait_for(crds, ns, "budgetlimits", "wires", "one refusal counted", refusals(1, 0), operator)
    last = obj["status"]["refusals"]["last"]
    assert {k: last[k] for k in ("outcome", "tool", "by", "agent")} == {
        "outcome": "Refused", "tool": "wire.send", "by": f"limit:{ns}.wires", "agent": "payments-agent@p-1"}
    # It names the call, never its arguments (a value, not a substring: a saga id's hex may hold "60").
    assert last["saga"] and "amount" not in json.dumps(last) and 60 not in last.values() and "60" not in last.values()
    crds.kubectl("delete", "-n", ns, "budgetlimit", "wires")
    until_call(agent, True, "wire.send", 60)

    # SagaPolicy: an undeclared tool is refused; a rule sends a large wire to a human.
    apply(crds, ns, saga_policy("payments", POLICY))
    wait_for(crds, ns, "sagapolicies", "payments", "enforced, nothing refused",
             lambda o: acked("True", 1)(o) and refusals(0, 0)(o), operator)
    assert not agent.call("undeclared.tool")["ok"]
    assert agent.call("search_docs")["ok"]
    agent.submit("call", tool="wire.send", amount=5000)
    obj = wait_for(crds, ns, "sagapolicies", "payments", "one refused, one held", refusals(1, 1), operator)
    last = obj["status"]["refusals"]["last"]
    assert (last["outcome"], last["tool"], last["by"]) == ("HeldForHuman", "wire.send", f"rule:{ns}/payments:large-wires")
    # An agent that stopped still counts: the counts do not drop with its heartbeat.
    agent.close()
    obj = wait_for(crds, ns, "sagapolicies", "payments", "no agent left",
                   lambda o: (o.get("status") or {}).get("acked") == "0/0", operator)
    assert obj["status"]["refusals"]["refused"] == 1 and obj["status"]["refusals"]["heldForHuman"] == 1
