"""RedisApprovalStore against a real redis-server: the documents the operator mirrors,
an approval given from another process through the CLI, a crash that does not ask
twice, single use under a race, and an unreachable store that denies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from agent_saga.controls import (
    ApprovalGateway,
    ApprovalPolicy,
    EscalationLevel,
    RedisApprovalStore,
)
from agent_saga.controls.approvals import Decision, decide_request
from agent_saga.controls.gate import PreFlightDecision
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL, iter_file_records
from fixtures.cli import cli_module
from fixtures.polling import until, until_async
from fixtures.redis_server import PLANE_PREFIX as P
from fixtures.redis_server import RedisServer

I = ActionSemantics.IRREVERSIBLE  # noqa: E741
PENDING = PreFlightDecision("REQUIRE_APPROVAL", "Action cannot be undone", "rule:irreversible", False, "rules")

AGENT = r"""
import asyncio, sys
from agent_saga.wal.file import FileWAL
from agent_saga.controls import (ApprovalGateway, ApprovalPolicy, EscalationLevel, PreFlightGate,
                                 RedisApprovalStore)
from agent_saga.scope import saga_scope

wal_path, url, saga_id, out, prefix = sys.argv[1:6]

class Counter:
    async def notify(self, notice):
        with open(out + ".notified", "a") as f:
            f.write(notice.request.id + "\n")

async def main():
    wal = FileWAL(wal_path)
    store = RedisApprovalStore(url, prefix=prefix)
    gw = ApprovalGateway(store, Counter(), wal,
                         ApprovalPolicy(timeout=120, levels=(EscalationLevel(("@oncall",)),)), poll=0.05)
    def send():
        with open(out, "a") as f:
            f.write("sent\n")
    async with saga_scope(wal, PreFlightGate(approval_provider=gw), saga_id=saga_id) as saga:
        await saga.execute("wire.send", "IRREVERSIBLE", send, policy_args={"amount": 80000, "to": "acct_9"})
    store.close()
    wal.close()

asyncio.run(main())
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENT_SAGA_KEY_PREFIX": P.removesuffix(":v1")}  # the plane the test's stores use
    return cli_module(*args, env=env)


def pending(url: str) -> list[dict]:
    out = cli("approvals", "list", "--json", "--store", url)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def start(tmp_path: Path, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", AGENT, str(tmp_path / "agent.wal"), url, "saga-wire-1",
                             str(tmp_path / "out"), P], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(agent: subprocess.Popen[str]) -> None:
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err[-2000:]


def test_the_request_document_is_what_the_operator_mirrors(fresh_redis: RedisServer, tmp_path: Path):
    wal = FileWAL(tmp_path / "a.wal")
    store = RedisApprovalStore(fresh_redis.url, prefix=P)
    r = fresh_redis.client()
    events = r.pubsub()
    events.subscribe(f"{P}:events")
    try:
        gw = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=900, levels=(
            EscalationLevel(("@oncall",)), EscalationLevel(("@head-of-risk",), 300))), poll=0.02,
            namespace="payments")

        async def ask_and_answer() -> Any:
            task = asyncio.create_task(gw.request_approval(
                StepRequest("saga-1", "saga-1/0", "wire.send", I, {"amount": 80000, "to": "acct_9"}, ()), PENDING))
            # Decide only once level 0 has been notified: a request decided first is never
            # escalated (the gateway skips decided requests), and this test checks all four events.
            listed = await until_async("the request notified at level 0",
                                       lambda: (ls := store.list()) and ls[0].escalated_to(0) and ls, interval=0.01)
            (req,) = listed
            doc = json.loads(r.get(f"{P}:approval:request:{req.id}"))
            assert abs(r.zscore(f"{P}:approval:pending", req.id) - req.deadline) < 1e-3
            decide_request(store, req.id, approved=True, approver="risk@corp", now=time.time(), note="ok")
            decision = json.loads(r.get(f"{P}:approval:decision:{req.id}"))
            assert r.zscore(f"{P}:approval:pending", req.id) is None
            return doc, decision, await task

        doc, decision, outcome = asyncio.run(ask_and_answer())
        assert outcome.approved and outcome.approver == "risk@corp"
        assert set(doc) == {
            "v", "kind", "requestId", "namespace", "agent", "tool", "semantics", "argumentsDigest", "display",
            "sagaId", "stepId", "rule", "reason", "requestedAt", "deadline", "policyVersion", "requestedBy",
            "levels", "escalations", "consumedAt", "consumedBy", "arguments"}
        assert doc["arguments"] == {"amount": 80000, "to": "acct_9"}, "the exact arguments the digest covers"
        assert doc["kind"] == "ApprovalRequest" and doc["rule"] == "irreversible" and doc["tool"] == "wire.send"
        assert doc["namespace"] == "payments" and doc["semantics"] == "IRREVERSIBLE" and doc["consumedAt"] is None
        assert decision["rev"] == int(r.get(f"{P}:rev")) and decision["kind"] == "ApprovalDecision"
        assert decision["id"] == f"payments/{doc['requestId']}" and decision["requestId"] == doc["requestId"]
        assert decision["decision"] == "approved" and decision["approver"] == "risk@corp"
        assert decision["argumentsDigest"] == doc["argumentsDigest"] and decision["source"].startswith("cli:")
        assert doc["argumentsDigest"].startswith("sha256:") and len(doc["argumentsDigest"]) == 71
        assert doc["display"] == {"amount": "80000", "to": "acct_9"}
        assert doc["levels"] == [{"targets": ["@oncall"], "afterSeconds": 0.0},
                                 {"targets": ["@head-of-risk"], "afterSeconds": 300.0}]
        assert r.pttl(f"{P}:approval:request:{doc['requestId']}") > 0
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(seen) < 4:
            msg = events.get_message(timeout=0.2)
            if msg and msg["type"] == "message":
                seen.append(json.loads(msg["data"]))
        # asked, level 0 notified, decided, used
        assert [e["kind"] for e in seen] == ["ApprovalRequest", "ApprovalRequest", "ApprovalDecision", "ApprovalRequest"]
        assert all(e["id"] == doc["requestId"] and e["op"] == "put" for e in seen)
    finally:
        events.close()
        r.close()
        store.close()
        wal.close()


def test_a_decided_request_stays_unmirrored_until_an_operator_takes_it_and_expired_ones_leave(
        fresh_redis: RedisServer) -> None:
    """The unmirrored set keeps a request after its decision (an operator that starts
    later still shows it as an Approval); an entry whose document has expired leaves when
    the next request is made."""
    from agent_saga.controls.approvals import ApprovalRequest

    store = RedisApprovalStore(fresh_redis.url, prefix=P, retention=3600)
    r = fresh_redis.client()
    unmirrored = f"{P}:approval:unmirrored"
    try:
        now = time.time()
        # Made long ago: its document's lifetime (60 s + the retention) ended before now.
        old = ApprovalRequest("0a" * 16, "s-old", "s-old/0", "wire.send", "irreversible", "", "sha256:x", "1",
                              now - 7200, now - 7140)
        store.create(old)
        assert r.zscore(unmirrored, old.id) == pytest.approx(now - 7200 + 60 + 3600, abs=1e-3)
        fresh = ApprovalRequest("0b" * 16, "s-new", "s-new/0", "wire.send", "irreversible", "", "sha256:y", "1",
                                now, now + 60)
        assert store.create(fresh)[1] is True
        assert r.zscore(unmirrored, fresh.id) == pytest.approx(now + 60 + 3600, abs=1e-3)
        assert r.zscore(unmirrored, old.id) is None, "an expired entry leaves with the next request"
        decide_request(store, fresh.id, approved=False, approver="risk@corp", now=time.time(), note="no")
        assert r.zscore(f"{P}:approval:pending", fresh.id) is None
        assert r.zscore(unmirrored, fresh.id) is not None, "decided, not mirrored yet: still to mirror"
        # A change to the request (its escalations, its use) is not a new request.
        store.update(fresh.id, lambda q: q)
        assert r.zcard(unmirrored) == 1
    finally:
        r.close()
        store.close()


def test_approved_from_another_process_through_the_cli(fresh_redis: RedisServer, tmp_path: Path):
    agent = start(tmp_path, fresh_redis.url)
    try:
        (req,) = until("the request", lambda: pending(fresh_redis.url), proc=agent)
        out = cli("approvals", "approve", req["requestId"][:8], "--store", fresh_redis.url)
        assert out.returncode == 2 and "--approver NAME is required" in out.stderr
        out = cli("approvals", "approve", req["requestId"][:8], "--approver", "risk@corp", "--store", fresh_redis.url)
        assert out.returncode == 0, out.stderr
        finish(agent)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    assert (tmp_path / "out").read_text() == "sent\n"


def test_a_crash_between_request_and_decision_does_not_ask_twice(fresh_redis: RedisServer, tmp_path: Path):
    first = start(tmp_path, fresh_redis.url)
    try:
        (req,) = until("the request", lambda: pending(fresh_redis.url), proc=first)
        until("the notification", lambda: (tmp_path / "out.notified").exists(), proc=first)
        os.kill(first.pid, signal.SIGKILL)
        first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()

    def resumed() -> bool:
        return any(getattr(item, "type", "") == "APPROVAL_RESUMED"
                   for _, item in iter_file_records(tmp_path / "agent.wal"))

    second = start(tmp_path, fresh_redis.url)
    try:
        until("the restarted agent to find its request", resumed, proc=second)
        assert [r["requestId"] for r in pending(fresh_redis.url)] == [req["requestId"]]
        out = cli("approvals", "approve", req["requestId"], "--approver", "risk@corp", "--note", "verified by phone",
                  "--store", fresh_redis.url)
        assert out.returncode == 0, out.stderr
        finish(second)
    finally:
        if second.poll() is None:
            second.kill()
            second.communicate()
    assert (tmp_path / "out.notified").read_text().splitlines() == [req["requestId"]], "asked once"
    assert (tmp_path / "out").read_text() == "sent\n"


def test_an_approval_is_used_once_even_by_racing_processes(fresh_redis: RedisServer, tmp_path: Path):
    wals = [FileWAL(tmp_path / f"{i}.wal") for i in range(2)]
    stores = [RedisApprovalStore(fresh_redis.url, prefix=P) for _ in range(2)]
    try:
        gws = [ApprovalGateway(s, None, w, ApprovalPolicy(timeout=900), poll=0.01) for s, w in zip(stores, wals, strict=True)]
        request = StepRequest("saga-1", "saga-1/0", "wire.send", I, {"amount": 1}, ())

        async def race() -> list[bool]:
            tasks = [asyncio.create_task(gw.request_approval(request, PENDING)) for gw in gws]
            await until_async("the request stored", stores[0].list, interval=0.01)
            await asyncio.sleep(0.05)  # both are waiting on the same request
            decide_request(stores[0], stores[0].list()[0].id, approved=True, approver="risk@corp", now=time.time())
            # an operator writing the same decision again, or a late second one, changes nothing
            assert stores[1].decide(stores[0].list()[0].id, Decision("Denied", "late@corp", time.time(), "")).approver \
                == "risk@corp"
            return [o.approved for o in await asyncio.gather(*tasks)]

        assert sorted(asyncio.run(race())) == [False, True]
    finally:
        for s in stores:
            s.close()
        for w in wals:
            w.close()


def test_an_unreachable_store_denies(redis_server_factory, tmp_path: Path):
    server = redis_server_factory()
    url = server.url
    server.kill()
    wal = FileWAL(tmp_path / "a.wal")
    store = RedisApprovalStore(url, socket_timeout=0.5, connect_timeout=0.5)
    try:
        gw = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=900))
        outcome = asyncio.run(gw.request_approval(StepRequest("s", "s/0", "wire.send", I, {}, ()), PENDING))
        assert not outcome.approved and "approvals fail closed" in outcome.note and "RedisApprovalStore" in outcome.note
    finally:
        store.close()
        wal.close()


def test_a_passkey_approval_through_redis_signed_in_place_and_a_replay_onto_a_retry_is_refused(
        fresh_redis: RedisServer, tmp_path: Path):
    """The challenge and the assertion ride in the Redis documents (read back byte-exact for
    the compare-and-set that consumes the approval); the assertion of one request copied onto
    a later request for the same step does not approve it (a fresh nonce: another action)."""
    from agent_saga.controls.approvals import ActionChallenge, ApproverKeyring, sign_challenge
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    ring = ApproverKeyring(tmp_path / "keyring.json")
    ring.enrol(key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo),
               approver="risk@corp", by="soc@corp", now=time.time())
    wal, store = FileWAL(tmp_path / "a.wal"), RedisApprovalStore(fresh_redis.url, prefix=P)
    r = fresh_redis.client()
    try:
        gw = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=60), poll=0.02, passkeys=ring)
        step = StepRequest("saga-pk", "saga-pk/0", "wire.send", I, {"amount": 80000, "to": "acct_9"}, ())

        async def ask(answer) -> Any:
            task = asyncio.create_task(gw.request_approval(step, PENDING))
            listed = await until_async("the request stored", store.list, interval=0.01)
            answer(listed[0])
            return await task

        signed: dict = {}

        def approve(req) -> None:
            def assertion(current) -> dict:
                signed["doc"] = sign_challenge(key, ActionChallenge.from_doc(current.challenge)).to_doc()
                return signed["doc"]
            decide_request(store, req.id, approved=True, approver="risk@corp", now=time.time(), passkey=assertion)

        outcome = asyncio.run(ask(approve))
        assert outcome.approved and outcome.approver == "risk@corp"
        (req,) = store.list()
        doc = json.loads(r.get(f"{P}:approval:request:{req.id}"))
        decision = json.loads(r.get(f"{P}:approval:decision:{req.id}"))
        assert doc["challenge"]["nonce"] and doc["challenge"]["stepId"] == "saga-pk/0" and doc["consumedAt"]
        assert decision["passkey"] == signed["doc"]
        r.delete(f"{P}:approval:request:{req.id}", f"{P}:approval:decision:{req.id}")

        def replay(req2) -> None:
            assert req2.id == req.id and req2.challenge["nonce"] != doc["challenge"]["nonce"]
            store.decide(req2.id, Decision.from_doc(decision))  # yesterday's signed yes, copied

        denied = asyncio.run(ask(replay))
        assert not denied.approved and "passkey refused" in denied.note and "another action" in denied.note
    finally:
        r.close()
        store.close()
        wal.close()
