"""An approval the agents ignore is shown as such, and does not hold the request hostage:
the real API server, the real operator (signing, publishing its key), real Redis with the
ACL users of ``agent-saga acl``, a real agent process and the real CLI.

- An unsigned approval in the policy plane (an older CLI, on a cluster whose operator
  publishes keys): the Approval says ``Ready=False``, reason ``Unsigned``, phase Pending,
  never "the saga may proceed"; today's CLI refuses to write one and says how to sign;
  a kubectl decision afterwards is signed by the operator, replaces it, and the agent
  proceeds; the status names the signing key and its owner.
- The CRD: a decision is immutable once valid, and may change while the operator
  reports it as an approval the agents ignore (Ready reason Unsigned / UntrustedKey).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from agent_saga.controls import RedisApprovalStore
from agent_saga.controls.approvals import decide_request
from agent_saga.plane import acl_rules, acl_setuser, agent_scripts
from agent_saga_operator.models import GROUP, VERSION
from agent_saga_operator.testing import OperatorProcess, poll
from fixtures.controlplane import KubeCluster
from fixtures.redis_server import RedisServer
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_approval_proof import approval, signed_operator  # noqa: F401 - the fixture
from test_operator_agents import ANSWERED, DEADLINE, Agent, approvals, get

pytestmark = pytest.mark.e2e
NS_PREFIX = "unproven"


def ready(obj: dict[str, Any]) -> dict[str, Any]:
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Ready"), {})


def test_an_unsigned_approval_is_shown_unproven_and_a_signed_decision_replaces_it(
    crds: KubeCluster, fresh_redis: RedisServer, ns: str, signed_operator: tuple[OperatorProcess, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    op, _ = signed_operator
    r = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    keys = poll(lambda: r.hgetall("agentsaga:v1:approval:keys"), timeout=DEADLINE, what="the operator's key published")
    (operator_key,) = keys
    assert keys[operator_key].startswith("Approver: *\n"), "the operator's key signs for any authenticated approver"
    names = {}
    for role in ("agent", "approver"):
        names[role] = (f"{role}-{secrets.token_hex(3)}", secrets.token_hex(12))
        r.execute_command(*acl_setuser(names[role][0], acl_rules(role), password=names[role][1]))
    url = {role: fresh_redis.url.replace("redis://", f"redis://{u}:{p}@") for role, (u, p) in names.items()}
    poll(lambda: all(r.script_exists(*(hashlib.sha1(t.encode()).hexdigest() for t in agent_scripts()))),
         timeout=DEADLINE, what="the operator loaded the agents' scripts")
    agent = Agent(url["agent"], ns, tmp_path / "agent", approval_timeout=ANSWERED)
    cli_store = RedisApprovalStore(url["approver"])
    try:
        waiting = agent.submit("call", name="wire-stuck", tool="wire.final", semantics="IRREVERSIBLE", amount=7,
                               approval_timeout=ANSWERED)
        name = poll(lambda: approvals(crds, ns), timeout=DEADLINE, what="an Approval appears")[0]["metadata"]["name"]
        # Today's CLI refuses: the operator publishes keys, so an unsigned approval would be ignored.
        env = {**os.environ, "AGENT_SAGA_APPROVAL_STORE": url["approver"]}
        env.pop("AGENT_SAGA_APPROVAL_SIGNING_KEY", None)
        env.pop("AGENT_SAGA_APPROVAL_KEYS", None)
        cli = subprocess.run([sys.executable, "-m", "agent_saga.cli", "approvals", "approve", name, "--approver",
                              "cfo@corp"], capture_output=True, text=True, env=env, timeout=60)
        assert cli.returncode == 1 and "--signing-key" in cli.stderr and "AGENT_SAGA_APPROVAL_SIGNING_KEY" in \
            cli.stderr, cli
        assert r.get(f"agentsaga:v1:approval:decision:{name}") is None
        # An unsigned approval written anyway (an older CLI): the Approval does not say "may proceed".
        decide_request(cli_store, name, approved=True, approver="cfo@corp", now=time.time())

        def unsigned() -> dict[str, Any] | None:
            obj = get(crds, ns, "approvals", name)
            return obj if ready(obj).get("reason") == "Unsigned" else None
        obj = poll(unsigned, timeout=DEADLINE, what="Ready reason Unsigned")
        cond = ready(obj)
        assert cond["status"] == "False" and "may proceed" not in cond["message"], cond
        assert "not signed" in cond["message"] and "--signing-key" in cond["message"], cond
        assert obj["status"]["phase"] == "Pending", obj["status"]
        # A correct approval afterwards: kubectl, signed by the operator, replaces it.
        crds.kubectl("patch", "-n", ns, "approval", name, "--type=merge", "-p",
                     json.dumps({"spec": {"decision": "Approved", "approver": "risk@corp"}}))
        answer = agent.wait(waiting, timeout=ANSWERED + DEADLINE)
        assert answer["ok"], f"{answer}\n{op.log()}"
        stored = json.loads(r.get(f"agentsaga:v1:approval:decision:{name}") or "{}")
        assert stored["approver"] == "risk@corp" and stored["signature"]["keyId"] == operator_key

        def approved() -> dict[str, Any] | None:
            obj = get(crds, ns, "approvals", name)
            return obj if ready(obj).get("reason") == "Approved" else None
        st = poll(approved, timeout=DEADLINE, what="Ready reason Approved")["status"]
        assert st["phase"] == "Approved" and st["signedBy"] == operator_key
        assert st["keyOwner"].startswith("*"), st
    finally:
        agent.close()
        cli_store.close()
        for user, _ in names.values():
            r.execute_command("ACL", "DELUSER", user)
        r.close()


def _status(kube: KubeCluster, ns: str, name: str, reason: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    client.CustomObjectsApi(kube.api_client()).patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, "approvals", name, {"status": {"phase": "Pending", "conditions": [
            {"type": "Ready", "status": "False", "reason": reason, "message": "as the operator wrote it",
             "lastTransitionTime": now}]}})


def _change(kube: KubeCluster, ns: str, name: str, spec: dict[str, Any]) -> ApiException | None:
    try:
        client.CustomObjectsApi(kube.api_client()).patch_namespaced_custom_object(
            GROUP, VERSION, ns, "approvals", name, {"spec": spec})
    except ApiException as e:
        return e
    return None


def test_a_decision_is_immutable_once_valid_and_may_change_while_the_agents_ignore_it(
        crds: KubeCluster, ns: str) -> None:
    approval(crds, ns, "valid")
    approval(crds, ns, "ignored")
    for name in ("valid", "ignored"):
        assert _change(crds, ns, name, {"decision": "Approved", "approver": "risk@corp"}) is None
    _status(crds, ns, "valid", "Approved")
    _status(crds, ns, "ignored", "Unsigned")
    e = _change(crds, ns, "valid", {"decision": "Denied", "approver": "mallory@corp"})
    assert e is not None and e.status == 422 and "decision is immutable once made" in str(e.body), e
    assert "only an approval the agents ignore" in str(e.body)
    assert get(crds, ns, "approvals", "valid")["spec"]["decision"] == "Approved"
    # Reported as an approval the agents ignore: it may be decided again.
    assert _change(crds, ns, "ignored", {"decision": "Approved", "approver": "cfo@corp", "note": "signed now"}) is None
    assert get(crds, ns, "approvals", "ignored")["spec"]["approver"] == "cfo@corp"
    _status(crds, ns, "ignored", "UntrustedKey")
    assert _change(crds, ns, "ignored", {"decision": "Denied", "approver": "risk@corp"}) is None
    _status(crds, ns, "ignored", "Denied")
    e = _change(crds, ns, "ignored", {"decision": "Approved"})
    assert e is not None and e.status == 422, e


def test_the_operator_writes_the_published_keys_into_the_configmap_agents_mount(
        crds: KubeCluster, fresh_redis: RedisServer, ns: str, tmp_path: Path) -> None:
    """--approval-keys-configmap (the chart's <release>-approval-keys): every published key,
    with its approver names, lands in operator-published.pem; a directory holding that file
    is what an agent trusts (AGENT_SAGA_APPROVAL_KEYS), whatever the policy plane holds."""
    from agent_saga.audit.checkpoints import generate_signing_key
    from agent_saga.controls.approvals import TrustedKeys

    core = client.CoreV1Api(crds.api_client())
    core.create_namespaced_config_map(ns, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="rel-approval-keys"), data={}))
    priv, _ = generate_signing_key(tmp_path / "operator-signing.pem")
    risk_dir = tmp_path / "approver-keys"
    risk_dir.mkdir()
    _, risk_pub = generate_signing_key(tmp_path / "risk.pem")
    (risk_dir / "risk.pem").write_text("Approver: risk@corp\n" + Path(risk_pub).read_text())
    op = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--resync-interval", "2", "--retry-delay", "0.5",
                                     "--approval-poll-interval", "0.5", "--health-host", "127.0.0.1",
                                     "--approval-signing-key", priv, "--approval-keys", str(risk_dir),
                                     "--approval-keys-configmap", f"{ns}/rel-approval-keys"])
    op.start()
    try:
        op.wait_ready()

        def written() -> str | None:
            data = core.read_namespaced_config_map("rel-approval-keys", ns).data or {}
            return data.get("operator-published.pem")
        text = poll(written, timeout=DEADLINE, what="the keys written into the ConfigMap")
    finally:
        op.stop()
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    (mounted / "operator-published.pem").write_text(text)
    keys = TrustedKeys.from_path(mounted)
    r = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    published = r.hgetall("agentsaga:v1:approval:keys")
    r.close()
    assert set(keys.key_ids) == set(published) and len(published) == 2
    assert sorted(keys.owner(k) for k in keys.key_ids) == ["* (a decider's key: any approver it authenticated)",
                                                          "risk@corp"]
