"""Passkey approvals through the real gate and engine (FileApprovalStore, FileWAL, real
Ed25519 keys from ``cryptography`` standing in for authenticators): an IRREVERSIBLE step
proceeds only when the approver's own enrolled, unrevoked key signed the challenge of
exactly this action; every other assertion is refused, before the call, with a reason
naming what failed, and the WAL records the key id (never key material)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from agent_saga.controls import ApprovalGateway, ApprovalPolicy, EscalationLevel, FileApprovalStore
from agent_saga.controls.approvals import (
    ActionChallenge,
    ApprovalNotice,
    ApproverKeyring,
    PasskeyAssertion,
    PasskeyRefused,
    PasskeyVerifier,
    decide_request,
    sign_challenge,
)
from agent_saga.errors import ConfigurationError, GateBlocked
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from engine_support import read, wal_fixture  # noqa: F401
from test_approvals import kinds, wire

NOW = 1_780_000_000.0


def pem(priv: Ed25519PrivateKey) -> str:
    return priv.public_key().public_bytes(serialization.Encoding.PEM,
                                          serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture
def keys(tmp_path: Path) -> dict:
    ring = ApproverKeyring(tmp_path / "keyring.json")
    risk, cfo, stranger = (Ed25519PrivateKey.generate() for _ in range(3))
    ring.enrol(pem(risk), approver="risk@corp", by="soc@corp", now=NOW, label="yubikey 5c")
    ring.enrol(pem(cfo), approver="cfo@corp", by="soc@corp", now=NOW)
    return {"ring": ring, "risk": risk, "cfo": cfo, "stranger": stranger}


class Decider:
    """Answers at level 0 through the store with ``answer(store, request)``."""

    def __init__(self, store: FileApprovalStore, answer) -> None:
        self.store, self.answer = store, answer

    async def notify(self, notice: ApprovalNotice) -> None:
        self.answer(self.store, notice.request)


def gateway(tmp_path: Path, wal, answer, ring) -> ApprovalGateway:
    store = FileApprovalStore(tmp_path / "approvals")
    return ApprovalGateway(store, Decider(store, answer), wal,
                           ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),)),
                           poll=0.01, passkeys=ring)


def approve_with(assertion_of, approver: str = "risk@corp"):
    def answer(store, r):
        decide_request(store, r.id, approved=True, approver=approver, now=r.requested_at + 1, note="on the key",
                       passkey=lambda req: assertion_of(ActionChallenge.from_doc(req.challenge)))
    return answer


def decided(wal, saga: str) -> dict:
    (d,) = [rec.payload for rec in read(wal, saga) if rec.type == "APPROVAL_DECIDED"]
    return d


async def test_the_approvers_key_signing_this_action_approves_and_the_wal_names_the_key(tmp_path, wal, keys):
    gw = gateway(tmp_path, wal, approve_with(lambda c: sign_challenge(keys["risk"], c).to_doc()), keys["ring"])
    assert await wire(wal, gw, saga_id="s-ok") == ["sent"]
    d = decided(wal, "s-ok")
    (req,) = gw.store.list()
    challenge = ActionChallenge.from_doc(req.challenge)
    assert (challenge.tool, challenge.saga_id, challenge.step_id, challenge.arguments_digest) == (
        "wire.send", "s-ok", req.step_id, req.arguments_digest)
    assert challenge.expires_at == pytest.approx(req.deadline) and len(challenge.nonce) == 32
    kid = keys["ring"].keys()[0].key_id
    assert d["decision"] == "Approved" and d["passkey"] == {
        "keyId": kid, "approver": "risk@corp", "label": "yubikey 5c", "format": "ed25519",
        "challenge": challenge.digest.hex(), "nonce": challenge.nonce, "verified": True}
    record = json.dumps([rec.payload for rec in read(wal, "s-ok")])
    assert "PRIVATE" not in record and req.decision.passkey["sig"] not in record, "the WAL holds the key id only"
    assert kinds(wal, "s-ok") == ["APPROVAL_REQUESTED", "APPROVAL_DECIDED"]


def _other_action(keys):
    def sign(c: ActionChallenge) -> dict:
        other = ActionChallenge(c.request_id, c.tool, "sha256:" + "0" * 64, c.saga_id, c.step_id, c.expires_at,
                                c.nonce)
        return sign_challenge(keys["risk"], other).to_doc()
    return sign


def _forged(keys):
    def sign(c: ActionChallenge) -> dict:
        good = sign_challenge(keys["risk"], c)
        return PasskeyAssertion(good.key_id, good.challenge, bytes(64)).to_doc()
    return sign


@pytest.mark.parametrize(("attack", "code", "words"), [
    ("a signature over a different action", "other-action", "it approves another action"),
    ("an unenrolled key", "unenrolled", "is not enrolled in the approver keyring"),
    ("a revoked key", "revoked", "was revoked at"),
    ("another approver's key", "approver", "is enrolled for cfo@corp, but the approval names risk@corp"),
    ("a forged signature", "forged", "does not verify over this action"),
    ("no passkey at all", "missing", "carries no passkey signature"),
])
async def test_every_other_assertion_is_refused_before_the_call_naming_what_failed(
        tmp_path, wal, keys, attack, code, words):
    ring = keys["ring"]
    if attack == "a revoked key":
        ring.revoke(ring.keys()[0].key_id[:6], by="soc@corp", now=NOW + 1)
    signer = {"an unenrolled key": keys["stranger"], "another approver's key": keys["cfo"]}.get(attack, keys["risk"])
    assertion_of = {"a signature over a different action": _other_action(keys), "a forged signature": _forged(keys)}.get(
        attack, lambda c: sign_challenge(signer, c).to_doc())
    if attack == "no passkey at all":
        def answer(store, r):
            decide_request(store, r.id, approved=True, approver="risk@corp", now=r.requested_at + 1)
    else:
        answer = approve_with(assertion_of)
    gw = gateway(tmp_path, wal, answer, ring)
    with pytest.raises(GateBlocked) as info:
        await wire(wal, gw, saga_id="s-bad")
    assert "passkey refused" in info.value.reason and words in info.value.reason
    d = decided(wal, "s-bad")
    assert d["decision"] == "Denied" and d["passkey"]["refused"] == code
    (req,) = gw.store.list()
    assert req.consumed_at is None, "a refused passkey never consumes the approval"


async def test_a_request_made_without_a_challenge_is_refused_where_a_passkey_is_required(tmp_path, wal, keys):
    store = FileApprovalStore(tmp_path / "approvals")
    plain = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=0.05), poll=0.01)
    with pytest.raises(GateBlocked):
        await wire(wal, plain, saga_id="s-old")  # expires: the request exists, with no challenge
    gw = gateway(tmp_path, wal, lambda store, r: None, keys["ring"])
    with pytest.raises(GateBlocked) as info:
        await wire(wal, gw, saga_id="s-old")
    assert "without a passkey challenge" in info.value.reason


def _challenge(**kw) -> ActionChallenge:
    base = {"request_id": "a" * 32, "tool": "wire.send", "arguments_digest": "sha256:" + "1" * 64,
            "saga_id": "s-1", "step_id": "s-1/0", "expires_at": NOW + 900}
    return ActionChallenge.issue(**{**base, **kw})


def test_an_expired_or_replayed_challenge_is_refused(keys):
    verifier = PasskeyVerifier(keys["ring"])
    c = _challenge()
    a = sign_challenge(keys["risk"], c)
    with pytest.raises(PasskeyRefused) as expired:
        verifier.verify(a, c, approver="risk@corp", now=NOW + 900)
    assert expired.value.code == "expired" and "expired at" in expired.value.message
    proof = verifier.verify(a, c, approver="risk@corp", now=NOW + 1)
    assert proof["verified"] and proof["nonce"] == c.nonce
    with pytest.raises(PasskeyRefused) as replayed:
        verifier.verify(a.to_doc(), c, approver="risk@corp", now=NOW + 2)
    assert replayed.value.code == "replayed" and "already redeemed" in replayed.value.message
    fresh = _challenge()
    assert fresh.nonce != c.nonce and fresh.digest != c.digest, "every challenge is fresh"
    with pytest.raises(PasskeyRefused) as other:
        verifier.verify(a, fresh, approver="risk@corp", now=NOW + 3)
    assert other.value.code == "other-action"


def _webauthn(priv: Ed25519PrivateKey, c: ActionChallenge, *, rp: str = "approve.corp", flags: int = 0x05,
              challenge: bytes | None = None) -> dict:
    client = json.dumps({"type": "webauthn.get", "origin": f"https://{rp}",
                         "challenge": base64.urlsafe_b64encode(challenge or c.digest).rstrip(b"=").decode()}).encode()
    auth = hashlib.sha256(rp.encode()).digest() + bytes([flags]) + (7).to_bytes(4, "big")
    sig = priv.sign(auth + hashlib.sha256(client).digest())
    return PasskeyAssertion(sign_challenge(priv, c).key_id, c.digest.hex(), sig, "webauthn", auth, client).to_doc()


def test_a_webauthn_assertion_from_an_ed25519_credential_verifies_and_a_bad_one_is_refused(keys):
    verifier = PasskeyVerifier(keys["ring"], rp_id="approve.corp")
    c = _challenge()
    proof = verifier.verify(_webauthn(keys["risk"], c), c, approver="risk@corp", now=NOW)
    assert proof["format"] == "webauthn" and proof["userVerified"] is True
    for bad, code, words in (
        (_webauthn(keys["risk"], c, rp="evil.example"), "forged", "another relying party"),
        (_webauthn(keys["risk"], c, flags=0x00), "forged", "user present"),
        (_webauthn(keys["risk"], c, challenge=b"\x00" * 32), "other-action", "another challenge"),
    ):
        with pytest.raises(PasskeyRefused) as info:
            verifier.verify(bad, c, approver="risk@corp", now=NOW)
        assert info.value.code == code and words in info.value.message


def test_the_keyring_enrols_lists_and_revokes_and_refuses_what_it_cannot_do(tmp_path, keys):
    ring: ApproverKeyring = keys["ring"]
    risk_kid = sign_challenge(keys["risk"], _challenge()).key_id
    with pytest.raises(ConfigurationError, match="already enrolled for risk@corp"):
        ring.enrol(pem(keys["risk"]), approver="mallory@corp", by="soc@corp", now=NOW)
    raw = base64.b64encode(keys["stranger"].public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()
    entry = ring.enrol(raw, approver="ops@corp", by="soc@corp", now=NOW + 5, rp_id="approve.corp")
    assert [k.approver for k in ApproverKeyring(ring.path).keys()] == ["risk@corp", "cfo@corp", "ops@corp"]
    revoked = ring.revoke(risk_kid[:8], by="soc@corp", now=NOW + 10)
    assert revoked.revoked_by == "soc@corp" and ApproverKeyring(ring.path).get(risk_kid).revoked_at == NOW + 10
    with pytest.raises(ConfigurationError, match="already revoked"):
        ring.revoke(risk_kid, by="soc@corp", now=NOW + 11)
    with pytest.raises(ConfigurationError, match="cannot be enrolled again"):
        ring.enrol(pem(keys["risk"]), approver="risk@corp", by="soc@corp", now=NOW + 12)
    with pytest.raises(ConfigurationError, match="names 0 keys"):
        ring.revoke("ffff" if not entry.key_id.startswith("ffff") else "eeee", by="soc@corp", now=NOW)
    with pytest.raises(ConfigurationError, match="--approver"):
        ring.enrol(pem(Ed25519PrivateKey.generate()), approver=" ", by="soc@corp", now=NOW)
    with pytest.raises(ConfigurationError, match="32 raw bytes"):
        ring.enrol("not a key", approver="x@corp", by="soc@corp", now=NOW)
    text = Path(ring.path).read_text()
    assert "PRIVATE" not in text and json.loads(text)["kind"] == "ApproverKeyring"


@pytest.mark.parametrize("field", ["stepId", "expiresAt"])
async def test_a_challenge_altered_in_the_store_and_then_signed_is_refused(tmp_path, wal, keys, field):
    """Whoever can write the store could rewrite the challenge before the approver signs
    it (another step, a later expiry): the agent compares it with its own request."""
    from dataclasses import replace

    def tamper_then_sign(store, r):
        doc = dict(r.challenge)
        doc[field] = "s-other/9" if field == "stepId" else "2099-01-01T00:00:00.000000Z"
        store.update(r.id, lambda cur: replace(cur, challenge=doc))
        approve_with(lambda c: sign_challenge(keys["risk"], c).to_doc())(store, r)

    gw = gateway(tmp_path, wal, tamper_then_sign, keys["ring"])
    with pytest.raises(GateBlocked) as info:
        await wire(wal, gw, saga_id="s-tamper")
    assert "names another action" in info.value.reason
    assert decided(wal, "s-tamper")["passkey"]["refused"] == "other-action"
