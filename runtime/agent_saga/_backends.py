"""One way to open a backend from what a user typed: a URL, a path, or nothing.

Every kind of backend the runtime opens from a string has one ``Backends`` registry,
keyed on the URL's scheme, in the package that owns the kind:

    WAL writers     agent_saga.wal.open_wal         path, file://, redis://, postgresql://
    WAL readers     agent_saga.wal.open_reader      the same schemes
    kill switch     controls.killswitch.open_switch_store   path, file://, redis://?grace=
    limit windows   controls.limits.open_limit_store        "" (in process), redis://
    approvals       controls.approvals.open_approval_store  directory, file://, redis://
    claims          recovery.open_claim_lock                directory, file://, redis://

A registration names its schemes and the query options it takes for itself (``key``,
``writer``, ``grace``...); ``open`` hands the factory an ``Address``: the scheme, the URL
without those options (what the client library gets), the options, and the path of a
``file`` target. A bare path is scheme ``file``; ``unix://`` is Redis's socket form.

Invariants:
- An unknown scheme is a ``ConfigurationError`` that names the kind and the schemes it
  takes, with the password removed from the target (``agent_saga.wal.urls``).
- The registry imports nothing: each factory imports its backend (and its client
  library) only when called, so the core stays standard-library only.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .errors import ConfigurationError

__all__ = ["Address", "Backends", "split_query"]

T = TypeVar("T")

#: Redis's URL schemes (``unix://`` is a socket path; ``+sentinel``/``+cluster``: agent_saga._redis).
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster")
#: PostgreSQL's URL schemes.
POSTGRES_SCHEMES = ("postgresql", "postgres")


def split_query(url: str, own: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """``url`` without the query parameters named in ``own``, and their values."""
    parts = urllib.parse.urlsplit(url)
    mine: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if k in own:
            mine[k] = v
        else:
            rest.append((k, v))
    query = urllib.parse.urlencode(rest)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment)), mine


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed target: ``scheme`` (``file`` for a path, ``""`` for an empty target),
    ``url`` without the options the backend takes, those ``options``, and the ``path``
    of a ``file`` target (``""`` otherwise)."""

    target: str
    scheme: str
    url: str
    path: str = ""
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Entry(Generic[T]):
    factory: Callable[..., T]
    options: tuple[str, ...]


class Backends(Generic[T]):
    """The backends of one ``kind`` (``"WAL"``, ``"kill switch store"``), by scheme."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, _Entry[T]] = {}

    def register(self, *schemes: str, options: tuple[str, ...] = ()
                 ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: ``factory(address, **kw)`` opens the backend for ``schemes`` (``""``
        is the empty target, ``file`` a path); ``options`` are the query parameters it
        takes for itself. Returns the factory unchanged."""
        def add(factory: Callable[..., T]) -> Callable[..., T]:
            for scheme in schemes:
                if scheme in self._entries:
                    raise ConfigurationError(f"{self.kind}: scheme {scheme!r} is registered twice")
                self._entries[scheme] = _Entry(factory, options)
            return factory

        return add

    @property
    def schemes(self) -> tuple[str, ...]:
        """The schemes registered, in registration order."""
        return tuple(self._entries)

    def address(self, target: str) -> Address:
        """``target`` parsed; raises ``ConfigurationError`` for a scheme not registered."""
        text = target.strip() if isinstance(target, str) else target
        if not isinstance(text, str):
            raise ConfigurationError(f"a {self.kind} is named by a URL or a path, got {target!r}")
        if not text:
            scheme = ""
        elif "://" not in text:
            scheme = "file"
        else:
            scheme = urllib.parse.urlsplit(text).scheme.lower()
        entry = self._entries.get(scheme)
        if entry is None:
            from .wal.urls import redact  # on the error path only: the registry imports nothing

            raise ConfigurationError(
                f"{redact(text) or 'an empty target'}: unknown {self.kind} scheme {scheme!r}; use {self._choices()}"
            )
        if scheme == "file":
            path = urllib.parse.unquote(text[len("file://"):]) if text.startswith("file://") else text
            return Address(text, scheme, text, path)
        if not scheme:
            return Address(text, scheme, text)
        url, mine = split_query(text, entry.options)
        return Address(text, scheme, url, "", mine)

    def open(self, target: str, **kw: object) -> T:
        """The backend ``target`` names, made by its factory (``kw`` passed on)."""
        address = self.address(target)
        return self._entries[address.scheme].factory(address, **kw)

    def _choices(self) -> str:
        shown: list[str] = []
        for scheme in self._entries:
            if scheme == "file":
                shown += ["a path", "file://"]
            elif scheme:
                shown.append(f"{scheme}://")
            else:
                shown.append("nothing (the default)")
        return ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else shown[0]
