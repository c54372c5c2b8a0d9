"""Who may approve, on a real redis-server with the ACL users of ``agent-saga acl``: an agent
with its least-privilege credential (trusting only the keys published in the policy
plane, as examples/payments is wired), the CLI as a real subprocess with the approver's
credential, the operator's credential publishing the approver keys.

Rows: a key approves only as the approver it is bound to (another name, a Cyrillic
look-alike: refused by the CLI, ignored by the agent); after a data loss an unsigned
approval is refused; the CLI refuses an unsigned approval once keys are published, and a
signed one then replaces an unsigned one a request was stuck on; credentials in --note,
--reason and names never reach the policy plane; a deadline moved in the document
extends nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga.audit.checkpoints import generate_signing_key
from agent_saga.clocks import as_clock, format_instant
from agent_saga.controls import (
    ApprovalGateway,
    ApprovalPolicy,
    EscalationLevel,
    ManualClock,
    RedisApprovalStore,
)
from agent_saga.controls.approvals import ApprovalNotice, Decision, DecisionSigner, decide_request
from agent_saga.controls.approvals._signing import approver_header
from agent_saga.controls.gate import PreFlightDecision
from agent_saga.gates import StepRequest
from agent_saga.plane._acl import preload_scripts
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL
from fixtures.cli import cli_module
from fixtures.polling import until_async
from fixtures.redis_server import PLANE_ENV, RedisServer, client_for
from fixtures.redis_server import PLANE_PREFIX as P
from test_plane_acl import Users

PENDING = PreFlightDecision("REQUIRE_APPROVAL", "Action cannot be undone", "rule:irreversible", False, "rules")
SECRET = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
LOOKALIKE = "\u0441fo@corp"  # Cyrillic es, then "fo@corp"


@pytest.fixture
def users(fresh_redis: RedisServer) -> Iterator[Users]:
    u = Users(fresh_redis)
    yield u
    for n in u.names:
        fresh_redis.command("ACL", "DELUSER", n)


class Plane:
    """The operator's credential (scripts, published keys), an agent's and an approver's."""

    def __init__(self, users: Users, tmp_path: Path, owner: str | None = None) -> None:
        self.op = client_for(users.make("operator"))
        preload_scripts(self.op)
        # ``owner``: the agent keeps its requests under its own name (an ACL user per pod).
        self.agent_url = users.make("agent", **({"agent": owner} if owner else {}))
        self.approver_url = users.make("approver")
        self.agent_store = RedisApprovalStore(self.agent_url, prefix=P, owner=owner)
        self.cli_store = RedisApprovalStore(self.approver_url, prefix=P)
        self.tmp = tmp_path

    def key(self, name: str, approver: str) -> tuple[DecisionSigner, str]:
        """An approver's key pair, its public file bound to ``approver``."""
        priv, pub = generate_signing_key(self.tmp / name)
        Path(pub).write_text(approver_header([approver]) + Path(pub).read_text())
        return DecisionSigner.from_file(priv), priv

    def publish(self, signer: DecisionSigner, approver: str) -> None:
        """What the operator does with ``--approval-keys``: the key, bound to its approver."""
        self.op.hset(f"{P}:approval:keys", signer.key_id, signer.public_pem([approver]))

    def gateway(self, wal: FileWAL, timeout: float, **kw) -> ApprovalGateway:
        kw.setdefault("trusted_keys", None)
        return ApprovalGateway(self.agent_store, kw.pop("notifier", None), wal, ApprovalPolicy(timeout=timeout),
                               poll=kw.pop("poll", 0.05), **kw)

    async def pending(self, saga: str):
        """The request of ``saga`` once it is pending (read with the approver's credential)."""
        while True:
            found = [r for r in self.cli_store.list(pending_only=True) if r.saga_id == saga]
            if found:
                return found[0]
            await asyncio.sleep(0.02)

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **PLANE_ENV, "AGENT_SAGA_APPROVAL_STORE": self.approver_url,
               "AGENT_SAGA_REDIS_URL": self.approver_url}
        env.pop("AGENT_SAGA_APPROVAL_KEYS", None)
        env.pop("AGENT_SAGA_APPROVAL_SIGNING_KEY", None)
        return cli_module(*argv, env=env, timeout=120)

    def close(self) -> None:
        for s in (self.agent_store, self.cli_store):
            s.close()
        self.op.close()


@pytest.fixture
def plane(users: Users, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Plane]:
    p = Plane(users, tmp_path, getattr(request, "param", None))
    yield p
    p.close()


def call(saga: str) -> StepRequest:
    return StepRequest(saga, f"{saga}/0", "wire.send", ActionSemantics.IRREVERSIBLE, {"amount": 80_000}, ())


async def adecided(wal: FileWAL, saga: str) -> list[dict]:
    await wal.barrier()
    return [r.payload async for r in wal.read_all() if r.type == "APPROVAL_DECIDED" and r.saga == saga]


# ---------------------------------------------------------------------- a key, its approver
async def test_a_key_approves_only_as_the_approver_it_is_bound_to(plane: Plane, tmp_path: Path, caplog) -> None:
    risk, risk_pem = plane.key("risk.pem", "risk@corp")
    plane.publish(risk, "risk@corp")
    wal = FileWAL(tmp_path / "w.wal")
    gw = plane.gateway(wal, timeout=30)

    async def answer_as(saga: str, approver: str) -> None:
        r = await plane.pending(saga)
        # The CLI refuses: the key is bound to risk@corp, and a look-alike name is no name.
        out = await asyncio.to_thread(plane.cli, "approvals", "approve", r.id, "--approver", approver,
                                      "--signing-key", risk_pem)
        assert out.returncode == 1, out
        assert ("bound to risk@corp" in out.stderr) if approver == "cfo@corp" else \
            ("Cyrillic Small Letter Es" in out.stderr), out.stderr
        assert plane.cli_store.get(r.id).decision is None, "nothing was written"
        # A CLI without that check (an older one, a script): the agent ignores it.
        decide_request(plane.cli_store, r.id, approved=True, approver=approver, now=time.time(), signer=risk)

    # The agent's clock moves past the deadline only once the forged approval was read and
    # ignored: the CLI may take its time, whatever the machine's load.
    skew = [0.0]
    gw_short = plane.gateway(wal, timeout=30, clock=as_clock(lambda: time.time() + skew[0]))

    async def expired_after(answer) -> None:
        await answer
        await until_async("the agent to ignore the approval", lambda: any(
            "ignored as forged" in r.getMessage() for r in caplog.records), timeout=30)
        skew[0] = 60.0

    caplog.set_level(logging.WARNING, logger="agent_saga.controls")
    outs = await asyncio.gather(gw_short.request_approval(call("s-cfo"), PENDING),
                                expired_after(answer_as("s-cfo", "cfo@corp")))
    assert not outs[0].approved and "expiry denies" in outs[0].note
    assert "bound to risk@corp, not to 'cfo@corp'" in outs[0].note, outs[0].note
    # The look-alike is written straight into Redis (decide_request refuses the name too).
    async def lookalike() -> None:
        r = await plane.pending("s-look")
        out = await asyncio.to_thread(plane.cli, "approvals", "approve", r.id, "--approver", LOOKALIKE,
                                      "--signing-key", risk_pem)
        assert out.returncode == 1 and "Cyrillic Small Letter Es" in out.stderr, out
        forged = risk.sign(Decision("Approved", LOOKALIKE, time.time(), r.arguments_digest).to_doc(r.id, r.namespace),
                           expires_at=r.deadline, tool=r.tool, action_digest=r.action_view().digest)
        plane.cli_store.decide(r.id, Decision.from_doc(forged))
    caplog.clear()
    skew[0] = 0.0
    outs = await asyncio.gather(gw_short.request_approval(call("s-look"), PENDING), expired_after(lookalike()))
    assert not outs[0].approved and "Cyrillic Small Letter Es" in outs[0].note, outs[0].note

    # Legitimate: the key's own approver, signed; the WAL names the key and its owner.
    async def legit() -> None:
        r = await plane.pending("s-ok")
        out = await asyncio.to_thread(plane.cli, "approvals", "approve", r.id, "--approver", "risk@corp",
                                      "--signing-key", risk_pem)
        assert out.returncode == 0, out
    outs = await asyncio.gather(gw.request_approval(call("s-ok"), PENDING), legit())
    assert outs[0].approved and outs[0].approver == "risk@corp", outs[0]
    (d,) = await adecided(wal, "s-ok")
    assert d["signature"] == {"alg": "Ed25519", "keyId": risk.key_id, "verified": True, "keyOwner": "risk@corp"}
    wal.close()


# ---------------------------------------------------------------------- a data loss
async def test_after_a_data_loss_an_unsigned_approval_is_refused(plane: Plane, fresh_redis: RedisServer,
                                                                 tmp_path: Path) -> None:
    """The agent trusts only published keys (no AGENT_SAGA_APPROVAL_KEYS). Keys were
    published when it asked; the server then loses its data (the keys with it): the
    waiting agent stores its request again as it was (no decision) and it expires. An
    unsigned approval is then written for its next request: refused, not accepted."""
    risk, _ = plane.key("risk.pem", "risk@corp")
    plane.publish(risk, "risk@corp")
    wal = FileWAL(tmp_path / "w.wal")
    gw = plane.gateway(wal, timeout=3)

    async def lose_data() -> None:
        await plane.pending("s-before")
        admin = fresh_redis.client()
        admin.flushall()
        admin.close()
        preload_scripts(plane.op)  # the operator loads the scripts again; it has not republished yet
    outs = await asyncio.gather(gw.request_approval(call("s-before"), PENDING), lose_data())
    assert not outs[0].approved and "expiry denies" in outs[0].note, outs[0].note
    remade = [r.payload for r in [x async for x in wal.read_all()]
              if r.type == "APPROVAL_RESUMED" and r.payload["request_id"] == outs[0].request_id]
    assert remade and "disappeared from the store" in remade[0]["note"], remade
    assert not plane.op.exists(f"{P}:approval:keys")

    async def unsigned() -> None:
        r = await plane.pending("s-after")
        plane.agent_store.decide(r.id, Decision("Approved", "cfo@corp", time.time(), r.arguments_digest))
    outs = await asyncio.gather(gw.request_approval(call("s-after"), PENDING), unsigned())
    assert not outs[0].approved and "expiry denies" in outs[0].note
    assert "not signed" in outs[0].note, outs[0].note
    wal.close()


async def test_a_mounted_key_directory_requires_signatures_while_it_is_empty(plane: Plane, tmp_path: Path) -> None:
    """AGENT_SAGA_APPROVAL_KEYS names the directory the chart mounts (a ConfigMap the
    operator fills): while it holds no key, an unsigned approval is refused; a key added
    there later is trusted without a restart."""
    keys = tmp_path / "keys"
    keys.mkdir()
    wal = FileWAL(tmp_path / "w.wal")
    gw = plane.gateway(wal, timeout=3, trusted_keys=keys)

    async def unsigned() -> None:
        r = await plane.pending("s-empty")
        plane.agent_store.decide(r.id, Decision("Approved", "risk@corp", time.time(), r.arguments_digest))
    outs = await asyncio.gather(gw.request_approval(call("s-empty"), PENDING), unsigned())
    assert not outs[0].approved and "not signed" in outs[0].note, outs[0].note

    risk, _ = plane.key("risk.pem", "risk@corp")
    (keys / "risk.pem.pub").write_text(risk.public_pem(["risk@corp"]))

    async def signed() -> None:
        r = await plane.pending("s-filled")
        decide_request(plane.cli_store, r.id, approved=True, approver="risk@corp", now=time.time(), signer=risk)
    gw_long = plane.gateway(wal, timeout=30, trusted_keys=gw._configured)
    outs = await asyncio.gather(gw_long.request_approval(call("s-filled"), PENDING), signed())
    assert outs[0].approved, outs[0]
    wal.close()


# ---------------------------------------------------------------------- unsigned CLI approvals
@pytest.mark.parametrize("plane", [None, "payments/payments-1"], ids=["shared-credential", "per-pod-keys"],
                         indirect=True)
async def test_the_cli_refuses_an_unsigned_approval_and_a_signed_one_replaces_an_unsigned_one(
        plane: Plane, tmp_path: Path) -> None:
    risk, risk_pem = plane.key("risk.pem", "risk@corp")
    plane.publish(risk, "risk@corp")
    wal = FileWAL(tmp_path / "w.wal")
    gw = plane.gateway(wal, timeout=60)

    async def answer() -> None:
        r = await plane.pending("s-stuck")
        owner = plane.agent_store.owner
        # Kept under the agent's own name when it has one: the replacement finds it there.
        assert plane.op.exists(f"{P}:approval:request:{owner + '/' if owner else ''}{r.id}") == 1
        out = await asyncio.to_thread(plane.cli, "approvals", "approve", r.id, "--approver", "risk@corp")
        assert out.returncode == 1, out
        assert "--signing-key KEY.pem (or $AGENT_SAGA_APPROVAL_SIGNING_KEY)" in out.stderr, out.stderr
        assert plane.cli_store.get(r.id).decision is None, "an approval the agents ignore is never written"
        # An unsigned approval already stored (an older CLI): the request is not stuck on it.
        decide_request(plane.cli_store, r.id, approved=True, approver="risk@corp", now=time.time())
        assert plane.cli_store.get(r.id).state == "Approved"
        listed = await asyncio.to_thread(plane.cli, "approvals", "list")
        assert listed.returncode == 0 and r.id in listed.stdout, listed
        assert "PENDING: the approval by risk@corp is ignored by the agents (the decision is not signed)" in \
            listed.stdout, listed.stdout
        out = await asyncio.to_thread(plane.cli, "approvals", "approve", r.id, "--approver", "risk@corp",
                                      "--signing-key", risk_pem, "--note", "verified by phone")
        assert out.returncode == 0, out
        assert plane.cli_store.get(r.id).decision.seal is not None
    outs = await asyncio.gather(gw.request_approval(call("s-stuck"), PENDING), answer())
    assert outs[0].approved and outs[0].note == "verified by phone", outs[0]
    # A proven decision is never replaced.
    (r,) = [x for x in plane.cli_store.list() if x.saga_id == "s-stuck"]
    out = plane.cli("approvals", "deny", r.id, "--approver", "risk@corp")
    assert out.returncode == 1 and "already approved" in out.stderr, out
    wal.close()


# ---------------------------------------------------------------------- credentials in text
def test_credentials_in_notes_reasons_and_names_never_reach_the_policy_plane(plane: Plane, tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w.wal")
    gw = plane.gateway(wal, timeout=60)

    async def ask() -> tuple:
        task = asyncio.ensure_future(gw.request_approval(call("s-note"), PENDING))
        r = await plane.pending("s-note")
        bad = await asyncio.to_thread(plane.cli, "approvals", "deny", r.id, "--approver", f"risk {SECRET}")
        out = await asyncio.to_thread(plane.cli, "approvals", "deny", r.id, "--approver", "risk@corp", "--note",
                                      f"token {SECRET}")
        return await task, bad, out, r.id
    outcome, bad, out, rid = asyncio.run(ask())
    assert bad.returncode == 2 and "looks like a credential" in bad.stderr and SECRET not in bad.stderr, bad
    assert out.returncode == 0 and "replaced by [REDACTED]" in out.stderr, out
    stored = plane.op.get(f"{P}:approval:decision:{rid}").decode()
    assert SECRET not in stored and json.loads(stored)["note"] == "token [REDACTED]"
    assert not outcome.approved and SECRET not in outcome.note

    halt = plane.cli("halt", "--scope", "tool:wire.send", "--reason", f"leaked {SECRET}", "--by", "soc@corp",
                     "--store", plane.approver_url)
    assert halt.returncode == 0 and "replaced by [REDACTED]" in halt.stderr, halt
    docs = [plane.op.get(k).decode() for k in plane.op.scan_iter(match=f"{P}:killswitch:*")
            if not k.decode().endswith(":index")]
    assert docs and all(SECRET not in d for d in docs) and any("[REDACTED]" in d for d in docs), docs
    by = plane.cli("halt", "--scope", "tool:x", "--reason", "r", "--by", SECRET, "--store", plane.approver_url)
    assert by.returncode == 2 and "--by holds what looks like a credential" in by.stderr, by
    wal.close()


# ---------------------------------------------------------------------- a moved deadline
async def test_a_deadline_moved_in_the_document_extends_nothing(plane: Plane, tmp_path: Path) -> None:
    """An attacker with the agent's credential moves the request's deadline an hour later;
    a human then approves (signed, by a trusted key) after the deadline the agent set. The
    agent keeps its own deadline: the approval is ignored and the request expires at it."""
    risk, _ = plane.key("risk.pem", "risk@corp")
    plane.publish(risk, "risk@corp")
    wal = FileWAL(tmp_path / "w.wal")
    clock = ManualClock(time.time())

    class Mover:
        async def notify(self, notice: ApprovalNotice) -> None:
            r = notice.request
            doc = json.loads(plane.agent_store._fetch(r.id)[0])
            doc["deadline"] = format_instant(r.deadline + 3600)
            plane.agent_store._main_client().set(plane.agent_store.request_key(r.id), json.dumps(doc))
            late = r.deadline + 10  # after the agent's deadline, before the moved one
            decide_request(plane.cli_store, r.id, approved=True, approver="risk@corp", now=late, signer=risk)

    gw = ApprovalGateway(plane.agent_store, Mover(), wal, ApprovalPolicy(timeout=900, levels=(
        EscalationLevel(("@oncall",)),)), poll=30, clock=clock)
    out = await gw.request_approval(call("s-moved"), PENDING)
    assert not out.approved and "expiry denies" in out.note, out
    assert 900 <= sum(clock.sleeps) < 901, "it expired at the deadline the agent set"
    (d,) = await adecided(wal, "s-moved")
    assert d["decision"] == "Expired" and "another deadline" in d["forged"], d
    wal.close()
