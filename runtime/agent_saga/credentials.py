"""Credentials: references in the log, secrets only at the moment of use.

Compensation kwargs are fsynced in plaintext and replayed by another process (the recovery
fleet), so a secret must never be one of them. Connectors pass a reference
(``credential_ref="stripe_prod"``) and the handler calls ``resolve_credential(ref)`` at
use time, through the resolver the process installed with ``set_credential_resolver``.

``assert_no_secrets`` is the authoring-time check the engine runs on every value bound for
the WAL (compensation kwargs, policy arguments): it raises ``SecretDetected`` for a
non-empty string under a key named like a credential (``password``, ``pwd``, ``pass``,
``secret``, ``token``, ``auth``, ``credentials``, ``pin``, ``cvv``, ``api_key`` ... in any
case or separator style, but not references such as ``credential_ref`` or ``*_name``), a
random-looking string under a key such as ``key`` or ``session``, and a string anywhere
that contains a well-known credential format (Stripe, AWS, GitHub, GitLab, Slack, Google,
OpenAI/Anthropic, npm, PyPI, SendGrid keys, PEM private keys, ``Bearer``/``Basic``
credentials, JWTs, passwords in URLs). The detector is ``agent_saga.scrubber``'s, the same
that redacts whatever reaches the record codec anyway.

``MountedCredentials`` is a resolver for processes that hold their own credentials (the
MCP proxy, the recovery daemon): a reference names a file of the directory
``$AGENT_SAGA_CREDENTIALS_DIR`` (a mounted Kubernetes Secret: one file per key), or
``env:NAME`` the process's environment variable ``NAME``.
``install_mounted_resolver`` installs it unless a resolver is installed already.

Invariants:
- The detector is precise rather than greedy: an idempotency key, a SHA-256 hex digest, a
  UUID or a charge id is never flagged.
- Error messages name the key path and the kind of secret, never the value.
- ``redact_secrets`` is applied to exception text before it is logged to the WAL.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigurationError, SecretDetected
from .scrubber import (
    key_is_reference,
    key_looks_sensitive,
    key_secret,
    redact_text,
    secret_kind,
    shown_key,
    why_secret,
)

__all__ = [
    "ENV_CREDENTIALS_DIR",
    "MountedCredentials",
    "assert_no_secrets",
    "install_mounted_resolver",
    "key_looks_sensitive",
    "redact_secrets",
    "resolve_credential",
    "secret_kind",
    "set_credential_resolver",
]

CredentialResolver = Callable[[str], Any]

_resolver_lock = threading.Lock()
_resolver: CredentialResolver | None = None

_REF_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,199}$")


def set_credential_resolver(fn: CredentialResolver | None) -> CredentialResolver | None:
    """Install the process-wide resolver ``ref -> secret``; return the previous one.

    ``None`` removes it. The resolver is called at use time, in the calling thread, each
    time a handler asks; cache inside it if your secret store is slow.
    Raises ``ConfigurationError`` if ``fn`` is neither callable nor ``None``.
    """
    global _resolver
    if fn is not None and not callable(fn):
        raise ConfigurationError(
            f"set_credential_resolver() needs a callable ref -> secret (or None), got {fn!r}"
        )
    with _resolver_lock:
        prev, _resolver = _resolver, fn
    return prev


def resolve_credential(ref: str) -> Any:
    """Return the secret that ``ref`` names, from the installed resolver.

    Guarantee: the secret is fetched now, in this process, and never written anywhere by
    agent-saga. Raises ``ConfigurationError`` if ``ref`` is not a valid reference, if no
    resolver is installed, or if the resolver returned ``None``; an exception raised by the
    resolver itself propagates unchanged.
    """
    if not isinstance(ref, str) or not _REF_PATTERN.match(ref):
        raise ConfigurationError(
            f"credential reference {ref!r} is not valid: use a name such as 'stripe_prod' "
            f"(1-200 characters from [A-Za-z0-9._:@/+=-]), never the secret itself"
        )
    resolver = _resolver
    if resolver is None:
        raise ConfigurationError(
            f"no credential resolver is installed, so credential_ref={ref!r} cannot be "
            f"resolved: call agent_saga.set_credential_resolver(lambda ref: ...) at startup "
            f"in every process that runs handlers (agents and the recovery daemon)"
        )
    secret = resolver(ref)
    if secret is None:
        raise ConfigurationError(
            f"the credential resolver returned nothing for credential_ref={ref!r}: check "
            f"that the secret store holds it and that this process may read it"
        )
    return secret


ENV_CREDENTIALS_DIR = "AGENT_SAGA_CREDENTIALS_DIR"
_FILE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class MountedCredentials:
    """A resolver: ``REF`` is the file ``REF`` of ``directory`` (its text, one trailing
    newline dropped), ``env:NAME`` the environment variable ``NAME``. A value is read
    again after ``ttl`` seconds (a rotated Secret is picked up). Raises
    ``ConfigurationError`` naming the reference (never a value) when it cannot be read."""

    def __init__(self, directory: str | None = None, *, ttl: float = 5.0) -> None:
        self.directory = directory
        self.ttl = ttl
        self._cache: dict[str, tuple[float, str]] = {}

    @classmethod
    def from_env(cls) -> MountedCredentials:
        """The directory ``$AGENT_SAGA_CREDENTIALS_DIR`` (unset: ``env:`` references only)."""
        return cls(os.environ.get(ENV_CREDENTIALS_DIR, "").strip() or None)

    def __call__(self, ref: str) -> str:
        """The secret ``ref`` names (cached ``ttl`` seconds)."""
        hit = self._cache.get(ref)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        value = self._read(ref)
        self._cache[ref] = (now, value)
        return value

    def _read(self, ref: str) -> str:
        if ref.startswith("env:"):
            value = os.environ.get(ref[4:])
            if not value:
                raise ConfigurationError(f"credential {ref!r}: the environment variable {ref[4:]} is not set (or "
                                         f"empty) in this process")
            return value
        if not _FILE_REF.match(ref) or ".." in ref:
            raise ConfigurationError(f"credential {ref!r}: a file reference is one file name ([A-Za-z0-9._-], no "
                                     f"'/' or '..'), or env:NAME for an environment variable")
        if self.directory is None:
            raise ConfigurationError(f"credential {ref!r}: set {ENV_CREDENTIALS_DIR} to the directory that holds it "
                                     f"(a mounted Secret), or use env:NAME")
        path = os.path.join(self.directory, ref)
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ConfigurationError(f"credential {ref!r}: {path} cannot be read ({why})") from None
        value = value[:-1] if value.endswith("\n") else value
        if not value:
            raise ConfigurationError(f"credential {ref!r}: {path} is empty")
        return value


def install_mounted_resolver() -> CredentialResolver:
    """Install ``MountedCredentials.from_env()`` unless a resolver is installed; the one in force."""
    global _resolver
    with _resolver_lock:
        if _resolver is None:
            _resolver = MountedCredentials.from_env()
        return _resolver


# ---------------------------------------------------------------------------- detection
# The detector itself is ``agent_saga.scrubber`` (shared with the codec-boundary redaction).


def check_value(key_path: str, key: object, value: object) -> None:
    """Raise ``SecretDetected`` if ``value`` under ``key`` looks like a secret."""
    if not isinstance(value, str) or not value:
        return
    why = why_secret(key, value)
    if why is not None:
        raise _detected(key_path, why)


def secret_under(key_path: str) -> SecretDetected:
    """The error for a string inside a value whose key names a credential."""
    return _detected(key_path, "it sits inside a value whose key names a credential: everything there is secret")


def key_detected(key_path: str, why: str) -> SecretDetected:
    """The error for a mapping key that is itself a secret (``key_path`` shows it redacted)."""
    return SecretDetected(
        f"{key_path} is a key that looks like a secret ({why}); keys bound for the WAL are "
        f"fsynced in plaintext like values. Use a plain name as the key and pass the secret "
        f"by reference (credential_ref='...', resolved inside the handler)",
        key=key_path,
    )


def _detected(key_path: str, why: str) -> SecretDetected:
    return SecretDetected(
        f"{key_path} looks like a secret ({why}); values bound for the WAL are fsynced in "
        f"plaintext and replayed by another process. Pass a reference instead, e.g. "
        f"credential_ref='stripe_prod', and call resolve_credential(credential_ref) inside "
        f"the handler",
        key=key_path,
    )


def assert_no_secrets(obj: Any, path: str = "kwargs") -> None:
    """Raise ``SecretDetected`` naming the key path if anything in ``obj`` looks like a secret.

    Walks mappings, lists and tuples. Guarantee: returns only if no string in ``obj`` sits
    under a credential-named key (at any depth: ``{"password": {"new": ...}}``, unless a
    nearer key names a reference such as ``credential_ref``) or matches a known credential
    format, and no mapping key is itself a secret. The error names the path (e.g.
    ``kwargs['auth']['token']``) and never the value; a secret key shows as ``[REDACTED]``.
    """
    _walk(obj, path, None, False)


def _walk(obj: Any, path: str, key: object, inside: bool) -> None:
    if isinstance(obj, str):
        if inside and obj:
            raise secret_under(path)
        check_value(path, key, obj)
    elif isinstance(obj, Mapping):
        secret = inside or (isinstance(key, str) and key_looks_sensitive(key))
        for k, v in obj.items():
            why = key_secret(k, key, secret)
            if why is not None:
                raise key_detected(f"{path}[{shown_key(k, key, secret)!r}]", why)
            _walk(v, f"{path}[{k!r}]", k, secret and not (isinstance(k, str) and key_is_reference(k)))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            # A list inherits its key: {"tokens": ["..."]} is still a list of tokens.
            _walk(v, f"{path}[{i}]", key, inside)


def redact_secrets(text: str) -> str:
    """Return ``text`` with every well-known credential format, ``password=...`` phrase
    value and URL password replaced by ``[REDACTED]``.

    Used on exception messages and other free text before they enter the WAL; it cannot
    know about secrets that have no recognisable form, so handlers must still not put
    secrets in errors.
    """
    return redact_text(text)
