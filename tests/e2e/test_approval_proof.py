"""Who approved is proven: the attack table against the real API server, the real operator,
real Redis and real agent processes.

- Admission (the chart's ValidatingAdmissionPolicy, as rendered): a decision names the
  user the API server authenticated; naming someone else, deciding without the approver
  role, impersonating an approver, or a break-glass decision without the break-glass role
  are refused. Legitimate approvers decide as themselves.
- Signatures (the operator with a signing key, an agent with a least-privilege Redis
  credential that picks up the published key):
  a kubectl approval is signed and proceeds; an ``approved`` decision written straight
  into Redis with the agent's credential, an old signed decision replayed onto a new
  request, and an unsigned CLI approval (today's CLI refuses it) are ignored, and those
  requests expire (deny).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from agent_saga.audit.checkpoints import generate_signing_key
from agent_saga.controls import RedisApprovalStore
from agent_saga.controls.approvals import decide_request
from agent_saga.plane import acl_rules, acl_setuser, agent_scripts
from agent_saga_operator.models import GROUP, VERSION
from agent_saga_operator.testing import OperatorProcess, poll
from chart_helpers import CHART, Helm, docs
from fixtures.controlplane import KubeCluster
from fixtures.redis_server import RedisServer
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_operator_agents import ANSWERED, DEADLINE, Agent, approvals, get

UNANSWERED = 12.0  # seconds: the deadline of the requests only an expiry ends

pytestmark = pytest.mark.e2e
NS_PREFIX = "proof"

POLICY = "rel-agent-saga-approver-is-requester"


@pytest.fixture
def admission(crds: KubeCluster, ns: str, tmp_path: Path) -> Iterator[KubeCluster]:
    """The chart's admission policy and approver roles, applied as the chart renders them,
    and removed again (waiting until the API server no longer enforces the policy, so the
    other tests' admin-made decisions are not refused)."""
    helm = Helm(tmp_path / "helm")
    rendered = helm.run("template", "rel", str(CHART), "--namespace", "agent-saga",
                        "-s", "templates/approver-validatingadmissionpolicy.yaml",
                        "-s", "templates/approver-clusterrole.yaml").stdout
    objs = docs(rendered)
    assert {o["kind"] for o in objs} == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                                         "ClusterRole"}
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    crds.kubectl("apply", "-f", "-", input=text)
    yield crds
    crds.kubectl("delete", "-f", "-", "--ignore-not-found", input=text)
    approval(crds, ns, "probe")
    poll(lambda: decide(crds, ns, "probe", as_user=None, approver="someone@corp", dry_run=True) is None,
         timeout=DEADLINE, what="the admission policy no longer enforced")


def grant(kube: KubeCluster, ns: str, user: str, role: str) -> None:
    client.RbacAuthorizationV1Api(kube.api_client()).create_namespaced_role_binding(ns, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=f"{role}-{abs(hash(user)) % 10**8}"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=f"rel-agent-saga-{role}"),
        subjects=[client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")]))


def approval(kube: KubeCluster, ns: str, name: str, annotations: dict[str, str] | None = None) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Approval",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"requestId": name, "tool": "wire.send", "sagaId": "s-1", "stepId": "s-1/0", "rule": "irreversible",
                     "argumentsDigest": "sha256:" + "a" * 64, "requestedAt": "2026-01-01T00:00:00Z",
                     "deadline": "2036-01-01T00:00:00Z"}}
    client.CustomObjectsApi(kube.api_client()).create_namespaced_custom_object(GROUP, VERSION, ns, "approvals", body)


def decide(kube: KubeCluster, ns: str, name: str, *, as_user: str | None, approver: str,
           dry_run: bool = False) -> ApiException | None:
    """Decide as ``as_user`` (impersonated; ``None``: the cluster admin)."""
    who = {} if as_user is None else {"user": as_user, "group": "system:authenticated"}
    api = client.CustomObjectsApi(kube.api_client(**who))
    try:
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, "approvals", name,
                                           {"spec": {"decision": "Approved", "approver": approver}},
                                           **({"dry_run": "All"} if dry_run else {}))
    except ApiException as e:
        return e
    return None


def test_admission_makes_the_approver_the_authenticated_user(admission: KubeCluster, ns: str) -> None:
    kube = admission
    grant(kube, ns, "risk@corp", "approver")
    grant(kube, ns, "mallory@corp", "approver")
    grant(kube, ns, "oncall@corp", "break-glass")
    for name in ("a1", "a2", "a3", "a4"):
        approval(kube, ns, name, {"agentsaga.dev/break-glass": "true"} if name in ("a3", "a4") else None)

    # The policy is in force once the API server has compiled it: probe with dry runs
    # (admission runs, nothing is stored) until one is refused, never a sleep.
    def refused() -> ApiException | None:
        e = decide(kube, ns, "a1", as_user="mallory@corp", approver="cfo@corp", dry_run=True)
        return e if e is not None and e.status == 403 and POLICY in str(e.body) else None
    poll(refused, timeout=DEADLINE, what="the admission policy in force")
    # Row: patch an Approval naming someone else (an approver naming the CFO) - admission denied.
    e = decide(kube, ns, "a1", as_user="mallory@corp", approver="cfo@corp")
    assert e is not None and e.status == 403, e
    assert "spec.approver must be the user making the decision (mallory@corp)" in str(e.body)
    assert "decision" not in get(kube, ns, "approvals", "a1")["spec"]

    # Row: no approver role at all - RBAC refuses before admission.
    e = decide(kube, ns, "a1", as_user="eve@corp", approver="eve@corp")
    assert e is not None and e.status == 403 and "cannot patch resource" in str(e.body)

    # Row: impersonate an approver - neither role grants impersonation.
    for user in ("mallory@corp", "oncall@corp"):
        can = kube.kubectl("auth", "can-i", "impersonate", "users/risk@corp", "--as", user, check=False)
        assert can.stdout.strip() == "no", (user, can.stdout, can.stderr)

    # Row: a break-glass decision without the break-glass role - admission denied.
    e = decide(kube, ns, "a3", as_user="risk@corp", approver="risk@corp")
    assert e is not None and e.status == 403 and "needs the break-glass role" in str(e.body), e

    # Legitimate: an approver decides as themselves; the break-glass role decides a break-glass one.
    assert decide(kube, ns, "a2", as_user="risk@corp", approver="risk@corp") is None
    assert get(kube, ns, "approvals", "a2")["spec"]["approver"] == "risk@corp"
    assert decide(kube, ns, "a4", as_user="oncall@corp", approver="oncall@corp") is None


# ---------------------------------------------------------------------- signatures
@pytest.fixture
def signed_operator(crds: KubeCluster, fresh_redis: RedisServer, ns: str,
                    tmp_path: Path) -> Iterator[tuple[OperatorProcess, str]]:
    priv, _ = generate_signing_key(tmp_path / "operator-signing.pem")
    op = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--resync-interval", "2", "--retry-delay", "0.5",
                                     "--approval-poll-interval", "0.5", "--health-host", "127.0.0.1",
                                     "--approval-signing-key", priv])
    op.start()
    op.wait_ready()
    try:
        yield op, priv
    finally:
        op.stop()


def test_agents_act_only_on_signed_decisions(
    crds: KubeCluster, fresh_redis: RedisServer, ns: str, signed_operator: tuple[OperatorProcess, str],
    tmp_path: Path,
) -> None:
    op, _ = signed_operator
    r = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    keys = poll(lambda: r.hgetall("agentsaga:v1:approval:keys"), timeout=DEADLINE, what="the operator's key published")
    # The agent runs with a least-privilege credential: it may run only the scripts the
    # operator loaded (forget them all: the operator loads them again on its next pass).
    user, password = f"agent-{secrets.token_hex(3)}", secrets.token_hex(12)
    r.execute_command(*acl_setuser(user, acl_rules("agent"), password=password))
    agent_url = fresh_redis.url.replace("redis://", f"redis://{user}:{password}@")
    r.script_flush()
    poll(lambda: all(r.script_exists(*(hashlib.sha1(t.encode()).hexdigest() for t in agent_scripts()))),
         timeout=DEADLINE, what="the operator loads the agents' scripts again")
    agent = Agent(agent_url, ns, tmp_path / "agent", approval_timeout=6.0)
    as_agent = redis.Redis.from_url(agent_url, decode_responses=True)
    try:
        # Legitimate: kubectl approves; the operator signs; the agent verifies and proceeds.
        waiting = agent.submit("call", name="wire-ok", tool="wire.final", semantics="IRREVERSIBLE", amount=1,
                               approval_timeout=ANSWERED)
        first = poll(lambda: approvals(crds, ns), timeout=DEADLINE, what="an Approval appears")[0]["metadata"]["name"]
        crds.kubectl("patch", "-n", ns, "approval", first, "--type=merge", "-p",
                     json.dumps({"spec": {"decision": "Approved", "approver": "risk@corp"}}))
        answer = agent.wait(waiting)
        assert answer["ok"], f"{answer}\n{op.log()}"
        signed = json.loads(r.get(f"agentsaga:v1:approval:decision:{first}") or "{}")
        assert signed["signature"]["keyId"] in keys

        def status() -> dict[str, Any] | None:
            st = get(crds, ns, "approvals", first).get("status") or {}
            return st if st.get("signedBy") else None
        assert poll(status, timeout=DEADLINE, what="signedBy in status")["signedBy"] in keys

        # Three requests that only an expiry ends, pending together: (a) an approved
        # decision written with the agent's credential, (b) the old signed decision
        # replayed onto a new request, (c) the CLI's approval without a signing key (once
        # keys are published it is ignored). Their one deadline leaves the CLI time to
        # start on a loaded machine.
        forged = agent.submit("call", name="wire-forged", tool="wire.final", semantics="IRREVERSIBLE", amount=2,
                              approval_timeout=UNANSWERED)
        replayed = agent.submit("call", name="wire-replayed", tool="wire.final", semantics="IRREVERSIBLE", amount=3,
                                approval_timeout=UNANSWERED)
        late = agent.submit("call", name="wire-cli", tool="wire.final", semantics="IRREVERSIBLE", amount=4,
                            approval_timeout=UNANSWERED)

        def by_amount() -> dict[str, str] | None:
            ids = r.zrange("agentsaga:v1:approval:pending", 0, -1)
            if len(ids) != 3:
                return None
            docs = {i: json.loads(r.get(f"agentsaga:v1:approval:request:{i}") or "{}") for i in ids}
            return {d["display"]["amount"]: i for i, d in docs.items()}
        pending = poll(by_amount, timeout=DEADLINE, what="three requests pending")
        a, b, rid = pending["2"], pending["3"], pending["4"]
        req_a = json.loads(r.get(f"agentsaga:v1:approval:request:{a}") or "{}")
        # With the agent's own credential (it may write decisions: it expires its requests).
        as_agent.set(f"agentsaga:v1:approval:decision:{a}", json.dumps({
            "v": 1, "kind": "ApprovalDecision", "requestId": a, "argumentsDigest": req_a["argumentsDigest"],
            "decision": "approved", "approver": "cfo@corp", "decidedAt": req_a["requestedAt"], "source": "agent"}))
        as_agent.set(f"agentsaga:v1:approval:decision:{b}", json.dumps({**signed, "rev": 99}))
        env = {**os.environ, "AGENT_SAGA_APPROVAL_STORE": fresh_redis.url}
        cli = subprocess.run([sys.executable, "-m", "agent_saga.cli", "approvals", "approve", rid,
                              "--approver", "cfo@corp"], capture_output=True, text=True, env=env, timeout=30)
        assert cli.returncode == 1 and "--signing-key" in cli.stderr, cli  # the CLI knows the keys are published
        # An older CLI writes it anyway: the agent ignores it.
        decide_request(RedisApprovalStore(fresh_redis.url), rid, approved=True, approver="cfo@corp",
                       now=time.time())
        for ticket in (forged, replayed):
            refused = agent.wait(ticket, timeout=DEADLINE)
            assert not refused["ok"] and "expiry denies" in refused["error"] and "ignored" in refused["error"], refused
        refused = agent.wait(late, timeout=DEADLINE)
        assert not refused["ok"] and "not signed" in refused["error"], refused
    finally:
        agent.close()
        as_agent.close()
        r.execute_command("ACL", "DELUSER", user)
        r.close()
