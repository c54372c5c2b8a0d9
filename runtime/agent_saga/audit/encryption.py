"""Encryption at rest (BYOK): payloads become AES-256-GCM envelopes before they reach the log.

    payload on disk = {"enc": "A256GCM", "kid": "<key id>", "nonce": b64(12 bytes),
                       "ct": b64(ciphertext || 16-byte tag)}
    plaintext       = canonical_json(payload) as UTF-8
    AAD             = "agent-saga.wal-enc/v1\\n" + type + "\\n" + saga + "\\n" + (step or "")

Invariants:
- The chain seals the envelope exactly like any payload, so ``verify``, ``export``,
  ``audit-root`` and compaction need no key, and a redaction destroys the ciphertext.
- The AAD binds a ciphertext to its record's type, saga and step: moved to another record
  it fails authentication. (Not to ``seq``: the writer assigns it after ``append``
  returns; the chain already pins every envelope to its position.)
- A reader that needs plaintext and lacks the key raises ``WALKeyMissing`` naming the
  record and the key id; a wrong key or an altered envelope raises ``WALDecryptFailed``.
  Never a silent fallback to treating an envelope as an ordinary payload.
- Records the writer itself writes (compaction attestations, torn-tail notes) stay
  plaintext: verification must read them without a key.
- ``cryptography`` (the ``encryption`` extra) is imported only when a key is used.

Keys come from ``AGENT_SAGA_WAL_KEY`` (``encryptor_from_env``) or an injected
``PayloadEncryptor`` (a KMS, an HSM). The variable holds one or more comma-separated
``[kid:]base64(32 bytes)`` entries; the first is the primary (new writes), the others
decrypt older records (rotation; see docs/audit.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import AsyncIterator, Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigurationError, NotSerializable, WALDecryptFailed, WALKeyMissing
from ..records import Record, canonical_json
from ..scrubber import scrub_id, scrub_payload
from ..wal.base import BaseWAL, WrappedWAL

if TYPE_CHECKING:
    from ..wal.compaction import CompactionReport

ENV_VAR = "AGENT_SAGA_WAL_KEY"
KEY_FILE_ENV_VAR = "AGENT_SAGA_WAL_KEY_FILE"  # a file holding the same text (see ``keys``)
ALG = "A256GCM"
KEY_BYTES = 32
NONCE_BYTES = 12
_ENVELOPE_KEYS = frozenset({"enc", "kid", "nonce", "ct"})
_KID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_AAD_PREFIX = b"agent-saga.wal-enc/v1\n"


class PayloadEncryptor(Protocol):
    """Turns a payload into an envelope and back. Inject one to bring your own key store."""

    def encrypt(self, payload: dict[str, Any], aad: bytes) -> dict[str, Any]:
        """Return the envelope (a JSON object with ``enc``, ``kid``, ``nonce``, ``ct``)."""
        ...

    def decrypt(self, envelope: dict[str, Any], aad: bytes) -> dict[str, Any]:
        """Return the payload; raise ``WALKeyMissing`` / ``WALDecryptFailed``."""
        ...


def associated_data(type: str, saga: str, step: str | None) -> bytes:
    """The AAD that binds an envelope to its record (see the module doc)."""
    return _AAD_PREFIX + "\n".join((type, saga, step or "")).encode("utf-8")


def is_envelope(payload: Any) -> bool:
    """True if ``payload`` is an encryption envelope rather than a plaintext payload."""
    return (
        isinstance(payload, dict)
        and payload.keys() == _ENVELOPE_KEYS
        and all(isinstance(v, str) for v in payload.values())
    )


def key_id(key: bytes) -> str:
    """The default id of a key: a short one-way fingerprint (never the key)."""
    return "k-" + hashlib.sha256(b"agent-saga wal key id\n" + key).hexdigest()[:12]


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Keyring:
    """Keys by id; the first is the primary, used for every new write.

    Raises ``ConfigurationError`` for a malformed entry (never echoing key material).
    """

    __slots__ = ("_keys", "primary")

    def __init__(self, keys: Iterable[tuple[str, bytes]]) -> None:
        self._keys: dict[str, bytes] = {}
        for kid, key in keys:
            if not _KID.match(kid):
                raise ConfigurationError(f"key id {kid!r} is not valid: use 1-64 of [A-Za-z0-9._-]")
            if len(key) != KEY_BYTES:
                raise ConfigurationError(
                    f"key {kid!r} is {len(key)} bytes; AES-256-GCM needs {KEY_BYTES} "
                    f"(generate one with `agent-saga keygen wal`)"
                )
            if kid in self._keys:
                raise ConfigurationError(f"key id {kid!r} appears twice in the keyring")
            self._keys[kid] = key
        if not self._keys:
            raise ConfigurationError("a keyring needs at least one key")
        self.primary = next(iter(self._keys))

    @classmethod
    def parse(cls, text: str, *, source: str = ENV_VAR) -> Keyring:
        """Read ``[kid:]base64key[,[kid:]base64key...]`` (the ``AGENT_SAGA_WAL_KEY`` form);
        ``source`` names where the text came from in error messages."""
        entries: list[tuple[str, bytes]] = []
        for n, raw in enumerate(text.split(","), 1):
            item = raw.strip()
            if not item:
                continue
            kid, sep, material = item.rpartition(":")
            try:
                key = _b64(material)
            except (binascii.Error, ValueError):
                raise ConfigurationError(
                    f"{source} entry {n} is not base64: expected [kid:]base64(32 bytes)"
                ) from None
            entries.append((kid if sep else key_id(key), key))
        try:
            return cls(entries)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{source}: {exc.message}") from None

    def ids(self) -> list[str]:
        """The key ids held, in order of preference (the first encrypts)."""
        return list(self._keys)

    def get(self, kid: str) -> bytes | None:
        """The key of ``kid``, or ``None``."""
        return self._keys.get(kid)

    def __repr__(self) -> str:  # never the key material
        return f"Keyring(primary={self.primary!r}, ids={self.ids()!r})"


class AESGCMEncryptor:
    """The built-in ``PayloadEncryptor``: AES-256-GCM under a ``Keyring``, random 96-bit nonces.

    Random nonces are safe for about 2**32 records per key: rotate well before that.
    """

    def __init__(self, keyring: Keyring, *, source: str = ENV_VAR) -> None:
        self.source = source  # where the keys came from, for messages that name the fix
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:
            raise ConfigurationError(
                "WAL encryption needs the 'cryptography' package: pip install 'agent-saga[encryption]'"
            ) from exc
        self._aesgcm = AESGCM
        self._ciphers: dict[str, Any] = {}  # AESGCM objects are stateless per call: reuse them
        self.keyring = keyring

    def _cipher(self, kid: str) -> Any:
        c = self._ciphers.get(kid)
        if c is None:
            key = self.keyring.get(kid)
            if key is None:
                return None
            c = self._ciphers[kid] = self._aesgcm(key)
        return c

    def encrypt(self, payload: dict[str, Any], aad: bytes) -> dict[str, Any]:
        """The envelope of ``payload``, authenticated with ``aad``."""
        kid = self.keyring.primary
        try:
            plain = canonical_json(payload).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise NotSerializable(
                f"the payload cannot be encrypted because it is not JSON: {exc}", key="payload"
            ) from exc
        nonce = os.urandom(NONCE_BYTES)
        ct = self._cipher(kid).encrypt(nonce, plain, aad)
        return {"enc": ALG, "kid": kid, "nonce": base64.b64encode(nonce).decode(),
                "ct": base64.b64encode(ct).decode()}

    def decrypt(self, envelope: dict[str, Any], aad: bytes) -> dict[str, Any]:
        """The payload of ``envelope``; raises ``WALKeyMissing`` / ``WALDecryptFailed``."""
        from cryptography.exceptions import InvalidTag

        kid = envelope.get("kid")
        if envelope.get("enc") != ALG:
            raise WALDecryptFailed(f"envelope algorithm {envelope.get('enc')!r} is not {ALG}", kid=kid)
        cipher = self._cipher(str(kid))
        if cipher is None:
            raise WALKeyMissing(
                f"no key with id {kid!r}: the keys read from {self.source} are "
                f"{self.keyring.ids()}; add the key {kid!r} there to read records written under it",
                kid=kid,
            )
        try:
            plain = cipher.decrypt(_b64(envelope["nonce"]), _b64(envelope["ct"]), aad)
            payload = _loads(plain)
        except (InvalidTag, binascii.Error, ValueError, KeyError) as exc:
            raise WALDecryptFailed(
                f"envelope under key {kid!r} does not authenticate: the key {kid!r} read from "
                f"{self.source} is not the one it was written with, or the envelope was altered "
                f"or moved to another record",
                kid=kid,
            ) from exc
        return payload


def _loads(plain: bytes) -> dict[str, Any]:
    out = json.loads(plain)
    if not isinstance(out, dict):
        raise ValueError("decrypted payload is not an object")
    return out


def keyring_from_env(environ: Mapping[str, str] | None = None) -> Keyring | None:
    """The keyring in ``AGENT_SAGA_WAL_KEY``, or None if it is unset or empty."""
    text = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    return Keyring.parse(text) if text else None


def encryptor_from_env(environ: Mapping[str, str] | None = None) -> AESGCMEncryptor:
    """An ``AESGCMEncryptor`` over ``AGENT_SAGA_WAL_KEY``.

    Raises ``WALKeyMissing`` if the variable is unset (an encrypted WAL never falls back to
    plaintext), ``ConfigurationError`` if it is malformed or ``cryptography`` is missing.
    """
    ring = keyring_from_env(environ)
    if ring is None:
        raise WALKeyMissing(
            f"{ENV_VAR} is not set: an encrypted WAL needs a key (generate one with "
            f"`agent-saga keygen wal`), or pass an encryptor explicitly"
        )
    return AESGCMEncryptor(ring)


def new_wal_key(kid: str | None = None) -> str:
    """A fresh ``[kid:]base64`` entry for ``AGENT_SAGA_WAL_KEY`` (32 random bytes)."""
    key = os.urandom(KEY_BYTES)
    kid = kid or key_id(key)
    Keyring([(kid, key)])  # validate the id
    return f"{kid}:{base64.b64encode(key).decode()}"


def decrypt_record(rec: Record, encryptor: PayloadEncryptor | None) -> Record:
    """``rec`` with its payload decrypted (a copy), or ``rec`` itself if it is plaintext."""
    if not is_envelope(rec.payload):
        return rec
    assert rec.payload is not None
    kid = rec.payload.get("kid")
    if encryptor is None:
        raise WALKeyMissing(
            f"record seq {rec.seq} ({rec.type}, saga {rec.saga}) is encrypted under key "
            f"{kid!r} and no key was given: set {ENV_VAR}, or name a key file (--wal-key-file "
            f"or {KEY_FILE_ENV_VAR}), or pass an encryptor. Reading it as plaintext would "
            f"silently lose its contents, so nothing is read",
            kid=kid, seq=rec.seq, saga_id=rec.saga, step_id=rec.step,
        )
    try:
        plain = encryptor.decrypt(rec.payload, associated_data(rec.type, rec.saga, rec.step))
    except (WALKeyMissing, WALDecryptFailed) as exc:
        raise type(exc)(
            f"record seq {rec.seq} ({rec.type}, saga {rec.saga}): {exc.message}",
            kid=kid, seq=rec.seq, saga_id=rec.saga, step_id=rec.step,
        ) from exc
    return Record(rec.type, rec.saga, rec.step, plain, rec.seq, rec.ts, rec.salt, rec.digest,
                  rec.prev, rec.hash, rec.redacted, dict(rec.extra))


def decrypting(records: Iterable[Record], encryptor: PayloadEncryptor | None) -> Iterator[Record]:
    """Every record with its payload in plaintext; raises at the first one it cannot open.

    ``encryptor`` None means "no key": a plaintext log reads through unchanged, and the
    first encrypted record raises ``WALKeyMissing``. This is the reader recovery, certify
    and anything that acts on payloads must use.
    """
    for rec in records:
        yield decrypt_record(rec, encryptor)


def key_usage(records: Iterable[Record]) -> Counter[str]:
    """How many records each key id encrypts (a key may be retired when its count is 0)."""
    used: Counter[str] = Counter()
    for rec in records:
        if is_envelope(rec.payload):
            assert rec.payload is not None
            used[rec.payload["kid"]] += 1
    return used


class EncryptedWAL(WrappedWAL):
    """Wrap any ``BaseWAL`` so payloads are encrypted before they are queued.

    Encryption runs on the caller's thread inside ``append`` (microseconds for a record);
    sealing, durability and compaction are the inner WAL's, unchanged. Reads decrypt and
    raise ``WALKeyMissing`` / ``WALDecryptFailed`` rather than return an envelope.

    Args:
        inner: the WAL that stores the envelopes (FileWAL, RedisWAL, PostgresWAL).
        encryptor: default ``encryptor_from_env()`` (raises ``WALKeyMissing`` if unset).
    """

    def __init__(self, inner: BaseWAL, encryptor: PayloadEncryptor | None = None) -> None:
        super().__init__(inner)
        self.encryptor: PayloadEncryptor = encryptor if encryptor is not None else encryptor_from_env()

    def append(
        self,
        type: str,
        saga: str,
        step: str | None = None,
        payload: dict[str, Any] | None = None,
    ) -> int:
        """Scrub ``payload`` of secrets (the codec boundary's scrubber: the inner WAL only
        sees ciphertext), encrypt it (None stays None) and queue it on the inner WAL."""
        if payload is not None:
            saga, step = scrub_id(saga), None if step is None else scrub_id(step)
            payload = scrub_payload(payload, type, saga)
            assert payload is not None
            payload = self.encryptor.encrypt(payload, associated_data(type, saga, step))
        return self.inner.append(type, saga, step, payload)

    async def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every record, decrypted."""
        async for rec in self.inner.read_all(page_size=page_size):
            yield decrypt_record(rec, self.encryptor)

    async def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        """Every record after ``seq``, decrypted."""
        async for rec in self.inner.read_since(seq, page_size=page_size):
            yield decrypt_record(rec, self.encryptor)

    async def compact(
        self, keep_sagas: Collection[str] | None = None, *, timeout: float | None = None
    ) -> CompactionReport:
        """The inner WAL's compaction: it decides by type and saga, which stay plaintext."""
        return await self.inner.compact(keep_sagas, timeout=timeout)
