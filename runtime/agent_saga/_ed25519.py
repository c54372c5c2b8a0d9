"""Ed25519 keys: load, make, serialize, sign and verify, in one place.

Signed checkpoints (``audit.checkpoints``) and signed approval decisions
(``controls.approvals``) share these helpers.

Invariants:
- ``cryptography`` is imported only inside these functions. A caller that needs it passes
  ``missing``: the ``ConfigurationError`` message naming why it is needed and the fix.
- A key's id is the first 16 hex of SHA-256 over its 32 raw public bytes.
- Key files are PEM: private keys PKCS8 without a password (mode 0600), public keys
  SubjectPublicKeyInfo. A bad key file raises ``ConfigurationError`` naming the file and
  how to make a good one.
- ``generate`` never overwrites a file.
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "ed25519",
    "generate",
    "key_id",
    "load_private_key",
    "load_public_key",
    "public_pem",
    "raw_public",
    "raw_key_id",
    "read_key_file",
    "sign_b64",
    "verifies",
]


def ed25519(missing: str) -> Any:
    """The ``cryptography`` Ed25519 module; ``ConfigurationError(missing)`` without it."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519 as module
    except ImportError as exc:
        raise ConfigurationError(missing) from exc
    return module


def raw_public(public_key: Any) -> bytes:
    """The 32 raw bytes of an Ed25519 public key."""
    from cryptography.hazmat.primitives import serialization

    raw: bytes = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


def raw_key_id(raw: bytes) -> str:
    """A key's id from its 32 raw public bytes: 16 hex of their SHA-256."""
    return hashlib.sha256(raw).hexdigest()[:16]


def key_id(public_key: Any) -> str:
    """The id of an Ed25519 public key (``raw_key_id`` of its raw bytes)."""
    return raw_key_id(raw_public(public_key))


def public_pem(public_key: Any) -> bytes:
    """A public key as PEM (SubjectPublicKeyInfo)."""
    from cryptography.hazmat.primitives import serialization

    pem: bytes = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem


def read_key_file(path: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of the key file ``path``; ``ConfigurationError`` naming ``what`` and the
    file when it is missing or cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigurationError(f"{what} file {os.fspath(path)!r} does not exist") from None
    except OSError as exc:
        raise ConfigurationError(f"{what} file {os.fspath(path)!r} cannot be read ({exc})") from None


def generate(path: str | os.PathLike[str], missing: str) -> tuple[str, str]:
    """Write a new private key (PEM, mode 0600) to ``path`` and its public key to
    ``path + ".pub"``; return both paths. Refuses to overwrite an existing file."""
    module = ed25519(missing)
    from cryptography.hazmat.primitives import serialization

    p = os.fspath(path)
    key = module.Ed25519PrivateKey.generate()
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    for target, data, mode in ((p, priv, 0o600), (p + ".pub", public_pem(key.public_key()), 0o644)):
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        except FileExistsError:
            raise ConfigurationError(f"{target!r} exists; refusing to overwrite a key") from None
        with open(fd, "wb") as f:
            f.write(data)
    return p, p + ".pub"


def load_private_key(path: str | os.PathLike[str], *, what: str, make: str, missing: str, option: str = "") -> Any:
    """The Ed25519 private key in the PEM file ``path``.

    ``what`` names the file in errors (``"private key"``), ``make`` is the command that
    makes one, ``option`` the command-line option that gave the path, if any. Raises
    ``ConfigurationError`` for a missing or unreadable file, a file that is not a PEM
    private key, or a key of another kind.
    """
    module = ed25519(missing)
    from cryptography.hazmat.primitives import serialization

    data = read_key_file(path, what)
    name = f"{option} {os.fspath(path)!r}" if option else repr(os.fspath(path))
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{name} is not a PEM private key (make one with `{make}`)") from exc
    if not isinstance(key, module.Ed25519PrivateKey):
        raise ConfigurationError(f"{name} is not an Ed25519 private key")
    return key


def load_public_key(data: bytes, *, where: str, missing: str) -> Any:
    """The Ed25519 public key in the PEM ``data`` (read from ``where``).

    Raises ``ConfigurationError`` naming ``where`` for data that is not a PEM public key,
    or a key of another kind.
    """
    module = ed25519(missing)
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise ConfigurationError(f"{where} holds a public key that cannot be read ({exc})") from exc
    if not isinstance(key, module.Ed25519PublicKey):
        raise ConfigurationError(f"{where} is not an Ed25519 public key")
    return key


def sign_b64(private_key: Any, message: bytes) -> str:
    """The Ed25519 signature of ``message``, base64."""
    return base64.b64encode(private_key.sign(message)).decode()


def verifies(public_key: Any, signature: bytes, message: bytes) -> bool:
    """True if ``signature`` is ``public_key``'s over ``message``."""
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(signature, message)
    except InvalidSignature:
        return False
    return True
