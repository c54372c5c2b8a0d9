"""The shared Ed25519 helper: key files made, read and refused with errors naming the file
and the fix; ids, signatures and verification as checkpoints and approvals rely on them."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

import pytest
from agent_saga import _ed25519
from agent_saga.errors import ConfigurationError
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

MISSING = "the test needs cryptography"
MAKE = "agent-saga keygen checkpoint --out FILE"


def _load(path: Path, **kw: str) -> object:
    return _ed25519.load_private_key(path, what="private key", make=MAKE, missing=MISSING, **kw)


def test_generate_writes_a_private_key_only_its_owner_reads_and_its_public_half(tmp_path: Path) -> None:
    priv, pub = _ed25519.generate(tmp_path / "k.pem", MISSING)
    assert (priv, pub) == (str(tmp_path / "k.pem"), str(tmp_path / "k.pem.pub"))
    assert stat.S_IMODE(os.stat(priv).st_mode) == 0o600
    key = _load(Path(priv))
    public = _ed25519.load_public_key(Path(pub).read_bytes(), where=pub, missing=MISSING)
    assert _ed25519.key_id(public) == _ed25519.key_id(key.public_key())  # type: ignore[attr-defined]


def test_generate_refuses_to_overwrite_a_key(tmp_path: Path) -> None:
    (tmp_path / "k.pem.pub").write_text("keep me")
    with pytest.raises(ConfigurationError, match=r"k\.pem\.pub' exists; refusing to overwrite a key"):
        _ed25519.generate(tmp_path / "k.pem", MISSING)
    assert (tmp_path / "k.pem.pub").read_text() == "keep me"


def test_a_key_id_is_16_hex_of_sha256_over_the_raw_public_bytes() -> None:
    public = ed25519.Ed25519PrivateKey.generate().public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert _ed25519.key_id(public) == _ed25519.raw_key_id(raw) == hashlib.sha256(raw).hexdigest()[:16]


def test_a_signature_verifies_only_over_its_message_and_under_its_key() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    sig = base64.b64decode(_ed25519.sign_b64(key, b"message"))
    assert _ed25519.verifies(key.public_key(), sig, b"message")
    assert not _ed25519.verifies(key.public_key(), sig, b"messagE")
    assert not _ed25519.verifies(ed25519.Ed25519PrivateKey.generate().public_key(), sig, b"message")
    assert not _ed25519.verifies(key.public_key(), b"", b"message")


def test_a_missing_key_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"private key file '.*nope\.pem' does not exist"):
        _load(tmp_path / "nope.pem")


def test_an_unreadable_key_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"private key file '.*' cannot be read"):
        _load(tmp_path)  # a directory


def test_a_key_file_that_is_not_pem_names_the_file_the_option_and_how_to_make_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key\n")
    with pytest.raises(ConfigurationError, match=r"^--key '.*bad\.pem' is not a PEM private key \(make one with "
                                                 r"`agent-saga keygen checkpoint --out FILE`\)"):
        _load(bad, option="--key")


def test_a_private_key_of_another_kind_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "rsa.pem"
    other.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(ConfigurationError, match=r"'.*rsa\.pem' is not an Ed25519 private key"):
        _load(other)


def test_a_public_key_that_cannot_be_read_or_is_of_another_kind_is_refused_naming_where() -> None:
    with pytest.raises(ConfigurationError, match=r"^keys\.pem holds a public key that cannot be read"):
        _ed25519.load_public_key(b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
                                 where="keys.pem", missing=MISSING)
    pem = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(ConfigurationError, match=r"^keys\.pem is not an Ed25519 public key"):
        _ed25519.load_public_key(pem, where="keys.pem", missing=MISSING)
