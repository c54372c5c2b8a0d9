"""Open what a command line names: a log to recover, a ledger and claims to share.

    --wal-path ./agent-saga.wal                       a FileWAL file (PathSource)
    --wal-url  redis://host:6379/0?key=agent-saga:wal  a RedisWAL fleet log (this daemon
                                                       writes its own chain in it)
    --wal-url  postgresql://u@host/db?table=saga_wal   a PostgresWAL fleet log
    --redis-url redis://host:6379/0                    RedisLedger + RedisClaimLock

No message built here carries a password (``agent_saga.wal.urls``).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

from ..errors import ConfigurationError
from ..wal.base import BaseWAL
from ..wal.urls import redact

__all__ = ["open_fleet_wal", "split_query"]


def split_query(url: str, own: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """``url`` without the query parameters named in ``own``, and their values."""
    parts = urllib.parse.urlsplit(url)
    mine: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        (mine.__setitem__(k, v) if k in own else rest.append((k, v)))
    query = urllib.parse.urlencode(rest)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment)), mine


def open_fleet_wal(url: str, *, writer: str | None = None, **options: Any) -> BaseWAL:
    """Open a writer on the fleet log ``url`` (``redis://...?key=K``,
    ``postgresql://...?table=T``); ``file://`` or a bare path opens a FileWAL.

    Raises ``ConfigurationError`` for an unknown scheme or a missing client package.
    """
    if "://" not in url:
        from ..wal.file import FileWAL

        return FileWAL(url, **options)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "file":
        from ..wal.file import FileWAL

        return FileWAL(urllib.parse.unquote(urllib.parse.urlsplit(url).path), **options)
    if scheme in ("redis", "rediss", "unix"):
        from ..wal.redis import DEFAULT_KEY, RedisWAL

        clean, mine = split_query(url, ("key", "writer"))
        return RedisWAL(clean, key=mine.get("key") or DEFAULT_KEY, writer=writer or mine.get("writer"), **options)
    if scheme in ("postgresql", "postgres"):
        from ..wal.postgres import DEFAULT_TABLE, PostgresWAL

        clean, mine = split_query(url, ("table", "writer"))
        return PostgresWAL(clean, mine.get("table") or DEFAULT_TABLE, writer=writer or mine.get("writer"), **options)
    raise ConfigurationError(
        f"{redact(url)}: unknown WAL scheme {scheme!r}; use a path, file://, redis://, rediss://, "
        f"unix://, postgresql:// or postgres://"
    )


def default_file_paths(wal_path: str) -> tuple[str, str]:
    """The default ledger file and claims directory of a file log."""
    p = os.fspath(wal_path)
    return f"{p}.recovery.jsonl", f"{p}.recovery-claims"
