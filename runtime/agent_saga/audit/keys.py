"""Where a reader of an encrypted log gets its key: one rule for every command and process.

    reader_encryptor(key_file)        the first of these that is given:
        1. ``key_file``                  a file (``--wal-key-file``) holding the key text
        2. ``AGENT_SAGA_WAL_KEY_FILE``   the same, by environment (a mounted secret)
        3. ``AGENT_SAGA_WAL_KEY``        the key text itself
    -> an ``AESGCMEncryptor`` that names its source in every message, or None (no key)

The key text is the ``AGENT_SAGA_WAL_KEY`` form either way: one or more comma-separated
``[kid:]base64(32 bytes)`` entries, the first the primary (``agent-saga keygen wal``).

Invariants:
- No key is not an error here: a plaintext log reads without one, and the first encrypted
  record then raises ``WALKeyMissing`` naming the variable and the option to set.
- A key file that is named but cannot be read, is empty or malformed raises
  ``ConfigurationError`` naming the file (never echoing key material).
- Decryption errors name where the keys came from, so "wrong key" and "no key" read
  differently from "the key was never read".
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import ConfigurationError
from .encryption import ENV_VAR, KEY_FILE_ENV_VAR, AESGCMEncryptor, Keyring

__all__ = ["KEY_FILE_ENV_VAR", "reader_encryptor", "reader_keyring"]


def reader_keyring(
    key_file: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Keyring, str] | None:
    """The keyring a reader uses and a description of where it came from, or None (see
    the module doc for the order). Raises ``ConfigurationError`` for a bad key file or key."""
    env = os.environ if environ is None else environ
    path = key_file or env.get(KEY_FILE_ENV_VAR, "").strip() or None
    if path is not None:
        source = f"key file {path!r}" + ("" if key_file else f" (from {KEY_FILE_ENV_VAR})")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the WAL {source}: {exc.strerror or exc}; name a readable file "
                f"holding the key (`agent-saga keygen wal` makes one)"
            ) from None
        except UnicodeDecodeError:
            raise ConfigurationError(
                f"the WAL {source} is not text: it must hold [kid:]base64key entries"
            ) from None
        if not text:
            raise ConfigurationError(f"the WAL {source} is empty: it must hold [kid:]base64key entries")
        return Keyring.parse(text, source=source), source
    text = env.get(ENV_VAR, "").strip()
    if not text:
        return None
    return Keyring.parse(text, source=ENV_VAR), ENV_VAR


def reader_encryptor(
    key_file: str | None = None, environ: Mapping[str, str] | None = None
) -> AESGCMEncryptor | None:
    """An ``AESGCMEncryptor`` over the reader's key (see the module doc), or None if no key
    was given. Raises ``ConfigurationError`` for a bad key file or key, or a missing
    ``cryptography`` package."""
    found = reader_keyring(key_file, environ)
    if found is None:
        return None
    ring, source = found
    return AESGCMEncryptor(ring, source=source)
