"""Open a WAL writer from a path or a URL: ``open_wal``.

    open_wal("./agent-saga.wal")                                   FileWAL
    open_wal("redis://host:6379/0?key=agent-saga:wal&writer=pod-7")  RedisWAL
    open_wal("redis+sentinel://s1:26379,s2:26379/mymaster?key={agent-saga}:wal&wait_replicas=1")
    open_wal("postgresql://u@host/db?table=saga_wal")              PostgresWAL

The schemes are one ``Backends`` registry (``agent_saga._backends``), the mechanism every
backend opened from a URL uses; ``open_reader`` (``readers``) is the reading side.
"""

from __future__ import annotations

from typing import Any

from .._backends import POSTGRES_SCHEMES, REDIS_SCHEMES, Address, Backends
from ..errors import ConfigurationError
from .base import BaseWAL

__all__ = ["WALS", "open_wal"]

#: The WAL writers, by scheme.
WALS: Backends[BaseWAL] = Backends("WAL")


@WALS.register("file")
def _file(address: Address, *, writer: str | None = None, **options: Any) -> BaseWAL:
    from .file import FileWAL

    return FileWAL(address.path, **options)


@WALS.register(*REDIS_SCHEMES, options=("key", "writer", "wait_replicas"))
def _redis(address: Address, *, writer: str | None = None, **options: Any) -> BaseWAL:
    from .redis import DEFAULT_KEY, RedisWAL

    if "wait_replicas" in address.options:
        options.setdefault("wait_replicas", _count(address.options["wait_replicas"], "wait_replicas"))
    return RedisWAL(address.url, key=address.options.get("key") or DEFAULT_KEY,
                    writer=writer or address.options.get("writer"), **options)


def _count(text: str, name: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigurationError(f"{name}={text!r} in the WAL URL must be a whole number >= 0 "
                                 f"(the replicas that must acknowledge each batch)")
    return n


@WALS.register(*POSTGRES_SCHEMES, options=("table", "writer"))
def _postgres(address: Address, *, writer: str | None = None, **options: Any) -> BaseWAL:
    from .postgres import DEFAULT_TABLE, PostgresWAL

    return PostgresWAL(address.url, address.options.get("table") or DEFAULT_TABLE,
                       writer=writer or address.options.get("writer"), **options)


def open_wal(target: str, *, writer: str | None = None, **options: Any) -> BaseWAL:
    """A writer on the log ``target`` names: a path or ``file://`` (FileWAL),
    ``redis://...?key=K&writer=W`` (RedisWAL), ``postgresql://...?table=T&writer=W``
    (PostgresWAL). ``options`` go to the backend's constructor.

    Raises ``ConfigurationError`` for an unknown scheme or a missing client package (no
    message carries a password)."""
    return WALS.open(target, writer=writer, **options)
