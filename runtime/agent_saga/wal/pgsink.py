"""PostgresAsyncSink: an ``AsyncSink`` on psycopg's asynchronous connection.

The same table, rows and fence as ``PostgresWAL`` (``agent_saga.wal.postgres``; the SQL
is ``PostgresLog``'s), reached through ``psycopg.AsyncConnection`` on the sink's own event
loop: one connection for the writer (batches, compaction) and one for reads. A log written
by ``SinkWAL(PostgresAsyncSink(dsn))`` is read, verified and continued by ``PostgresWAL``
and the CLI exactly like one written by ``PostgresWAL``, and the other way round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigurationError, WALCorrupt, WALError
from ..records import TERMINAL_SAGA_TYPES, Record
from .batching import Sealed
from .compaction import CompactionAborted
from .postgres import (
    _SYNC_VALUES,
    DEFAULT_TABLE,
    PostgresLog,
    _import_psycopg,
    describe_dsn,
    dsn_secrets,
    durability_of,
    lock_key,
)
from .sink import AsyncSink, Located

_NO_LIMIT = (1 << 63) - 1


class PostgresAsyncSink(AsyncSink):
    """An asynchronous PostgreSQL store for ``SinkWAL``.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL (its password never
            appears in a record, log line or message).
        table_name: the table (``[schema.]name``), created with ``<name>_gseq`` if absent.
        synchronous_commit: if given, ``SET synchronous_commit`` for the writer's session.
        connect_timeout: seconds to wait for a connection.
    """

    def __init__(
        self,
        dsn: str,
        table_name: str = DEFAULT_TABLE,
        *,
        synchronous_commit: str | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        if synchronous_commit is not None and synchronous_commit not in _SYNC_VALUES:
            raise ConfigurationError(
                f"synchronous_commit={synchronous_commit!r} is not one of {sorted(_SYNC_VALUES)}"
            )
        self._psycopg = _import_psycopg()
        where = describe_dsn(dsn)
        self.name = f"{where} table {table_name} (async)"
        self.secrets = dsn_secrets(dsn)
        self._dsn = dsn
        self._table = table_name
        self._sync = synchronous_commit
        self._timeout = max(1, int(connect_timeout))
        self._log = PostgresLog(_no_sync_connection, table_name, where)
        self._q_one = self._log.append_sql(many=False)
        self._q_many = self._log.append_sql(many=True)
        self._w: Any = None
        self._r: Any = None
        self._lock = 0

    async def _connect(self) -> Any:
        return await self._psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=self._timeout
        )

    async def _one(self, conn: Any, query: Any, params: Any = None) -> Any:
        cur = await conn.execute(query, params)
        return await cur.fetchone()

    async def open(self) -> None:
        """Connect both sessions; create the table if absent; read the server's durability."""
        sql = self._psycopg.sql
        self._w = await self._connect()
        self._r = await self._connect()
        w = self._w
        if self._sync is not None:
            await w.execute(sql.SQL("SET synchronous_commit TO {}").format(sql.Literal(self._sync)))
        row = await self._one(w, "SELECT to_regclass(%s) IS NOT NULL", (self._table,))
        if not (row and row[0]):
            async with w.transaction():
                await w.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._table,))
                await w.execute(self._log.ddl())
        sc = (await self._one(w, "SHOW synchronous_commit"))[0]
        fs = (await self._one(w, "SHOW fsync"))[0]
        self.durability = durability_of("PostgresAsyncSink", self.name, sc, fs)
        self._lock = lock_key((await self._one(w, self._log.q_oid))[0])

    async def tail(self, writer: str) -> Located | None:
        """The writer's last row (one primary-key index probe)."""
        row = await self._one(self._w, self._log.q_tail, (writer,))
        return None if row is None else self._log.decode(row)

    async def append(self, writer: str, batch: Sealed, expect: int) -> None:
        """One fenced INSERT in its own transaction (see ``agent_saga.wal.postgres``)."""
        q = self._q_one if len(batch) == 1 else self._q_many
        params = self._log.append_params(self._lock, writer, batch, expect)
        try:
            cur = await self._w.execute(q, params, prepare=True)
        except self._psycopg.errors.UniqueViolation as exc:
            raise self._fenced(writer, expect) from exc
        if cur.rowcount != len(batch):
            raise self._fenced(writer, expect)

    def _fenced(self, writer: str, expect: int) -> WALError:
        return WALError(
            f"{self.name}: the table's last record of this writer is not seq {expect} as "
            f"this writer last wrote: another process writes with writer id {writer!r}, or "
            f"rows were deleted. Nothing was written; open a new SinkWAL to continue from "
            f"what the table holds"
        )

    async def chain(self, writer: str, after: int, limit: int) -> list[Located]:
        """One page of the writer's chain."""
        cur = await self._r.execute(self._log.q_chain, (writer, after, limit))
        return [self._log.decode(row) for row in await cur.fetchall()]

    async def read_since(self, cursor: int, limit: int) -> list[Record]:
        """One page of every writer's records after ``cursor`` in ``gseq`` order. Batches
        commit in ``gseq`` order (the advisory lock), so a page is a prefix of what follows
        the cursor."""
        cur = await self._r.execute(self._log.q_since, (cursor, _NO_LIMIT, limit))
        out: list[Record] = []
        for row in await cur.fetchall():
            _loc, item = self._log.decode(row)
            if isinstance(item, WALCorrupt):
                raise item
            out.append(item)
        return out

    async def resolved(self) -> set[str]:
        """The sagas with a terminal record (the partial index on terminal records)."""
        cur = await self._w.execute(self._log.q_resolved, (sorted(TERMINAL_SAGA_TYPES),))
        return {r[0] for r in await cur.fetchall()}

    async def replace(
        self, writer: str, attestation: tuple[Record, str], runs: Sequence[tuple[int, int]], removed: int
    ) -> None:
        """The attestation and the deletes in one transaction."""
        w = self._w
        async with w.transaction():
            # The attestation first: its fence needs the writer's head, which may be removed.
            await self.append(writer, [attestation], attestation[0].seq - 1)
            if runs:
                cur = await w.execute(
                    self._log.q_delete, ([a for a, _ in runs], [b for _, b in runs], writer)
                )
                if cur.rowcount != removed:
                    raise CompactionAborted(
                        f"compaction of {self.name} writer {writer}: {cur.rowcount} rows "
                        f"matched, {removed} expected; the table changed underneath, nothing "
                        f"was changed"
                    )

    async def close(self) -> None:
        """Close both connections."""
        for conn in (self._w, self._r):
            if conn is not None:
                try:
                    await conn.close()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    pass
        self._w = self._r = None


def _no_sync_connection() -> Any:
    raise ConfigurationError("PostgresAsyncSink reads through its own asynchronous connections")
