"""``ApproverKeyring``: the approver keys enrolled for passkey approvals (one JSON file).

    {"v": 1, "kind": "ApproverKeyring", "keys": [
      {"keyId": "3f2a9c...", "approver": "risk@corp", "label": "yubikey 5c", "rpId": "approve.corp",
       "publicKey": "-----BEGIN PUBLIC KEY-----...", "enrolledAt": "<RFC 3339>", "enrolledBy": "soc@corp",
       "revokedAt": null, "revokedBy": null}]}

``agent-saga approvals keys enrol | list | revoke`` edit it; agents read it (mount it
from a ConfigMap, or keep it on a shared volume) and re-read it when it changes, so a
revocation applies to the next approval checked.

Invariants:
- A key is enrolled for exactly one approver; it approves only under that name, which
  passes the look-alike check of ``_names`` (no mixed scripts, no Cyrillic or Greek
  letters that pass for Latin ones, NFKC).
- Revocation is final: a revoked key cannot be enrolled again (enrol a new key).
- Writes are atomic (a temporary file, then ``os.replace``) under an exclusive lock on
  ``<file>.lock``, so two CLI invocations cannot lose each other's change.
- Only public keys are stored.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from ... import _ed25519
from ...clocks import format_instant, parse_instant
from ...errors import ConfigurationError
from ._names import name_problem
from ._signing import _crypto, key_id

__all__ = ["ApproverKeyring", "EnrolledKey", "ENV_KEYRING", "load_public_key"]

#: The environment variable naming the approver keyring file.
ENV_KEYRING = "AGENT_SAGA_APPROVER_KEYRING"
DOC_VERSION = 1


def unb64(text: Any) -> bytes:
    """Bytes from base64 or base64url, padded or not (``b""`` if it is neither)."""
    s = str(text or "").strip()
    try:
        return base64.urlsafe_b64decode(s.replace("+", "-").replace("/", "_") + "=" * (-len(s) % 4))
    except ValueError:
        return b""


def load_public_key(text: str | bytes) -> Any:
    """An Ed25519 public key from PEM, or from its 32 raw bytes in base64 / base64url
    (the ``x`` of a WebAuthn credential's COSE key). Raises ``ConfigurationError``."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    data = text.encode() if isinstance(text, str) else text
    if b"-----BEGIN PUBLIC KEY-----" in data:
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as exc:
            raise ConfigurationError(f"the public key cannot be read ({exc})") from None
    else:
        raw = unb64(data.decode("ascii", "replace"))
        if len(raw) != 32:
            raise ConfigurationError("a public key must be PEM ('-----BEGIN PUBLIC KEY-----', the .pub file of "
                                     "`agent-saga keygen approver`) or the 32 raw bytes of an Ed25519 key in base64")
        key = ed25519.Ed25519PublicKey.from_public_bytes(raw)
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ConfigurationError("an approver key must be an Ed25519 public key")
    return key


@dataclass(frozen=True, slots=True)
class EnrolledKey:
    """One enrolled approver key (times are epoch seconds)."""

    key_id: str
    approver: str
    public_key: str
    enrolled_at: float
    enrolled_by: str = ""
    label: str = ""
    rp_id: str = ""
    revoked_at: float | None = None
    revoked_by: str | None = None

    def to_doc(self) -> dict[str, Any]:
        """The key as the keyring file holds it."""
        return {"keyId": self.key_id, "approver": self.approver, "label": self.label, "rpId": self.rp_id,
                "publicKey": self.public_key, "enrolledAt": format_instant(self.enrolled_at),
                "enrolledBy": self.enrolled_by,
                "revokedAt": None if self.revoked_at is None else format_instant(self.revoked_at),
                "revokedBy": self.revoked_by}

    @classmethod
    def from_doc(cls, doc: Any, where: str) -> EnrolledKey:
        """Read a key of the keyring file ``where``; raises ``ConfigurationError``."""
        if not isinstance(doc, dict):
            raise ConfigurationError(f"{where}: every key must be a JSON object")
        try:
            enrolled = parse_instant(doc.get("enrolledAt"))
            return cls(str(doc["keyId"]), str(doc["approver"]), str(doc["publicKey"]), enrolled or 0.0,
                       str(doc.get("enrolledBy") or ""), str(doc.get("label") or ""), str(doc.get("rpId") or ""),
                       parse_instant(doc.get("revokedAt")), doc.get("revokedBy"))
        except (KeyError, ValueError) as exc:
            raise ConfigurationError(f"{where}: a key is missing or has a malformed field ({exc})") from None


class ApproverKeyring:
    """The enrolled approver keys in the JSON file ``path`` (a missing file: no keys)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[str, EnrolledKey] = {}

    def __repr__(self) -> str:
        return f"ApproverKeyring({self.path})"

    @classmethod
    def from_env(cls) -> ApproverKeyring | None:
        """The keyring ``$AGENT_SAGA_APPROVER_KEYRING`` names, or ``None`` when unset."""
        path = os.environ.get(ENV_KEYRING, "").strip()
        return cls(path) if path else None

    # ------------------------------------------------------------------ reading
    def _read(self) -> dict[str, EnrolledKey]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._keys = None, {}
            return self._keys
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return self._keys
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"approver keyring {self.path} cannot be read ({exc})") from None
        if not isinstance(doc, dict) or doc.get("kind") != "ApproverKeyring" or doc.get("v") != DOC_VERSION:
            raise ConfigurationError(f"approver keyring {self.path} is not an ApproverKeyring v{DOC_VERSION} document")
        keys = [EnrolledKey.from_doc(k, self.path) for k in doc.get("keys") or ()]
        self._keys, self._stamp = {k.key_id: k for k in keys}, stamp
        return self._keys

    def keys(self) -> list[EnrolledKey]:
        """Every key, enrolled or revoked, in enrolment order."""
        return sorted(self._read().values(), key=lambda k: k.enrolled_at)

    def get(self, kid: str) -> EnrolledKey | None:
        """The key ``kid`` (revoked or not), or ``None`` if it was never enrolled."""
        return self._read().get(kid)

    def resolve(self, prefix: str) -> EnrolledKey:
        """The key a unique id prefix names; raises ``ConfigurationError``."""
        found = [k for k in self.keys() if k.key_id.startswith(prefix.strip())] if prefix.strip() else []
        if len(found) != 1:
            raise ConfigurationError(f"{prefix!r} names {len(found)} keys in {self.path} (agent-saga approvals keys "
                                     f"list shows the ids)")
        return found[0]

    # ------------------------------------------------------------------ writing
    @contextlib.contextmanager
    def _editing(self) -> Iterator[dict[str, EnrolledKey]]:
        import fcntl

        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._stamp = None
            keys = dict(self._read())
            yield keys
            doc = {"v": DOC_VERSION, "kind": "ApproverKeyring",
                   "keys": [k.to_doc() for k in sorted(keys.values(), key=lambda k: k.enrolled_at)]}
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(self.path)), prefix=".keyring.")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(doc, f, indent=2)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._stamp = None

    def enrol(self, public_key: str | bytes, *, approver: str, by: str, now: float, label: str = "",
              rp_id: str = "") -> EnrolledKey:
        """Enrol ``public_key`` (PEM or raw base64) for ``approver``; raises
        ``ConfigurationError`` for no approver, a key already enrolled, a revoked key."""
        if not approver.strip():
            raise ConfigurationError("enrolling a key needs --approver NAME: the key approves only as that name")
        if not by.strip():
            raise ConfigurationError("enrolling a key needs --by NAME: who enrolled it is part of the audit trail")
        named = name_problem(approver.strip())
        if named is not None:
            raise ConfigurationError(f"--approver {approver.strip()!r} is refused: {named}")
        key = load_public_key(public_key)
        kid = key_id(key)
        pem = _ed25519.public_pem(key).decode()
        with self._editing() as keys:
            old = keys.get(kid)
            if old is not None and old.revoked_at is not None:
                raise ConfigurationError(f"key {kid} was revoked at {format_instant(old.revoked_at)}; a revoked key "
                                         f"cannot be enrolled again (enrol a new key)")
            if old is not None:
                raise ConfigurationError(f"key {kid} is already enrolled for {old.approver}")
            entry = EnrolledKey(kid, approver.strip(), pem, now, by.strip(), label.strip(), rp_id.strip())
            keys[kid] = entry
        return entry

    def revoke(self, prefix: str, *, by: str, now: float) -> EnrolledKey:
        """Revoke the key a unique id prefix names (final); returns it."""
        if not by.strip():
            raise ConfigurationError("revoking a key needs --by NAME: who revoked it is part of the audit trail")
        with self._editing() as keys:
            entry = self.resolve(prefix)
            if entry.revoked_at is not None:
                raise ConfigurationError(f"key {entry.key_id} was already revoked at "
                                         f"{format_instant(entry.revoked_at)}")
            keys[entry.key_id] = replace(entry, revoked_at=now, revoked_by=by.strip())
            return keys[entry.key_id]
