"""What a human is shown on an ``Approval`` (real kube-apiserver, real operator process,
real Redis): the action rendered from the request's canonical arguments, escaped; a
request whose arguments do not hash to its digest shows no action, is not Ready
(``ActionMismatch``) and a kubectl approval of it is never written; a kubectl approval
of a genuine request is signed over the tool and the rendered action, and the agent
proceeds on it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from agent_saga.audit.checkpoints import generate_signing_key
from agent_saga.controls import ApprovalGateway, ApprovalPolicy, RedisApprovalStore
from agent_saga.controls.approvals import ApprovalRequest, action_digest, decide_request
from agent_saga.controls.approvals._signing import ANY_APPROVER, approver_header
from agent_saga.controls.gate import PreFlightDecision
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL
from agent_saga_operator.bridge import REFUSED_KEY
from agent_saga_operator.models import GROUP, VERSION
from agent_saga_operator.testing import OperatorProcess, poll
from fixtures.controlplane import KubeCluster
from fixtures.polling import until_async
from fixtures.redis_server import RedisServer
from kubernetes import client

NS_PREFIX = "render"
DEADLINE = 30.0
PENDING = PreFlightDecision("REQUIRE_APPROVAL", "Action cannot be undone", "rule:irreversible", False, "rules")


@pytest.fixture
def signed_operator(crds: KubeCluster, fresh_redis: RedisServer, ns: str,
                    tmp_path: Path) -> Iterator[tuple[OperatorProcess, str]]:
    priv, pub = generate_signing_key(tmp_path / "operator-signing.pem")
    # The operator's key names approvers itself (the API server authenticates them).
    Path(pub).write_text(approver_header([ANY_APPROVER]) + Path(pub).read_text())
    op = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--resync-interval", "5", "--health-host", "127.0.0.1",
                                     "--approval-poll-interval", "0.5", "--approval-signing-key", str(priv)])
    op.start()
    try:
        op.wait_ready()
        yield op, str(pub)
    finally:
        op.stop()


def _approval(kube: KubeCluster, ns: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return client.CustomObjectsApi(kube.api_client()).get_namespaced_custom_object(  # type: ignore[no-any-return]
            GROUP, VERSION, ns, "approvals", name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _ready(obj: dict[str, Any] | None) -> dict[str, Any]:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or () if c["type"] == "Ready"), {})


async def test_the_approval_shows_the_checked_escaped_action_and_refuses_a_mismatch(
        crds: KubeCluster, ns: str, signed_operator: tuple[OperatorProcess, str], fresh_redis: RedisServer,
        tmp_path: Path) -> None:
    op, pub = signed_operator
    store = RedisApprovalStore(fresh_redis.url, owner=f"{ns}/agent-0")
    gw = ApprovalGateway(store, None, FileWAL(tmp_path / "a.wal"), ApprovalPolicy(timeout=600), poll=0.05,
                         namespace=ns, trusted_keys=pub)
    args = {"amount": 80000, "to": "acct_EVIL", "memo": "\x1b[2K\x1b[1A\r  to: acct_9\u202e"}
    task = asyncio.create_task(gw.request_approval(
        StepRequest("s-1", "s-1/0", "wire.send", ActionSemantics.IRREVERSIBLE, args, ()), PENDING))
    req = await until_async("the request", lambda: next(iter(store.list(pending_only=True)), None))
    assert req is not None

    # A tampered request (what a writer of the shared key could leave): it claims a note,
    # with the wire's digest.
    r = redis.Redis.from_url(fresh_redis.url)
    fake = {**json.loads(r.get(store.request_key(req.id)) or "{}"), "owner": None, "tool": "crm.add_note",
            "arguments": {"amount": 80, "to": "acct_9"}, "sagaId": "s-2", "stepId": "s-2/0",
            "requestId": "f" * 32}
    r.set(f"agentsaga:v1:approval:request:{'f' * 32}", json.dumps(fake), ex=600)
    r.zadd("agentsaga:v1:approval:pending", {"f" * 32: req.deadline})
    r.publish("agentsaga:v1:events", json.dumps({"v": 1, "kind": "ApprovalRequest", "id": "f" * 32, "op": "put"}))
    try:
        mirrored = poll(lambda: _approval(crds, ns, req.id), timeout=DEADLINE, what="the request mirrored")
        display = mirrored["spec"]["display"]
        assert display["to"] == "acct_EVIL" and display["amount"] == "80000"
        assert display["memo"] == r"\x1b[2K\x1b[1A\x0d  to: acct_9<U+202E>"
        yaml = crds.kubectl("get", "approval", req.id, "-n", ns, "-o", "yaml").stdout
        assert "\x1b" not in yaml and "\u202e" not in yaml

        refused = poll(lambda: (o := _approval(crds, ns, "f" * 32)) and _ready(o).get("reason") == "ActionMismatch"
                       and o, timeout=DEADLINE, what="the tampered request not Ready")
        assert set(refused["spec"]["display"]) == {REFUSED_KEY}, "no action is shown for it"
        assert "do not hash to its argumentsDigest" in _ready(refused)["message"]
        assert "kubectl patch" not in _ready(refused)["message"], "never presented as approvable"
        crds.kubectl("patch", "approval", "f" * 32, "-n", ns, "--type=merge", "-p",
                     json.dumps({"spec": {"decision": "Approved", "approver": "risk@corp"}}))
        poll(lambda: "was not written" in _ready(_approval(crds, ns, "f" * 32)).get("message", ""),
             timeout=DEADLINE, what="the approval of the tampered request refused")
        assert r.get(f"agentsaga:v1:approval:decision:{'f' * 32}") is None

        # The genuine request, approved with kubectl: signed over the tool and the action.
        crds.kubectl("patch", "approval", req.id, "-n", ns, "--type=merge", "-p",
                     json.dumps({"spec": {"decision": "Approved", "approver": "risk@corp"}}))
        outcome = await asyncio.wait_for(task, timeout=DEADLINE)
        assert outcome.approved and outcome.approver == "risk@corp", outcome.note
        decision = json.loads(r.get(f"agentsaga:v1:approval:decision:{req.id}") or "{}")
        assert decision["tool"] == "wire.send" and decision["signature"]["format"].endswith("/v2")
        assert decision["actionDigest"] == ApprovalRequest.from_doc(
            json.loads(r.get(store.request_key(req.id)) or "{}")).action_view().digest
        assert decision["argumentsDigest"] == action_digest("wire.send", args, "1")
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator log ---\n{op.log()}") from None
    finally:
        task.cancel()
        store.close()
        r.close()


async def test_an_ignored_approval_of_an_action_larger_than_an_approval_shows_is_not_replaced_with_kubectl(
        crds: KubeCluster, ns: str, signed_operator: tuple[OperatorProcess, str], fresh_redis: RedisServer,
        tmp_path: Path) -> None:
    """Both Ready reasons apply (the stored approval is unsigned, and the action is larger
    than an Approval shows): NotAllShown wins, so nobody is told to approve it with
    kubectl, and a kubectl approval neither replaces the ignored one nor is written."""
    op, pub = signed_operator
    store = RedisApprovalStore(fresh_redis.url, owner=f"{ns}/agent-0")
    gw = ApprovalGateway(store, None, FileWAL(tmp_path / "a.wal"), ApprovalPolicy(timeout=600), poll=0.05,
                         namespace=ns, trusted_keys=pub)
    args = {f"field_{i:02d}": i for i in range(40)}  # more fields than the default view shows
    task = asyncio.create_task(gw.request_approval(
        StepRequest("s-wide", "s-wide/0", "bulk.update", ActionSemantics.IRREVERSIBLE, args, ()), PENDING))
    req = await until_async("the request", lambda: next(iter(store.list(pending_only=True)), None))
    assert req is not None
    r = redis.Redis.from_url(fresh_redis.url)
    key = f"agentsaga:v1:approval:decision:{req.id}"
    try:
        poll(lambda: _approval(crds, ns, req.id), timeout=DEADLINE, what="the request mirrored")
        # An unsigned approval in the policy plane (an older CLI, a script): the agents ignore it.
        decide_request(store, req.id, approved=True, approver="cfo@corp", now=time.time(), show_all=True)
        unsigned = r.get(key)
        assert unsigned is not None and b'"signature"' not in unsigned
        cond = poll(lambda: (c := _ready(_approval(crds, ns, req.id))).get("reason") == "NotAllShown"
                    and "ignored by the agents" in c.get("message", "") and c,
                    timeout=DEADLINE, what="Ready reason NotAllShown, saying the stored approval is ignored")
        assert cond["status"] == "False" and "not signed" in cond["message"], cond
        assert "--show-all" in cond["message"] and "kubectl patch" not in cond["message"], cond
        crds.kubectl("patch", "approval", req.id, "-n", ns, "--type=merge", "-p",
                     json.dumps({"spec": {"decision": "Approved", "approver": "risk@corp"}}))
        poll(lambda: "was not written" in _ready(_approval(crds, ns, req.id)).get("message", ""),
             timeout=DEADLINE, what="the kubectl approval refused")
        assert r.get(key) == unsigned, "the ignored approval was not replaced by one the human could not see"
        assert not task.done(), "the agent still waits"
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator log ---\n{op.log()}") from None
    finally:
        task.cancel()
        store.close()
        r.close()
