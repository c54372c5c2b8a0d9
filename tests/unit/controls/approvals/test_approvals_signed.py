"""Signed decisions through the real gate and engine (FileApprovalStore, FileWAL, real
Ed25519 keys): with trusted keys an agent proceeds only on an approval signed by one of
them; an unsigned, forged, altered or replayed approval is ignored, logged as forged, and
the request expires (deny). Denials need no signature. Without cryptography, trusting
keys is a configuration error naming the fix."""

from __future__ import annotations

import base64
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from agent_saga.audit.checkpoints import generate_signing_key
from agent_saga.clocks import format_instant
from agent_saga.controls import (
    ApprovalGateway,
    ApprovalPolicy,
    EscalationLevel,
    FileApprovalStore,
    ManualClock,
)
from agent_saga.controls.approvals import (
    ApprovalNotice,
    Decision,
    DecisionSigner,
    TrustedKeys,
    decide_request,
)
from agent_saga.controls.approvals._render import render_action
from agent_saga.controls.approvals._signing import approver_header
from agent_saga.errors import ConfigurationError, GateBlocked
from agent_saga.records import canonical_json
from engine_support import read, wal_fixture  # noqa: F401
from test_approvals import kinds, wire


def action(r) -> dict:
    """What a decider signs besides the decision: the tool and the rendered action."""
    return {"tool": r.tool, "action_digest": r.action_view().digest}


def keypair(tmp_path: Path, name: str, approvers: tuple[str, ...] = ("*",)) -> tuple[DecisionSigner, str]:
    """A signing key and its public key file, bound to ``approvers`` (``*``: a decider's
    key, as the operator's)."""
    priv, pub = generate_signing_key(tmp_path / name)
    text = Path(pub).read_text()
    Path(pub).write_text(approver_header(approvers) + text)
    return DecisionSigner.from_file(priv), pub


class Decider:
    """Answers at level 0 through the store, the way ``answer(store, request)`` says."""

    def __init__(self, store: FileApprovalStore, answer) -> None:
        self.store, self.answer = store, answer
        self.requests: list = []

    async def notify(self, notice: ApprovalNotice) -> None:
        self.requests.append(notice.request)
        self.answer(self.store, notice.request)


def gateway(tmp_path: Path, wal, answer, *, trusted, clock=None) -> ApprovalGateway:
    store = FileApprovalStore(tmp_path / "approvals")
    return ApprovalGateway(store, Decider(store, answer), wal,
                           ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),)),
                           poll=30 if clock else 0.01, clock=clock, trusted_keys=trusted)


def approve_signed(signer: DecisionSigner):
    def answer(store, r):
        decide_request(store, r.id, approved=True, approver="risk@corp", now=r.requested_at + 1,
                       note="verified by phone", signer=signer)
    return answer


def write_raw(doc_of):
    """Write a decision document straight into the store, as a credential holder could."""
    def answer(store, r):
        store.decide(r.id, Decision.from_doc(doc_of(r)))
    return answer


def unsigned_doc(r) -> dict:
    return Decision("Approved", "cfo@corp", r.requested_at + 1, r.arguments_digest, None, "agent").to_doc(
        r.id, r.namespace)


def decided(wal, saga: str) -> list[dict]:
    return [rec.payload for rec in read(wal, saga) if rec.type == "APPROVAL_DECIDED"]


async def test_a_signed_approval_from_a_trusted_key_proceeds_and_the_wal_names_the_key(tmp_path, wal):
    signer, pub = keypair(tmp_path, "operator")
    gw = gateway(tmp_path, wal, approve_signed(signer), trusted=pub)
    assert await wire(wal, gw, saga_id="s-ok") == ["sent"]
    (d,) = decided(wal, "s-ok")
    assert d["approver"] == "risk@corp"
    assert d["signature"] == {"alg": "Ed25519", "keyId": signer.key_id, "verified": True,
                              "keyOwner": "* (a decider's key: any approver it authenticated)"}
    (req,) = gw.store.list()
    doc = req.decision.to_doc(req.id, req.namespace)
    assert doc["signature"]["keyId"] == signer.key_id and doc["expiresAt"]


@pytest.mark.parametrize("attack", ["unsigned", "untrusted key", "altered approver", "copied from another request",
                                    "another rendered action", "another tool", "format v1"])
async def test_an_unproven_approval_is_ignored_logged_as_forged_and_the_request_expires(
        tmp_path, wal, caplog, attack):
    signer, pub = keypair(tmp_path, "operator")
    rogue, _ = keypair(tmp_path, "rogue")

    def forged(r) -> dict:
        if attack == "unsigned":
            return unsigned_doc(r)
        if attack == "untrusted key":
            return rogue.sign(unsigned_doc(r), expires_at=r.deadline, **action(r))
        if attack == "altered approver":
            return {**signer.sign(unsigned_doc(r), expires_at=r.deadline, **action(r)), "approver": "ceo@corp"}
        if attack == "another rendered action":  # the decider showed the human something else
            return signer.sign(unsigned_doc(r), expires_at=r.deadline, tool=r.tool,
                               action_digest=render_action(r.tool, {"amount": 80, "to": "acct_9"}).digest)
        if attack == "another tool":
            return signer.sign(unsigned_doc(r), expires_at=r.deadline, tool="crm.add_note",
                               action_digest=action(r)["action_digest"])
        if attack == "format v1":  # signed over the fields of v1, which covered neither
            doc = {**unsigned_doc(r), "expiresAt": format_instant(r.deadline)}
            body = {k: doc.get(k) for k in ("requestId", "argumentsDigest", "decision", "approver",
                                            "authenticatedUser", "decidedAt", "expiresAt", "breakGlass")}
            sig = signer._key.sign(b"agent-saga.approval-decision/v1\n" + canonical_json(body).encode())
            return {**doc, "signature": {"alg": "Ed25519", "keyId": signer.key_id,
                                         "sig": base64.b64encode(sig).decode()}}
        other = {**unsigned_doc(r), "requestId": "0" * 32, "id": f"{r.namespace}/{'0' * 32}"}
        return {**signer.sign(other, expires_at=r.deadline, **action(r)), "requestId": r.id}

    clock = ManualClock()
    gw = gateway(tmp_path, wal, write_raw(forged), trusted=TrustedKeys.from_path(pub), clock=clock)
    with caplog.at_level(logging.WARNING, logger="agent_saga.controls"), pytest.raises(GateBlocked) as info:
        await wire(wal, gw, saga_id="s-forged")
    assert "expiry denies" in info.value.reason and "ignored" in info.value.reason
    assert 900 <= sum(clock.sleeps) < 901, "it stayed pending until the deadline"
    (d,) = decided(wal, "s-forged")
    assert d["decision"] == "Expired" and d["approver"] == "agent-saga" and d["forged"]
    forged_logs = [r.getMessage() for r in caplog.records if "ignored as forged" in r.getMessage()]
    assert len(forged_logs) == 1, "logged once, not once per poll"
    assert "BEGIN" not in forged_logs[0] and "sig" not in forged_logs[0].split("forged:")[0]
    assert kinds(wal, "s-forged") == ["APPROVAL_REQUESTED", "APPROVAL_DECIDED"]
    said = {"another rendered action": "the approver was shown another action",
            "another tool": "covers 'crm.add_note'", "format v1": "signed in the format "
            "agent-saga.approval-decision/v1, which covers neither the tool nor the action the approver was shown"}
    assert said.get(attack, "") in d["forged"], d["forged"]


async def test_a_signed_decision_replayed_onto_a_new_request_with_the_same_id_is_refused(tmp_path, wal):
    """The same (saga, step, tool, rule) asked again later has the same id but another
    deadline: yesterday's signed yes does not carry over."""
    signer, pub = keypair(tmp_path, "operator")
    old: dict = {}

    def replay(store, r):
        earlier = signer.sign(unsigned_doc(r), expires_at=r.deadline - 86_400, **action(r))
        old["doc"] = earlier
        store.decide(r.id, Decision.from_doc(earlier))

    clock = ManualClock()
    gw = gateway(tmp_path, wal, replay, trusted=pub, clock=clock)
    with pytest.raises(GateBlocked) as info:
        await wire(wal, gw, saga_id="s-replay")
    assert "replayed decision of an earlier request" in info.value.reason
    assert old["doc"]["signature"]["keyId"] == signer.key_id


async def test_denials_need_no_signature(tmp_path, wal):
    _, pub = keypair(tmp_path, "operator")

    def deny(store, r):
        decide_request(store, r.id, approved=False, approver="risk@corp", now=r.requested_at + 1, note="no")

    gw = gateway(tmp_path, wal, deny, trusted=pub)
    with pytest.raises(GateBlocked) as info:
        await wire(wal, gw, saga_id="s-deny")
    assert "denied by risk@corp: no" in info.value.reason


async def test_without_trusted_keys_approvals_are_accepted_unsigned_and_the_wal_says_so(tmp_path, wal, monkeypatch):
    monkeypatch.delenv("AGENT_SAGA_APPROVAL_KEYS", raising=False)
    gw = gateway(tmp_path, wal, write_raw(unsigned_doc), trusted=None)
    assert await wire(wal, gw, saga_id="s-unsigned") == ["sent"]
    (d,) = decided(wal, "s-unsigned")
    assert d["signature"] == "not checked: no trusted approver keys are configured"


async def test_a_key_directory_trusts_every_key_in_it_so_keys_rotate(tmp_path, wal, monkeypatch):
    keys = tmp_path / "trusted"
    keys.mkdir()
    old_signer, _ = keypair(keys, "old")
    new_signer, _ = keypair(keys, "new")
    for p in keys.iterdir():  # only the public halves are mounted where agents run
        if not p.name.endswith(".pub"):
            p.unlink()
    monkeypatch.setenv("AGENT_SAGA_APPROVAL_KEYS", str(keys))
    for i, signer in enumerate((old_signer, new_signer)):
        gw = gateway(tmp_path / str(i), wal, approve_signed(signer), trusted=None)
        assert await wire(wal, gw, saga_id=f"s-rot-{i}") == ["sent"]
        assert decided(wal, f"s-rot-{i}")[0]["signature"]["keyId"] == signer.key_id


def test_bad_key_configuration_names_the_field_and_the_fix(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        TrustedKeys.from_path(tmp_path / "missing.pem")
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(ConfigurationError, match="BEGIN PUBLIC KEY"):
        TrustedKeys.from_path(tmp_path / "junk.pem")
    _, bare = generate_signing_key(tmp_path / "bare")
    with pytest.raises(ConfigurationError, match="not bound to any approver name: put one line 'Approver: NAME'"):
        TrustedKeys.from_path(bare)
    Path(bare).write_text("Approver: \u0441fo@corp\n" + Path(bare).read_text())
    with pytest.raises(ConfigurationError, match=r"Cyrillic Small Letter Es \(U\+0441\), which looks like the Latin 'c'"):
        TrustedKeys.from_path(bare)
    # An empty directory (a ConfigMap the operator has not filled yet) trusts nothing and
    # still requires signatures (the gateway ignores an unsigned approval: test_approval_key_memory).
    (tmp_path / "empty").mkdir()
    assert len(TrustedKeys.from_path(tmp_path / "empty")) == 0


def test_trusted_keys_without_cryptography_fail_closed_naming_the_fix(tmp_path):
    _, pub = generate_signing_key(tmp_path / "k")
    code = (
        "import sys; sys.modules['cryptography'] = None\n"
        "from agent_saga.controls.approvals import TrustedKeys\n"
        "from agent_saga.errors import ConfigurationError\n"
        "try:\n    TrustedKeys.from_path(sys.argv[1])\n"
        "except ConfigurationError as e:\n    print(e.message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, pub], capture_output=True, text=True, check=True).stdout
    assert "pip install 'agent-saga[signing]'" in out and "refused" in out


async def test_deciding_in_process_refuses_what_the_agents_would_ignore_and_a_signed_yes_proceeds(tmp_path, wal):
    import asyncio

    from agent_saga.controls.approvals import ApprovalRefused
    from fixtures.polling import until_async

    signer, pub = keypair(tmp_path, "operator")
    asked: list = []
    gw = gateway(tmp_path, wal, lambda store, r: asked.append(r), trusted=pub)
    sent = asyncio.create_task(wire(wal, gw, saga_id="s-in"))
    await until_async("the approval request", lambda: asked, timeout=10)
    with pytest.raises(ApprovalRefused, match="an unsigned approval would be ignored"):
        await gw.decide(asked[0].id, approved=True, approver="risk@corp")  # unsigned: it would wait forever
    assert not sent.done() and gw.store.get(asked[0].id).decision is None
    await gw.decide(asked[0].id, approved=True, approver="risk@corp", signer=signer, note="verified by phone")
    assert await asyncio.wait_for(sent, 10) == ["sent"]
