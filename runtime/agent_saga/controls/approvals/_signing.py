"""Signed decisions: who approved is proven by an Ed25519 signature the agent checks.

A decision document in the store says ``"decision": "approved"``; anyone who can write
that key could say it. So the decider (the operator, for a decision made on an
``Approval``; ``agent-saga approvals approve --signing-key``) signs it, and the agent
accepts ``approved`` only with a valid signature from a key it trusts::

    {"v": 1, "kind": "ApprovalDecision", "requestId": "af83...", "decision": "approved", ...,
     "expiresAt": "<the request's deadline>",
     "signature": {"alg": "Ed25519", "keyId": "3f2a9c...", "sig": "<base64>"}}

The signed bytes are ``"agent-saga.approval-decision/v2\\n"`` followed by the canonical
JSON of ``{requestId, argumentsDigest, tool, actionDigest, decision, approver,
authenticatedUser, decidedAt, expiresAt, breakGlass}`` exactly as the document carries
them (an absent field is ``null``), so any Ed25519 implementation can sign or check one.
``authenticatedUser`` is the user the Kubernetes API server authenticated for a decision
made on an ``Approval``; ``actionDigest`` is the digest of the complete rendering of the
action the decider showed (``_render.ActionView.digest``), which the agent recomputes
from its own call. The signature block names its format (``"format"``); a signature
without one is the v1 format, which covered neither the tool nor the action shown, and
is refused with a message saying to approve again.

Invariants:
- A signature binds the request id, the arguments digest, the tool, the rendered action,
  the decision, the approver and the request's deadline: a signed decision copied onto another request (or onto a new
  request with the same id) does not verify for it.
- A key's id is the first 16 hex of SHA-256 over its 32 raw public bytes (the same
  fingerprint as signed checkpoints).
- ``cryptography`` is imported only when keys are loaded or a signature is made or
  checked; trusting keys without it is a ``ConfigurationError`` naming the fix.
- Denials and expiries need no signature: anyone may stop an action, nobody unproven
  may allow one.
- A trusted key is bound to the approver name(s) it may approve as: its PEM block is
  preceded by ``Approver: NAME`` lines (explanatory text before the block, which PEM
  readers skip; ``agent-saga keygen approver --approver NAME`` writes it, the operator
  publishes its keys with it). A signed decision verifies only when its ``approver`` is
  one of its key's names. ``Approver: *`` marks a decider that authenticates approvers
  itself (the operator's key: the API server names the approver). Every name passes the
  look-alike check of ``_names`` when the key is loaded, and the approver's name when a
  decision is checked.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ... import _ed25519
from ...clocks import format_instant, parse_instant
from ...errors import ConfigurationError
from ...records import canonical_json
from ._names import name_problem

__all__ = [
    "DECISION_FORMAT",
    "DecisionSigner",
    "SIGNED_FIELDS",
    "Seal",
    "TrustedKeys",
    "ANY_APPROVER",
    "approver_header",
    "decision_message",
    "key_id",
]

DECISION_FORMAT = "agent-saga.approval-decision/v2"
_DOMAIN = (DECISION_FORMAT + "\n").encode()
_SIGNED = ("requestId", "argumentsDigest", "tool", "actionDigest", "decision", "approver", "authenticatedUser",
           "decidedAt", "expiresAt", "breakGlass")
#: What a decision keeps of its document to check its signature later.
SIGNED_FIELDS = (*_SIGNED, "signature")

#: The environment variable naming the trusted approver keys (a PEM file or a directory of them).
ENV_TRUSTED_KEYS = "AGENT_SAGA_APPROVAL_KEYS"
#: The environment variable naming the private key a decider signs with (PEM).
ENV_SIGNING_KEY = "AGENT_SAGA_APPROVAL_SIGNING_KEY"

_FIX = "pip install 'agent-saga[signing]'"
#: The name a decider's key carries when it names approvers itself (the operator's key).
ANY_APPROVER = "*"
_HEADER = "Approver:"
_NAME_FIX = ("put one line 'Approver: NAME' per approver the key may approve as before its '-----BEGIN PUBLIC KEY-----' "
             "line (agent-saga keygen approver --approver NAME --out KEY.pem writes it)")


def approver_header(names: Iterable[str]) -> str:
    """The ``Approver: NAME`` lines that bind the PEM block after them to ``names``."""
    return "".join(f"{_HEADER} {n}\n" for n in names)


def check_names(names: Iterable[str], where: str) -> tuple[str, ...]:
    """``names`` as a key's approver names; ``ConfigurationError`` naming ``where`` for
    none, or for a look-alike name."""
    out = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not out:
        raise ConfigurationError(f"{where} is not bound to any approver name: {_NAME_FIX}")
    for n in out:
        why = None if n == ANY_APPROVER else name_problem(n)
        if why is not None:
            raise ConfigurationError(f"{where}: approver name {n!r} is refused: {why}")
    return out


_MISSING = (f"signed approvals need the 'cryptography' package ({_FIX}): trusted approver keys are configured, "
            f"and without it no approval could be verified, so every one would be refused")


def _crypto() -> Any:
    return _ed25519.ed25519(_MISSING)


def decision_message(doc: Mapping[str, Any]) -> bytes:
    """The exact bytes signed for the decision document ``doc`` (see the module doc)."""
    body = {k: doc.get(k) for k in _SIGNED}
    body["breakGlass"] = bool(body["breakGlass"])
    return _DOMAIN + canonical_json(body).encode("utf-8")


key_id = _ed25519.key_id


@dataclass(frozen=True, slots=True)
class Seal:
    """A decision's signature as read from its document: the key id, the signature, the
    bytes it covers, and what it binds (request id, digest, the request's deadline)."""

    key_id: str
    signature: bytes
    message: bytes
    request_id: str
    arguments_digest: str
    expires_at: float | None
    #: The signed format (``DECISION_FORMAT``; an older one is refused), the tool and
    #: the digest of the rendered action it covers.
    format: str = DECISION_FORMAT
    tool: str = ""
    action_digest: str = ""

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Seal | None:
        """The seal of a decision document; ``None`` if it carries no signature (a
        malformed one is a seal that cannot verify, never an error: the reader decides)."""
        sig = doc.get("signature")
        if not isinstance(sig, Mapping):
            return None
        try:
            raw = base64.b64decode(str(sig.get("sig") or ""), validate=True)
        except ValueError:
            raw = b""
        try:
            expires = parse_instant(doc.get("expiresAt"))
        except ValueError:
            expires = None
        alg_ok = sig.get("alg") == "Ed25519"
        return cls(str(sig.get("keyId") or "") if alg_ok else "", raw, decision_message(doc),
                   str(doc.get("requestId") or ""), str(doc.get("argumentsDigest") or ""), expires,
                   str(sig.get("format") or _V1), str(doc.get("tool") or ""), str(doc.get("actionDigest") or ""))


class DecisionSigner:
    """Signs decision documents with one Ed25519 private key (``from_file``: a PEM file,
    ``agent-saga keygen approver``)."""

    def __init__(self, private_key: Any) -> None:
        ed25519 = _crypto()
        if not isinstance(private_key, ed25519.Ed25519PrivateKey):
            raise ConfigurationError("DecisionSigner needs an Ed25519 private key")
        self._key = private_key
        self.key_id = key_id(private_key.public_key())

    def __repr__(self) -> str:
        return f"DecisionSigner(keyId={self.key_id})"

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> DecisionSigner:
        """The signer of the PEM private key at ``path``."""
        return cls(load_signing_key(path, "approval signing key"))

    def public_pem(self, approvers: Iterable[str] = ()) -> str:
        """This key's public half (PEM), to add to the agents' trusted keys, after the
        ``Approver:`` lines of ``approvers`` (the names it may approve as)."""
        return approver_header(approvers) + _ed25519.public_pem(self._key.public_key()).decode()

    def sign(self, doc: Mapping[str, Any], *, expires_at: float | str, tool: str, action_digest: str) -> dict[str, Any]:
        """``doc`` with ``expiresAt`` (the request's deadline), the ``tool`` and the
        ``actionDigest`` of the rendered action the decider showed (``_render``), and its
        ``signature``."""
        if not tool or not str(action_digest).startswith("sha256:"):
            raise ConfigurationError("a decision is signed over the tool and the rendered action's digest "
                                     "(ActionView.digest): give both")
        out = {k: v for k, v in doc.items() if k not in ("signature", "rev")}
        out["expiresAt"] = expires_at if isinstance(expires_at, str) else format_instant(expires_at)
        out["tool"], out["actionDigest"] = tool, action_digest
        out["signature"] = {"alg": "Ed25519", "keyId": self.key_id, "format": DECISION_FORMAT,
                            "sig": _ed25519.sign_b64(self._key, decision_message(out))}
        return out


class TrustedKeys:
    """The public keys whose signatures approve (``from_path``: a PEM file holding one or
    more keys, or a directory of ``*.pem`` / ``*.pub`` files). Empty: nothing is trusted."""

    def __init__(self, public_keys: Mapping[Any, Iterable[str]] | None = None, *, source: str = "") -> None:
        self._keys: dict[str, Any] = {}
        self._names: dict[str, tuple[str, ...]] = {}
        self.source = source or "given keys"
        #: The file or directory the keys were read from (``from_path``), to read again,
        #: and what it looked like then (``changed``).
        self.path: str | None = None
        self.stamp: object = None
        for k, names in (public_keys or {}).items():
            self.add(k, approvers=names)

    def __repr__(self) -> str:
        return f"TrustedKeys({self.source}: {', '.join(sorted(self._keys)) or 'none'})"

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of the trusted keys, sorted."""
        return tuple(sorted(self._keys))

    def update(self, other: TrustedKeys) -> None:
        """Trust every key ``other`` trusts, under its names there."""
        self._keys.update(other._keys)
        self._names.update(other._names)

    def approvers(self, kid: str) -> tuple[str, ...]:
        """The approver names key ``kid`` may approve as (``("*",)``: a decider that
        names approvers itself); empty for a key not trusted."""
        return self._names.get(kid, ())

    def owner(self, kid: str) -> str:
        """Who key ``kid`` belongs to, for a status line: its names, comma-separated."""
        names = self.approvers(kid)
        return "* (a decider's key: any approver it authenticated)" if names == (ANY_APPROVER,) else ", ".join(names)

    def pem(self, kid: str) -> str:
        """The public key ``kid`` as PEM, preceded by its ``Approver:`` lines (what the
        operator publishes, and what a key file holds)."""
        return approver_header(self._names[kid]) + _ed25519.public_pem(self._keys[kid]).decode()

    def add(self, public_key: Any, *, approvers: Iterable[str], where: str = "") -> str:
        """Trust ``public_key`` (an Ed25519 public key) for the approver names
        ``approvers`` (``("*",)``: a decider's key); return its id."""
        ed25519 = _crypto()
        if not isinstance(public_key, ed25519.Ed25519PublicKey):
            raise ConfigurationError(f"a trusted approver key must be an Ed25519 public key, got {public_key!r}")
        kid = key_id(public_key)
        names = check_names([approvers] if isinstance(approvers, str) else approvers,
                            where or f"trusted approver key {kid}")
        self._keys[kid] = public_key
        self._names[kid] = names
        return kid

    def add_pem(self, text: str | bytes, *, where: str = "PEM") -> list[str]:
        """Trust every public key in ``text`` (one or more PEM blocks); return their ids."""
        _crypto()
        blocks = pem_blocks(text)
        if not blocks:
            raise ConfigurationError(f"{where} holds no '-----BEGIN PUBLIC KEY-----' block (the .pub file of "
                                     f"`agent-saga keygen approver`)")
        ids = []
        for names, block in blocks:
            key = _ed25519.load_public_key(block, where=where, missing=_MISSING)
            ids.append(self.add(key, approvers=names, where=where))
        return ids

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> TrustedKeys:
        """The keys in a PEM file, or in every ``*.pem`` / ``*.pub`` file of a directory
        (a mounted Secret or ConfigMap: add a key to rotate, remove the old one later)."""
        p = os.fspath(path)
        keys = cls(source=p)
        keys.path, keys.stamp = p, path_stamp(p)
        if os.path.isdir(p):
            # An empty directory (a mounted ConfigMap the operator has not filled yet)
            # trusts nothing yet and still requires signatures: keys published in the
            # policy plane, or added here later, are what approves.
            names = sorted(n for n in os.listdir(p) if n.endswith((".pem", ".pub")) and not n.startswith("."))
            for n in names:
                keys.add_pem(_read(os.path.join(p, n), "trusted approver key"), where=os.path.join(p, n))
        else:
            keys.add_pem(_read(p, "trusted approver key"), where=p)
        return keys

    def changed(self) -> bool:
        """Has the file or directory these keys were read from changed since?"""
        return self.path is not None and path_stamp(self.path) != self.stamp

    @classmethod
    def from_env(cls) -> TrustedKeys | None:
        """The keys ``$AGENT_SAGA_APPROVAL_KEYS`` names, or ``None`` when it is unset."""
        path = os.environ.get(ENV_TRUSTED_KEYS, "").strip()
        return cls.from_path(path) if path else None

    def problem(self, seal: Seal | None, *, request_id: str, arguments_digest: str, deadline: float,
                tool: str, action_digest: str, approver: str | None = None) -> str | None:
        """Why ``seal`` does not prove a decision on this request (``tool`` called as
        rendered to ``action_digest``) by ``approver`` (the decision document's), or
        ``None`` if it does."""
        if seal is None:
            return "the decision is not signed"
        old = _format_problem(seal)
        if old is not None:
            return old
        key = self._keys.get(seal.key_id)
        if key is None:
            return f"the decision is signed by key {seal.key_id or '(none)'}, which is not trusted"
        if not _ed25519.verifies(key, seal.signature, seal.message):
            return f"the signature by key {seal.key_id} does not verify: the decision was forged or altered"
        if approver is not None:
            why = approver_problem(approver, self.approvers(seal.key_id), seal.key_id)
            if why is not None:
                return why
        if seal.request_id != request_id or seal.arguments_digest != arguments_digest:
            return (f"the signature by key {seal.key_id} is for request {seal.request_id[:12]} "
                    f"({seal.arguments_digest[:19]}), not this one: a replayed decision")
        if seal.expires_at is None or abs(seal.expires_at - deadline) >= 1.0:
            return (f"the signature by key {seal.key_id} is for a request with another deadline: a replayed "
                    f"decision of an earlier request")
        return _action_problem(seal, tool, action_digest)


_V1 = "agent-saga.approval-decision/v1"


def _format_problem(seal: Seal) -> str | None:
    """A seal in a format this version does not accept (v1 did not cover the action shown)."""
    if seal.format == DECISION_FORMAT:
        return None
    if seal.format == _V1:
        return (f"the decision by key {seal.key_id or '(none)'} is signed in the format {_V1}, which covers "
                f"neither the tool nor the action the approver was shown; approve it again with a current "
                f"agent-saga (CLI or operator), which signs {DECISION_FORMAT}")
    return f"the decision is signed in an unknown format {seal.format[:64]!r} (this agent checks {DECISION_FORMAT})"


def _action_problem(seal: Seal, tool: str, action_digest: str) -> str | None:
    """Does the (verified) seal cover this tool and this rendered action?"""
    if seal.tool != tool or seal.action_digest != action_digest:
        return (f"the signature by key {seal.key_id} covers {seal.tool[:64]!r} rendered as "
                f"{seal.action_digest[:19]}, not this call ({tool[:64]!r}, {action_digest[:19]}): the approver was "
                f"shown another action")
    return None


def path_stamp(path: str) -> object:
    """What a key file or directory looks like now (names, sizes, modification times)."""
    try:
        if os.path.isdir(path):
            return tuple((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in sorted(
                os.scandir(path), key=lambda e: e.name))
        st = os.stat(path)
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return None


def approver_problem(approver: str, names: tuple[str, ...], kid: str) -> str | None:
    """Why key ``kid``, bound to ``names``, does not approve as ``approver``."""
    why = name_problem(approver)
    if why is not None:
        return f"the approver name {approver[:64]!r} is refused: {why}"
    if ANY_APPROVER not in names and approver not in names:
        return (f"key {kid} is bound to {', '.join(names) or 'no approver'}, not to {approver[:64]!r}: a key "
                f"approves only as the approver(s) it was issued to")
    return None


def pem_blocks(text: str | bytes) -> list[tuple[tuple[str, ...], bytes]]:
    """The public key blocks of PEM ``text``, each with the approver names of the
    ``Approver: NAME`` lines before it (after the previous block)."""
    data = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    out: list[tuple[tuple[str, ...], bytes]] = []
    names: list[str] = []
    block: list[str] | None = None
    for line in data.splitlines():
        stripped = line.strip()
        if block is not None:
            block.append(stripped)
            if stripped.startswith("-----END "):
                out.append((tuple(names), ("\n".join(block) + "\n").encode()))
                names, block = [], None
        elif stripped == "-----BEGIN PUBLIC KEY-----":
            block = [stripped]
        elif stripped[:len(_HEADER)].lower() == _HEADER.lower():
            names.append(stripped[len(_HEADER):].strip())
    if block is not None:
        out.append((tuple(names), ("\n".join(block) + "\n").encode()))
    return out


def load_signing_key(path: str | os.PathLike[str], what: str, option: str = "") -> Any:
    """The Ed25519 private key an approver or decider signs with (PEM at ``path``, named
    ``what`` in errors, given by the command-line ``option``); ``ConfigurationError``
    naming the file and how to make one."""
    return _ed25519.load_private_key(path, what=what, make="agent-saga keygen approver --out FILE", missing=_MISSING,
                                     option=option)


_read = _ed25519.read_key_file
