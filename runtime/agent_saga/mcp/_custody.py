"""Credential custody: the proxy holds an upstream's credentials; nothing else sees them.

A named upstream (``AGENT_SAGA_MCP_UPSTREAMS``) lists what it needs as references, never
values, so the proxy and the recovery daemon each resolve them from their own mount:

    {"payments": {"url": "http://payments-mcp:8000/mcp",
                  "credentials": [{"credentialRef": "payments-token"}]},
     "ledger":   {"command": ["ledger-mcp"],
                  "credentials": [{"credentialRef": "ledger-db-password", "env": "DB_PASSWORD"}]}}

Each entry is injected into every request to a Streamable HTTP upstream as a header
(``header``, default ``Authorization``; ``scheme``, default ``Bearer`` for
``Authorization``, none otherwise), or into the environment of a stdio upstream the
proxy starts (``env``). References resolve through ``resolve_credential`` (the
``MountedCredentials`` resolver unless the process installed its own).

Invariants:
- A reference that cannot be resolved raises ``CredentialUnavailable`` naming it (never a
  value): the call is refused (-32001), nothing is sent.
- Every resolved value is masked (``*`` for each byte: lengths, so ``Content-Length``,
  stay right) in all the upstream sends back — results, errors, headers, event streams,
  its stderr — before the proxy reads it, so it reaches neither the client, the WAL nor
  a log. Its JSON-escaped form is masked too. ``Redactor`` does it across chunk borders.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..credentials import resolve_credential
from ..errors import ConfigurationError

__all__ = ["CredentialUnavailable", "CredentialUse", "Custody", "Redactor", "masked", "parse_credentials"]

_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class CredentialUnavailable(ConfigurationError):
    """A credential the upstream needs could not be resolved: the call is refused."""


@dataclass(frozen=True, slots=True)
class CredentialUse:
    """One credential of an upstream: the reference and where it goes (a header or an
    environment variable)."""

    ref: str
    header: str | None = None
    scheme: str = ""
    env: str | None = None


def parse_credentials(value: Any, where: str, *, http: bool) -> tuple[CredentialUse, ...]:
    """The ``credentials`` list of an upstream entry; ``ConfigurationError`` naming the
    entry, the field and the fix."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigurationError(f"{where}: credentials must be a list of {{\"credentialRef\": NAME, ...}}")
    out = []
    for i, item in enumerate(value):
        at = f"{where}: credentials[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("credentialRef"), str) or set(item) - {
                "credentialRef", "header", "scheme", "env"}:
            raise ConfigurationError(f"{at} must be {{\"credentialRef\": NAME[, \"header\": H, \"scheme\": S]}} (an "
                                     f"HTTP upstream) or {{\"credentialRef\": NAME, \"env\": VAR}} (a stdio one); a "
                                     f"reference, never the secret itself")
        ref = item["credentialRef"]
        if "env" in item:
            if http or not isinstance(item["env"], str) or not _ENV.match(item["env"]):
                raise ConfigurationError(f"{at}: env names an environment variable of a stdio upstream the proxy "
                                         f"starts (DB_PASSWORD); an HTTP upstream gets a header instead")
            if "header" in item or "scheme" in item:
                raise ConfigurationError(f"{at}: give env, or header/scheme, not both")
            out.append(CredentialUse(ref, env=item["env"]))
            continue
        if not http:
            raise ConfigurationError(f"{at}: a stdio upstream gets its credential as an environment variable: add "
                                     f"\"env\": \"VAR\"")
        header = item.get("header", "Authorization")
        if not isinstance(header, str) or not _HEADER.match(header):
            raise ConfigurationError(f"{at}: header {header!r} is not a header name (Authorization, X-Api-Key)")
        scheme = item.get("scheme", "Bearer" if header.lower() == "authorization" else "")
        if not isinstance(scheme, str) or any(c in scheme for c in "\r\n"):
            raise ConfigurationError(f"{at}: scheme must be a word such as Bearer (or \"\" for the bare value)")
        out.append(CredentialUse(ref, header=header, scheme=scheme))
    return tuple(out)


def _forms(secret: str) -> set[bytes]:
    """The byte strings under which ``secret`` can appear in what an upstream sends."""
    forms = {secret.encode(), json.dumps(secret)[1:-1].encode(),
             json.dumps(secret, ensure_ascii=False)[1:-1].encode()}
    return {f for f in forms if f}


class Custody:
    """The credentials of one upstream: resolved at use, masked in everything it sends back."""

    def __init__(self, uses: Sequence[CredentialUse]) -> None:
        self.uses = tuple(uses)
        self._forms: frozenset[bytes] = frozenset()
        self._known: set[str] = set()
        self._names = frozenset(u.header.lower() for u in self.uses if u.header is not None)

    def __bool__(self) -> bool:
        return bool(self.uses)

    def _resolve(self, use: CredentialUse) -> str:
        try:
            value = resolve_credential(use.ref)
        except ConfigurationError as exc:
            raise CredentialUnavailable(f"the credential {use.ref!r} of the upstream could not be resolved: "
                                        f"{exc.message}") from None
        except Exception as exc:  # noqa: BLE001 - a resolver's own failure: named, never its text
            raise CredentialUnavailable(f"the credential {use.ref!r} of the upstream could not be resolved "
                                        f"({type(exc).__name__})") from None
        if not isinstance(value, str) or not value or any(c in value for c in "\r\n\x00"):
            raise CredentialUnavailable(f"the credential {use.ref!r} of the upstream is not a one-line string")
        self._learn(value)
        return value

    def _learn(self, value: str) -> None:
        if value in self._known:
            return
        self._known.add(value)
        self._forms = self._forms | _forms(value)

    def headers(self) -> list[tuple[str, str]]:
        """The headers to add to a request upstream (``CredentialUnavailable``)."""
        out = []
        for use in self.uses:
            if use.header is not None:
                value = self._resolve(use)
                out.append((use.header, f"{use.scheme} {value}" if use.scheme else value))
        return out

    def env(self) -> dict[str, str]:
        """The environment variables of a stdio upstream (``CredentialUnavailable``)."""
        return {use.env: self._resolve(use) for use in self.uses if use.env is not None}

    def names(self) -> frozenset[str]:
        """The header names the proxy sets (a client's own are dropped), lowercase."""
        return self._names

    def redact(self, data: bytes) -> bytes:
        """``data`` with every resolved value masked. Each form is found in the original
        bytes and the union is masked, so one secret inside or overlapping another cannot
        leave part of either unmasked (masking one by one would break the other's match)."""
        out: bytearray | None = None
        for form in self._forms:
            i = data.find(form)
            while i != -1:
                if out is None:
                    out = bytearray(data)
                out[i:i + len(form)] = b"*" * len(form)
                i = data.find(form, i + 1)
        return data if out is None else bytes(out)

    def redact_text(self, text: str) -> str:
        """``redact`` for text."""
        return self.redact(text.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass") \
            if self._forms else text

    def redact_headers(self, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Response headers with every resolved value masked."""
        return [(k, self.redact_text(v)) for k, v in headers]

    def forms(self) -> frozenset[bytes]:
        """Every byte string masked."""
        return self._forms

    def longest(self) -> int:
        """The length of the longest masked form (what a stream must hold back)."""
        return max((len(f) for f in self._forms), default=0)


class Redactor:
    """``Custody.redact`` over a stream: holds back the end of a chunk only while it could
    be the start of a value cut by the chunk border (an event ending in a newline is never
    held: no value holds one), and releases it with the next chunk (or ``flush``)."""

    def __init__(self, custody: Custody) -> None:
        self.custody = custody
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """What can be sent of ``chunk`` now, masked."""
        data = self.custody.redact(self._held + chunk)
        keep = self._partial(data)
        self._held = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep] if keep else data

    def _partial(self, data: bytes) -> int:
        """The length of the longest end of ``data`` that begins a value (0: none)."""
        forms = self.custody.forms()
        for k in range(min(len(data), self.custody.longest() - 1), 0, -1):
            tail = data[-k:]
            if any(f.startswith(tail) for f in forms):
                return k
        return 0

    def flush(self) -> bytes:
        """The rest."""
        data, self._held = self._held, b""
        return data


async def masked(chunks: AsyncIterator[bytes], custody: Custody | None) -> AsyncIterator[bytes]:
    """``chunks`` with the credentials in ``custody`` masked, across chunk borders."""
    if not custody:
        async for c in chunks:
            yield c
        return
    redactor = Redactor(custody)
    async for c in chunks:
        out = redactor.feed(c)
        if out:
            yield out
    rest = redactor.flush()
    if rest:
        yield rest


def env_with(base: Mapping[str, str] | None, custody: Custody | None) -> dict[str, str] | None:
    """The environment of a stdio upstream: ``base`` plus its credentials (None: nothing to add)."""
    extra = custody.env() if custody else {}
    if not extra:
        return dict(base) if base is not None else None
    return {**(base or {}), **extra}
