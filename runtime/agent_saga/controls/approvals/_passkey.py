"""Passkey approvals: the approver's own enrolled key signs the exact action.

A signed decision (``_signing``) proves that a trusted decider wrote "approved". A
passkey approval proves more: that the human's own key (a FIDO2 authenticator, a
hardware token, or a software key in tests) signed a challenge naming the exact action
about to run. The agent issues the challenge with the request::

    {"format": "agent-saga.passkey-challenge/v1", "requestId": "af83...", "tool": "wire.send",
     "argumentsDigest": "sha256:<64 hex>", "sagaId": "saga-8f3c", "stepId": "saga-8f3c/3",
     "expiresAt": "<the request's deadline>", "nonce": "<32 random hex>"}

The bytes signed are the 32-byte SHA-256 of that document's canonical JSON (its
``digest``). The approver's assertion rides in the decision document's ``passkey`` field::

    {"format": "ed25519", "keyId": "3f2a9c...", "challenge": "<digest hex>", "sig": "<base64>"}
    {"format": "webauthn", "keyId": ..., "challenge": ..., "sig": ..., "authenticatorData": "<base64>",
     "clientDataJSON": "<base64>"}

``ed25519``: the signature is over the digest itself. ``webauthn``: a WebAuthn assertion
(``navigator.credentials.get`` with ``challenge`` = the digest) from an Ed25519 (COSE
alg -8) credential: the signature is over ``authenticatorData || SHA-256(clientDataJSON)``,
``clientDataJSON`` must say ``webauthn.get`` with the digest as its challenge, and the
authenticator must report the user present.

Invariants:
- Refusals name what failed: no assertion, a key not enrolled, a revoked key, an approver
  other than the key's owner, a signature over a different action, a forged signature,
  an expired challenge, a challenge already redeemed (``PasskeyRefused.code``).
- The key id is the first 16 hex of SHA-256 over the raw public key (as ``_signing``);
  a WAL record carries the key id and the challenge digest, never a private key.
- ``cryptography`` is imported only when a key is read or a signature made or checked.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ... import _ed25519
from ...clocks import format_instant, parse_instant
from ...errors import ConfigurationError, SagaRefused
from ...records import canonical_json
from ._keyring import ApproverKeyring, EnrolledKey, load_public_key, unb64
from ._signing import _crypto, key_id

__all__ = [
    "CHALLENGE_FORMAT",
    "ActionChallenge",
    "PasskeyAssertion",
    "PasskeyRefused",
    "PasskeyVerifier",
    "sign_challenge",
]

CHALLENGE_FORMAT = "agent-saga.passkey-challenge/v1"
_UP, _UV = 0x01, 0x04  # WebAuthn authenticator data flags: user present, user verified


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class PasskeyRefused(SagaRefused):
    """A passkey assertion that does not approve this action. ``code`` is one of
    ``missing``, ``unenrolled``, ``revoked``, ``approver``, ``other-action``, ``forged``,
    ``expired``, ``replayed``; the message says what failed and what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ActionChallenge:
    """What a passkey signs: the exact action and a fresh nonce (see the module doc)."""

    request_id: str
    tool: str
    arguments_digest: str
    saga_id: str
    step_id: str
    expires_at: float
    nonce: str

    @classmethod
    def issue(cls, *, request_id: str, tool: str, arguments_digest: str, saga_id: str, step_id: str,
              expires_at: float) -> ActionChallenge:
        """A challenge with a fresh 128-bit nonce."""
        return cls(request_id, tool, arguments_digest, saga_id, step_id, float(expires_at), secrets.token_hex(16))

    def to_doc(self) -> dict[str, Any]:
        """The challenge document (what the request carries as ``challenge``)."""
        return {"format": CHALLENGE_FORMAT, "requestId": self.request_id, "tool": self.tool,
                "argumentsDigest": self.arguments_digest, "sagaId": self.saga_id, "stepId": self.step_id,
                "expiresAt": format_instant(self.expires_at), "nonce": self.nonce}

    @classmethod
    def from_doc(cls, doc: Any) -> ActionChallenge:
        """Read a challenge document; raises ``ValueError`` naming what is wrong."""
        if not isinstance(doc, Mapping) or doc.get("format") != CHALLENGE_FORMAT:
            raise ValueError(f"a passkey challenge must be an object with format {CHALLENGE_FORMAT!r}")
        expires = parse_instant(doc.get("expiresAt"))
        if expires is None or not str(doc.get("nonce") or ""):
            raise ValueError("a passkey challenge needs expiresAt and nonce")
        return cls(str(doc.get("requestId") or ""), str(doc.get("tool") or ""),
                   str(doc.get("argumentsDigest") or ""), str(doc.get("sagaId") or ""),
                   str(doc.get("stepId") or ""), expires, str(doc["nonce"]))

    @property
    def digest(self) -> bytes:
        """The 32 bytes a passkey signs: SHA-256 of the canonical JSON of ``to_doc()``."""
        return hashlib.sha256(canonical_json(self.to_doc()).encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class PasskeyAssertion:
    """An approver's signature over a challenge digest (``format`` ``ed25519`` or
    ``webauthn``); ``challenge`` is the digest (hex) the approver says they signed."""

    key_id: str
    challenge: str
    signature: bytes
    format: str = "ed25519"
    authenticator_data: bytes = b""
    client_data_json: bytes = b""

    def to_doc(self) -> dict[str, Any]:
        """The decision document's ``passkey`` field."""
        doc: dict[str, Any] = {"format": self.format, "keyId": self.key_id, "challenge": self.challenge,
                               "sig": base64.b64encode(self.signature).decode()}
        if self.format == "webauthn":
            doc["authenticatorData"] = base64.b64encode(self.authenticator_data).decode()
            doc["clientDataJSON"] = base64.b64encode(self.client_data_json).decode()
        return doc

    @classmethod
    def from_doc(cls, doc: Any) -> PasskeyAssertion:
        """Read an assertion; raises ``ValueError`` naming what is wrong."""
        if not isinstance(doc, Mapping):
            raise ValueError("a passkey assertion must be a JSON object with format, keyId, challenge and sig")
        fmt = str(doc.get("format") or "ed25519")
        if fmt not in ("ed25519", "webauthn"):
            raise ValueError(f"passkey assertion format {fmt!r} is not ed25519 or webauthn")
        for name in ("keyId", "challenge", "sig"):
            if not str(doc.get(name) or ""):
                raise ValueError(f"a passkey assertion needs {name}")
        return cls(str(doc["keyId"]), str(doc["challenge"]), unb64(doc["sig"]), fmt,
                   unb64(doc.get("authenticatorData")), unb64(doc.get("clientDataJSON")))


def sign_challenge(private_key: Any, challenge: ActionChallenge) -> PasskeyAssertion:
    """Sign ``challenge`` with a software Ed25519 private key (``agent-saga approvals
    sign --key``; tests). A hardware key signs ``challenge.digest`` with its own tool."""
    ed25519 = _crypto()
    if not isinstance(private_key, ed25519.Ed25519PrivateKey):
        raise ConfigurationError("a passkey signature needs an Ed25519 private key")
    digest = challenge.digest
    return PasskeyAssertion(key_id(private_key.public_key()), digest.hex(), private_key.sign(digest))


class PasskeyVerifier:
    """Checks passkey assertions against an ``ApproverKeyring`` (re-read when the file
    changes, so a revocation applies to the next check) and remembers redeemed
    challenges: a challenge approves one call, once.

    ``rp_id``: the WebAuthn relying party id your approval page uses (``approve.corp``);
    a ``webauthn`` assertion from another site is refused. Default: a key's own ``rpId``
    from its enrolment, else the relying party is not checked."""

    def __init__(self, keyring: ApproverKeyring | str, *, rp_id: str | None = None) -> None:
        self.keyring = keyring if isinstance(keyring, ApproverKeyring) else ApproverKeyring(keyring)
        self.rp_id = rp_id
        self._redeemed: dict[str, tuple[float, float]] = {}  # nonce -> (redeemed at, challenge expiry)
        self._parsed: dict[str, Any] = {}  # PEM -> public key (parsing costs as much as a verify)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PasskeyVerifier({self.keyring.path})"

    def verify(self, assertion: PasskeyAssertion | Mapping[str, Any] | None, challenge: ActionChallenge, *,
               approver: str, now: float) -> dict[str, Any]:
        """The proof to record (key id, approver, challenge digest), or ``PasskeyRefused``."""
        if assertion is None:
            raise PasskeyRefused("missing", "the approval carries no passkey signature; this action needs one "
                                 "from an enrolled approver key (agent-saga approvals sign)")
        if not isinstance(assertion, PasskeyAssertion):
            try:
                assertion = PasskeyAssertion.from_doc(assertion)
            except ValueError as exc:
                raise PasskeyRefused("forged", f"the passkey assertion cannot be read ({exc})") from None
        kid = assertion.key_id
        entry = self.keyring.get(kid)
        if entry is None:
            raise PasskeyRefused("unenrolled", f"key {kid} is not enrolled in the approver keyring "
                                 f"{self.keyring.path} (agent-saga approvals keys enrol)")
        if entry.revoked_at is not None and now >= entry.revoked_at:
            raise PasskeyRefused("revoked", f"key {kid} of {entry.approver} was revoked at "
                                 f"{format_instant(entry.revoked_at)} by {entry.revoked_by or '?'}")
        if entry.approver != approver:
            raise PasskeyRefused("approver", f"key {kid} is enrolled for {entry.approver}, but the approval "
                                 f"names {approver}: a passkey approves only as its owner")
        digest = challenge.digest
        if assertion.challenge != digest.hex():
            raise PasskeyRefused("other-action", f"the signature by key {kid} is over challenge "
                                 f"{assertion.challenge[:16]}, not this action's {digest.hex()[:16]} (tool "
                                 f"{challenge.tool}, arguments {challenge.arguments_digest[:19]}, step "
                                 f"{challenge.step_id}, nonce {challenge.nonce[:8]}): it approves another action")
        proof = self._check_signature(entry, assertion, digest)
        if now >= challenge.expires_at:
            raise PasskeyRefused("expired", f"the challenge signed by key {kid} expired at "
                                 f"{format_instant(challenge.expires_at)}; expiry denies")
        with self._lock:
            used = self._redeemed.get(challenge.nonce)
            if used is not None:
                raise PasskeyRefused("replayed", f"challenge {challenge.nonce[:8]} signed by key {kid} was already "
                                     f"redeemed at {format_instant(used[0])}: a signature approves one call, once")
            if len(self._redeemed) >= 4096:  # amortised: a nonce past its challenge's expiry is refused as expired
                self._redeemed = {n: t for n, t in self._redeemed.items() if t[1] > now}
            self._redeemed[challenge.nonce] = (now, challenge.expires_at)
        return {"keyId": kid, "approver": entry.approver, "label": entry.label, "format": assertion.format,
                "challenge": digest.hex(), "nonce": challenge.nonce, "verified": True, **proof}

    def _check_signature(self, entry: EnrolledKey, a: PasskeyAssertion, digest: bytes) -> dict[str, Any]:
        public = self._parsed.get(entry.public_key)
        if public is None:
            public = self._parsed[entry.public_key] = load_public_key(entry.public_key)
        extra: dict[str, Any] = {}
        if a.format == "ed25519":
            message = digest
        else:
            message = self._webauthn_message(entry, a, digest)
            extra["userVerified"] = bool(a.authenticator_data[32] & _UV)
        if not _ed25519.verifies(public, a.signature, message):
            raise PasskeyRefused("forged", f"the signature by key {a.key_id} does not verify over this action: "
                                 f"it was forged or altered")
        return extra

    def _webauthn_message(self, entry: EnrolledKey, a: PasskeyAssertion, digest: bytes) -> bytes:
        import json

        try:
            client = json.loads(a.client_data_json)
        except ValueError:
            client = None
        if not isinstance(client, dict) or client.get("type") != "webauthn.get":
            raise PasskeyRefused("forged", f"the WebAuthn assertion by key {a.key_id} has no webauthn.get "
                                 f"clientDataJSON")
        if client.get("challenge") != _b64url(digest):
            raise PasskeyRefused("other-action", f"the WebAuthn assertion by key {a.key_id} answers another "
                                 f"challenge: it approves another action")
        data = a.authenticator_data
        if len(data) < 37 or not data[32] & _UP:
            raise PasskeyRefused("forged", f"the WebAuthn assertion by key {a.key_id} does not report the user "
                                 f"present (authenticatorData flags)")
        rp = self.rp_id or entry.rp_id
        if rp and data[:32] != hashlib.sha256(rp.encode()).digest():
            raise PasskeyRefused("forged", f"the WebAuthn assertion by key {a.key_id} was made for another "
                                 f"relying party than {rp}")
        return data + hashlib.sha256(a.client_data_json).digest()
