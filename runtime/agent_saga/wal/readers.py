"""Read any WAL without writing it: a reader factory keyed on the URL scheme.

    open_reader("./agent-saga.wal")                                  FileWAL file
    open_reader("file:///var/lib/agent-saga.wal")                    FileWAL file
    open_reader("redis://:pw@host:6379/0?key=agent-saga:wal")        RedisWAL (every writer)
    open_reader("redis://host/0?key=agent-saga:wal&writer=pod-7")    one writer's chain
    open_reader("postgresql://u:pw@host/db?table=saga_wal")          PostgresWAL
    open_reader("postgresql://u@host/db?table=saga_wal&writer=pod-7")

A log holds one chain per writer (a file holds one). ``chain(name)`` yields
``(location, record-or-WALCorrupt)`` pairs for ``chain.verify_records``; ``records()``
yields the whole log in order (``gseq`` order for a fleet log). Locations and the
``description`` never carry a password. The Redis and PostgreSQL clients are imported only
when such a URL is opened.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from .._backends import POSTGRES_SCHEMES, REDIS_SCHEMES, Backends, split_query
from ..errors import ConfigurationError, WALCorrupt, WALError
from ..records import Record
from .urls import Scrubber, redact, secrets_in


class LogReader(Protocol):
    """A read-only view of one WAL."""

    description: str

    def chains(self) -> list[str]:
        """The writer chains in the log (a FileWAL log has exactly one, named by its path)."""
        ...

    def chain(self, name: str) -> Iterator[tuple[str, Record | WALCorrupt]]:
        """One chain in ``seq`` order, damaged records as ``WALCorrupt`` values."""
        ...

    def records(self, skip: frozenset[str] = frozenset()) -> Iterator[Record]:
        """Every record of the log in order, but those of the chains in ``skip``; raises
        ``WALCorrupt`` on damage."""
        ...

    def quarantined(self) -> dict[str, dict[str, Any]]:
        """The writers an operator quarantined: writer -> ``{by, reason, ts}`` (RedisWAL
        only; ``agent-saga wal quarantine``)."""
        ...

    def torn_tail_bytes(self) -> int:
        """Bytes of an unacknowledged torn fragment at the end (FileWAL only; else 0)."""
        ...

    def close(self) -> None:
        """Release the log."""


class FileLogReader:
    """A FileWAL file: one chain, named by its path."""

    def __init__(self, path: str) -> None:
        from .file import iter_file_records, torn_tail_bytes

        self.path = path
        self.description = path
        self._iter = iter_file_records
        self._torn = torn_tail_bytes
        # Fail now, as a usage error, if the file is missing.
        next(iter(self._iter(path)), None)

    def chains(self) -> list[str]:
        """The file's one chain: its path."""
        return [self.path]

    def chain(self, name: str) -> Iterator[tuple[str, Record | WALCorrupt]]:
        """``(location, record)`` of every line."""
        return self._iter(self.path)

    def records(self, skip: frozenset[str] = frozenset()) -> Iterator[Record]:
        """Every readable record, in log order (nothing when ``skip`` names the file)."""
        if self.path in skip:
            return
        for _loc, item in self._iter(self.path):
            if isinstance(item, WALCorrupt):
                raise item
            yield item

    def torn_tail_bytes(self) -> int:
        """Bytes of an unterminated final fragment (a torn write)."""
        return self._torn(self.path)

    def quarantined(self) -> dict[str, dict[str, Any]]:
        """A file has no writer quarantine."""
        return {}

    def close(self) -> None:
        """Nothing to release."""
        pass


class _SharedLogReader:
    """What the Redis and PostgreSQL readers share: one chain per writer, records merged in
    ``gseq`` order (or only ``writer``'s), no torn tails (a server write is whole)."""

    _log: Any
    _writer: str | None
    _writers: list[str]

    def chains(self) -> list[str]:
        return list(self._writers)

    def chain(self, name: str) -> Iterator[tuple[str, Record | WALCorrupt]]:
        items: Iterator[tuple[str, Record | WALCorrupt]] = self._log.chain(name)
        return items

    def records(self, skip: frozenset[str] = frozenset()) -> Iterator[Record]:
        if self._writer:
            if self._writer in skip:
                return
            for _loc, item in self._log.chain(self._writer):
                if isinstance(item, WALCorrupt):
                    raise item
                yield item
            return
        for page in self._log.pages_since(0, skip=skip):
            yield from page

    def torn_tail_bytes(self) -> int:
        return 0

    def quarantined(self) -> dict[str, dict[str, Any]]:
        got = getattr(self._log, "quarantined", None)
        return {} if got is None else dict(got())


class RedisLogReader(_SharedLogReader):
    """Every writer's stream under ``key`` (or only ``writer``'s)."""

    def __init__(self, url: str) -> None:
        from .._redis import connect, failures, import_redis
        from .redis import DEFAULT_KEY, RedisLog

        redis = import_redis("reading a RedisWAL")
        clean, mine = split_query(url, ("key", "writer", "wait_replicas"))
        self._scrub = Scrubber(secrets_in(url))
        where = redact(clean)
        key = mine.get("key") or DEFAULT_KEY
        self.description = f"{where} key {key}"
        self._writer = mine.get("writer")
        self._client = connect(clean, feature="reading a RedisWAL", socket_timeout=10.0)
        self._log = RedisLog(self._client, key, where)
        self._errors = failures(redis)
        try:
            self._writers = [self._writer] if self._writer else self._log.writers()
            if self._writer and not self._client.exists(self._log.stream(self._writer)):
                raise ConfigurationError(f"writer {self._writer!r} has no stream under key {key!r} at {where}")
        except self._errors as exc:
            raise WALError(f"cannot read {self.description}: {self._scrub(f'{type(exc).__name__}: {exc}')}") from exc
        if not self._writers:
            raise ConfigurationError(
                f"no WAL under key {key!r} at {where} (no writer has written); check ?key="
            )

    def close(self) -> None:
        """Close the client."""
        with contextlib.suppress(Exception):
            self._client.close()


class PostgresLogReader(_SharedLogReader):
    """Every writer's rows in ``table`` (or only ``writer``'s)."""

    def __init__(self, url: str) -> None:
        from .postgres import DEFAULT_TABLE, PostgresLog, _import_psycopg, describe_dsn, dsn_secrets

        psycopg = _import_psycopg()
        clean, mine = split_query(url, ("table", "writer"))
        self._scrub = Scrubber(dsn_secrets(url))
        where = describe_dsn(clean)
        table = mine.get("table") or DEFAULT_TABLE
        self.description = f"{where} table {table}"
        self._writer = mine.get("writer")
        try:
            self._conn: Any = psycopg.connect(clean, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise WALError(f"cannot read {self.description}: {self._scrub(f'{type(exc).__name__}: {exc}')}") from exc
        self._log = PostgresLog(lambda: contextlib.nullcontext(self._conn), table, where)
        if not self._log.exists(self._conn):
            self.close()
            raise ConfigurationError(f"table {table!r} does not exist at {where}; check ?table=")
        self._writers = [self._writer] if self._writer else self._log.writers()
        if not self._writers or (self._writer and self._log.tail(self._conn, self._writer) is None):
            self.close()
            raise ConfigurationError(
                f"table {table!r} at {where} holds no records"
                + (f" of writer {self._writer!r}" if self._writer else "")
            )

    def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(Exception):
            self._conn.close()


#: The WAL readers, by scheme (``agent_saga._backends``).
READERS: Backends[LogReader] = Backends("WAL")
READERS.register("file")(lambda address: FileLogReader(address.path))
READERS.register(*REDIS_SCHEMES)(lambda address: RedisLogReader(address.target))
READERS.register(*POSTGRES_SCHEMES)(lambda address: PostgresLogReader(address.target))


def open_reader(target: str) -> LogReader:
    """A reader for a file path or a ``file://``, ``redis://``, ``rediss://``, ``unix://``,
    ``postgresql://`` or ``postgres://`` URL (see the module doc).

    Raises ``ConfigurationError`` for an unknown scheme, a missing log or a missing client
    package; ``WALError`` if the server cannot be reached. No message carries a password.
    """
    return READERS.open(target)
