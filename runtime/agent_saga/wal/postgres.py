"""PostgresWAL: the hash-chained log as rows of one PostgreSQL table, committed per batch.

Schema (``table_name`` defaults to ``saga_wal``; created if absent)::

    saga_wal       (v, writer, seq, gseq, ts, type, saga, step, payload, salt, digest,
                    prev, hash, redacted)   PRIMARY KEY (writer, seq), UNIQUE (gseq),
                    partial index on saga for terminal records
    saga_wal_gseq  SEQUENCE                 the global sequence

Invariants:
- ``payload`` is the exact canonical JSON text the digest was computed over (``text``,
  not ``jsonb``, which would reorder keys); one writer's rows verify with the same
  ``chain.verify_records`` as a FileWAL file. ``gseq`` and ``writer`` are stamped into
  ``Record.extra`` by the reader, never hashed.
- A batch is one INSERT statement in its own transaction: it takes the table's
  transaction-scoped advisory lock, checks the fence (the writer's last ``seq`` is the one
  this writer last wrote), draws ``gseq`` from the sequence and inserts the batch (one
  row from parameters, or many from one jsonb array). ``barrier`` returns after COMMIT, so
  durability is PostgreSQL's own: ``synchronous_commit`` is honoured (read at open and
  stated in ``durability``; ``synchronous_commit=`` sets it for this writer's session).
- The advisory lock is held to COMMIT and ``gseq`` is drawn under it, so batches commit in
  ``gseq`` order and what any snapshot sees is a prefix of the log in ``gseq`` order:
  ``read_since(gseq)`` is a consistent cursor. The price: batches of different writers
  commit one after another (each writer still group-commits its own).
- Reopening a writer finds its head with one query on the primary key index
  (``ORDER BY seq DESC LIMIT 1``), never a table scan.
- Fail-stop like FileWAL: a failed batch fails the writer with ``WALError`` chained to
  the real ``psycopg`` error, password-free. The failed batch is in doubt; a new
  PostgresWAL with the same ``writer`` continues from what the table holds.
- ``compact()`` deletes the removed runs and inserts the attestation in one transaction.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..chain import seal
from ..errors import ConfigurationError, WALCorrupt, WALError
from ..records import SCHEMA_VERSION, TERMINAL_SAGA_TYPES, Record, validate_id
from .base import Backpressure, FaultHook
from .batching import BatchingWAL, Sealed, SharedLogReads, default_writer_id
from .compaction import CompactionAborted, CompactionPlan, CompactionReport, CompactionRequest
from .urls import Scrubber, redact, secrets_in

log = logging.getLogger("agent_saga.wal")

DEFAULT_TABLE = "saga_wal"
_TABLE = re.compile(r"^(?:[a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,55}$")
_SYNC_VALUES = frozenset({"on", "off", "local", "remote_write", "remote_apply"})
COLUMNS = "v, writer, seq, gseq, ts, type, saga, step, payload, salt, digest, prev, hash, redacted"


def _import_psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigurationError(
            "PostgresWAL needs psycopg 3: pip install 'agent-saga[postgres]'"
        ) from exc
    return psycopg


def describe_dsn(dsn: str) -> str:
    """``postgresql://user@host:port/db``: the server, never the password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        d = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - any parse failure: fall back to masking
        return redact(dsn)
    user = f"{d['user']}@" if d.get("user") else ""
    port = f":{d['port']}" if d.get("port") else ""
    return f"postgresql://{user}{d.get('host', '')}{port}/{d.get('dbname', '')}"


def dsn_secrets(dsn: str) -> list[str]:
    """Every form in which ``dsn``'s password could be echoed."""
    found = list(secrets_in(dsn))
    try:
        from psycopg.conninfo import conninfo_to_dict

        pw = conninfo_to_dict(dsn).get("password")
        if pw:
            found.append(str(pw))
    except Exception:  # noqa: BLE001
        pass
    return found


def lock_key(oid: int) -> int:
    """The advisory lock key of a WAL table: its OID under a fixed high half."""
    return (0x5A6A << 32) | int(oid)


def durability_of(kind: str, name: str, synchronous_commit: str, fsync: str) -> str:
    """The ``durability`` statement of a writer on a server with these settings (and a
    warning in the log if a server crash can lose acknowledged records)."""
    if synchronous_commit == "off" or fsync == "off":
        log.warning(
            "%s %s: synchronous_commit=%s fsync=%s, so a server crash can lose "
            "acknowledged records; pass synchronous_commit='on' (and run with fsync=on)",
            kind, name, synchronous_commit, fsync,
        )
    return (
        "postgres: barrier returns after the batch's transaction committed "
        f"[synchronous_commit={synchronous_commit} fsync={fsync}]"
    )


class PostgresLog:
    """The read side of a PostgreSQL WAL table (synchronous; PostgresWAL and the CLI).

    ``connection`` returns a context manager giving an autocommit ``psycopg.Connection``.
    """

    def __init__(
        self,
        connection: Callable[[], AbstractContextManager[Any]],
        table: str,
        where: str,
    ) -> None:
        if not _TABLE.match(table):
            raise ConfigurationError(
                f"table name {table!r} is not valid: use lower-case letters, digits and "
                f"underscores (optionally schema.table), starting with a letter"
            )
        psycopg = _import_psycopg()
        sql = psycopg.sql
        self.connection = connection
        self.table = table
        self.where = where
        parts = table.split(".")
        self.t = sql.Identifier(*parts)
        self.seq_name = ".".join([*parts[:-1], parts[-1] + "_gseq"])
        self.meta = sql.Identifier(*parts[:-1], parts[-1] + "_gseq")
        self.index_gseq = sql.Identifier(parts[-1] + "_gseq_key")
        self.index_terminal = sql.Identifier(parts[-1] + "_terminal")
        self._sql = sql
        cols = sql.SQL(COLUMNS)
        self.q_tail = sql.SQL(
            "SELECT {c} FROM {t} WHERE writer = %s ORDER BY seq DESC LIMIT 1"
        ).format(c=cols, t=self.t)
        self.q_chain = sql.SQL(
            "SELECT {c} FROM {t} WHERE writer = %s AND seq > %s ORDER BY seq LIMIT %s"
        ).format(c=cols, t=self.t)
        self.q_since = sql.SQL(
            "SELECT {c} FROM {t} WHERE gseq > %s AND gseq <= %s ORDER BY gseq LIMIT %s"
        ).format(c=cols, t=self.t)
        self.q_hwm = sql.SQL("SELECT coalesce(max(gseq), 0) FROM {t}").format(t=self.t)
        self.q_writers = sql.SQL(
            "WITH RECURSIVE w AS ((SELECT writer FROM {t} ORDER BY writer LIMIT 1) UNION ALL "
            "SELECT (SELECT writer FROM {t} WHERE writer > w.writer ORDER BY writer LIMIT 1) "
            "FROM w WHERE w.writer IS NOT NULL) SELECT writer FROM w WHERE writer IS NOT NULL"
        ).format(t=self.t)
        self.q_delete = sql.SQL(
            "DELETE FROM {t} AS x USING unnest(%s::bigint[], %s::bigint[]) AS r(a, b) "
            "WHERE x.writer = %s AND x.seq BETWEEN r.a AND r.b"
        ).format(t=self.t)
        self.q_oid = sql.SQL("SELECT {}::regclass::oid").format(sql.Literal(table))
        self.q_resolved = sql.SQL(
            "SELECT DISTINCT saga FROM {t} WHERE type = ANY(%s)"
        ).format(t=self.t)

    def ddl(self) -> Any:
        """The table and index definitions (``CREATE ... IF NOT EXISTS``)."""
        sql = self._sql
        terminal = sql.SQL(", ").join(sql.Literal(x) for x in sorted(TERMINAL_SAGA_TYPES))
        return sql.SQL(
            """
CREATE TABLE IF NOT EXISTS {t} (
    v        smallint NOT NULL,
    writer   text     NOT NULL,
    seq      bigint   NOT NULL,
    gseq     bigint   NOT NULL,
    ts       bigint   NOT NULL,
    type     text     NOT NULL,
    saga     text     NOT NULL,
    step     text,
    payload  text,
    salt     text,
    digest   text     NOT NULL,
    prev     text     NOT NULL,
    hash     text     NOT NULL,
    redacted boolean  NOT NULL DEFAULT false,
    PRIMARY KEY (writer, seq)
);
CREATE UNIQUE INDEX IF NOT EXISTS {ig} ON {t} (gseq);
CREATE INDEX IF NOT EXISTS {it} ON {t} (saga) WHERE type IN ({terminal});
CREATE SEQUENCE IF NOT EXISTS {m};
"""
        ).format(t=self.t, m=self.meta, ig=self.index_gseq, it=self.index_terminal, terminal=terminal)

    def exists(self, conn: Any) -> bool:
        """Does the table exist?"""
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (self.table,)).fetchone()
        return bool(row and row[0])

    def decode(self, row: tuple[Any, ...]) -> tuple[str, Record | WALCorrupt]:
        """``(location, record)`` of a row (a ``WALCorrupt`` if it cannot be read)."""
        v, writer, seq, gseq, ts, type_, saga, step, payload, salt, digest, prev, hash_, redacted = row
        location = f"{self.where} table {self.table} writer {writer} seq {seq}"
        if v != SCHEMA_VERSION:
            return location, WALCorrupt(
                f"{location}: schema version v={v!r} is not supported by this reader "
                f"(supports v={SCHEMA_VERSION}); upgrade agent-saga to read it",
                location=location,
            )
        p: Any = None
        if payload is not None:
            try:
                p = json.loads(payload)
            except ValueError as exc:
                return location, WALCorrupt(
                    f"{location}: payload is not valid JSON ({exc}); the record cannot be read. "
                    f"Run `agent-saga verify` to locate damage; do not delete the row by hand, "
                    f"a gap breaks the hash chain",
                    location=location,
                )
            if p is not None and not isinstance(p, dict):
                return location, WALCorrupt(f"{location}: payload must be an object or null", location=location)
        rec = Record(
            type=type_, saga=saga, step=step, payload=p, seq=seq, ts=ts, salt=salt,
            digest=digest, prev=prev, hash=hash_, redacted=bool(redacted),
            extra={"gseq": gseq, "writer": writer},
        )
        return location, rec

    def tail(self, conn: Any, writer: str) -> tuple[str, Record | WALCorrupt] | None:
        """The last row ``writer`` wrote, or ``None``."""
        row = conn.execute(self.q_tail, (writer,)).fetchone()
        return None if row is None else self.decode(row)

    def writers(self) -> list[str]:
        """Every writer id that has written."""
        with self.connection() as conn:
            return [r[0] for r in conn.execute(self.q_writers).fetchall()]

    def high_water(self, conn: Any) -> int:
        """The highest ``gseq`` written."""
        row = conn.execute(self.q_hwm).fetchone()
        return int(row[0]) if row else 0

    def chain(
        self, writer: str, page_size: int = 1000, conn: Any = None
    ) -> Iterator[tuple[str, Record | WALCorrupt]]:
        """``(location, record-or-error)`` of one writer's chain in ``seq`` order."""
        after = 0
        while True:
            if conn is None:
                with self.connection() as c:
                    rows = c.execute(self.q_chain, (writer, after, page_size)).fetchall()
            else:
                rows = conn.execute(self.q_chain, (writer, after, page_size)).fetchall()
            for row in rows:
                yield self.decode(row)
            if len(rows) < page_size:
                return
            after = rows[-1][2]

    def pages_since(
        self,
        cursor: int,
        page_size: int = 1000,
        *,
        broken: dict[str, WALCorrupt] | None = None,
        skip: frozenset[str] = frozenset(),
        quarantined: dict[str, dict[str, Any]] | None = None,
    ) -> Iterator[list[Record]]:
        """Every writer's records with ``gseq > cursor`` in ``gseq`` order, in pages, up to
        the highest ``gseq`` committed when it starts. Batches commit in ``gseq`` order, so
        each page is a prefix and the cursor never skips a record committed later.
        Rows of the writers in ``skip`` are left out. Raises ``WALCorrupt`` on a row that
        cannot be read, unless ``broken`` is given: then its writer goes into ``broken`` and
        no further row of it is read. (``quarantined``: a PostgresWAL keeps no writer
        quarantine; it is left empty.)"""
        with self.connection() as conn:
            hwm = self.high_water(conn)
        while cursor < hwm:
            with self.connection() as conn:
                rows = conn.execute(self.q_since, (cursor, hwm, page_size)).fetchall()
            page: list[Record] = []
            for row in rows:
                if skip and row[1] in skip:
                    continue
                _loc, item = self.decode(row)
                if isinstance(item, WALCorrupt):
                    if broken is None:
                        raise item
                    broken[row[1]] = item  # this writer is read no further; the others are
                    skip = skip | {row[1]}
                    continue
                page.append(item)
            if page:
                yield page
            if len(rows) < page_size:
                return
            cursor = rows[-1][3]

    def append_sql(self, many: bool) -> Any:
        """The fenced INSERT of a batch of one record (``many=False``) or several."""
        sql = self._sql
        # The lock comes first (a materialised CTE) and nextval is evaluated per inserted
        # row, after it: gseq is drawn under the lock, so commits follow gseq order.
        head = """
WITH l AS MATERIALIZED (SELECT pg_advisory_xact_lock(%(lock)s)),
h AS MATERIALIZED (SELECT coalesce(
        (SELECT seq FROM {t} WHERE writer = %(w)s ORDER BY seq DESC LIMIT 1), 0) AS head)
INSERT INTO {t} (v, writer, seq, gseq, ts, type, saga, step, payload, salt, digest, prev, hash, redacted)
"""
        if many:
            # The batch travels as one jsonb array of arrays (one parameter; psycopg's
            # per-element array dumping costs more than the insert). A payload is a JSON
            # *string* in it, so its canonical text arrives byte for byte.
            body = """
SELECT %(v)s, %(w)s, (e->>0)::bigint, nextval({s}), (e->>1)::bigint, e->>2, e->>3, e->>4, e->>5,
       e->>6, e->>7, e->>8, e->>9, (e->>10)::boolean
FROM l, h, jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS r(e, ord)
WHERE h.head = %(expect)s ORDER BY r.ord
"""
        else:
            body = """
SELECT %(v)s, %(w)s, %(seq)s, nextval({s}), %(ts)s, %(type)s, %(saga)s, %(step)s, %(payload)s,
       %(salt)s, %(digest)s, %(prev)s, %(hash)s, %(redacted)s
FROM l, h WHERE h.head = %(expect)s
"""
        return sql.SQL(head + body).format(t=self.t, s=sql.Literal(self.seq_name))

    def append_params(self, lock: int, writer: str, sealed: Sealed, expect: int) -> dict[str, Any]:
        """The parameters of ``append_sql`` for ``sealed``, fenced on the head ``expect``."""
        common = {"lock": lock, "w": writer, "expect": expect, "v": SCHEMA_VERSION}
        if len(sealed) == 1:
            r, c = sealed[0]
            return {
                **common, "seq": r.seq, "ts": r.ts, "type": r.type, "saga": r.saga,
                "step": r.step, "payload": None if r.redacted else c, "salt": r.salt,
                "digest": r.digest, "prev": r.prev, "hash": r.hash, "redacted": r.redacted,
            }
        rows = [
            [r.seq, r.ts, r.type, r.saga, r.step, None if r.redacted else c, r.salt, r.digest,
             r.prev, r.hash, r.redacted]
            for r, c in sealed
        ]
        return {**common, "rows": json.dumps(rows, ensure_ascii=False, separators=(",", ":"))}

    def resolved(self, conn: Any) -> set[str]:
        """The sagas with a terminal record."""
        return {r[0] for r in conn.execute(self.q_resolved, (sorted(TERMINAL_SAGA_TYPES),)).fetchall()}


class PostgresWAL(SharedLogReads, BatchingWAL):
    """A hash-chained log in one PostgreSQL table; ``barrier`` means the batch committed.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL (may carry a password,
            which never appears in a record, log line or message).
        table_name: the table (``[schema.]name``); it and ``<name>_gseq`` are created if
            absent.
        writer: this writer's id (default: unique per process). Reopening a writer id
            continues its sequence and chain from the table.
        synchronous_commit: if given, ``SET synchronous_commit`` for this writer's session
            (``on`` for a crash-safe commit on a server whose default is ``off``); by
            default the server's, database's or role's setting is honoured.
        connect_timeout: seconds to wait for a connection.
        max_pending, backpressure, stall_timeout, max_batch, fault_hook: as for RedisWAL.

    Raises ``ConfigurationError`` on bad arguments or a missing psycopg, ``WALError`` if the
    server cannot be reached, ``WALCorrupt`` if the writer's last row cannot be read.
    """

    backend = "postgres"

    def __init__(
        self,
        dsn: str,
        table_name: str = DEFAULT_TABLE,
        *,
        writer: str | None = None,
        synchronous_commit: str | None = None,
        connect_timeout: float = 10.0,
        max_pending: int = 100_000,
        backpressure: Backpressure = Backpressure.RAISE,
        stall_timeout: float = 30.0,
        max_batch: int = 1000,
        fault_hook: FaultHook | None = None,
    ) -> None:
        psycopg = _import_psycopg()
        if synchronous_commit is not None and synchronous_commit not in _SYNC_VALUES:
            raise ConfigurationError(
                f"synchronous_commit={synchronous_commit!r} is not one of {sorted(_SYNC_VALUES)}"
            )
        self.writer = validate_id(writer if writer is not None else default_writer_id(), "writer")
        where = describe_dsn(dsn)
        scrub = Scrubber(dsn_secrets(dsn))
        self._dsn = dsn
        self._connect_timeout = max(1, int(connect_timeout))
        self._pool: Any = None
        self._log = PostgresLog(self._pooled, table_name, where)
        self._read_errors: tuple[type[BaseException], ...] = (WALCorrupt, psycopg.Error)
        super().__init__(
            name=f"{where} table {table_name} writer {self.writer}",
            scrub=scrub,
            max_pending=max_pending,
            backpressure=backpressure,
            stall_timeout=stall_timeout,
            max_batch=max_batch,
            fault_hook=fault_hook,
        )
        self._conn: Any = None
        try:
            self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=self._connect_timeout)
            if synchronous_commit is not None:
                self._conn.execute(
                    psycopg.sql.SQL("SET synchronous_commit TO {}").format(
                        psycopg.sql.Literal(synchronous_commit)
                    )
                )
            if not self._log.exists(self._conn):
                with self._conn.transaction():
                    # Serialise concurrent first opens: CREATE ... IF NOT EXISTS can race.
                    self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (table_name,))
                    self._conn.execute(self._log.ddl())
            tail = self._log.tail(self._conn, self.writer)
            self.durability = self._probe_durability()
            # The lock key: the table's OID under a fixed high half, unique per table.
            self._lock_key = lock_key(self._conn.execute(self._log.q_oid).fetchone()[0])
            self._cur = self._conn.cursor()  # the flusher's, reused for every batch
            self._q_one = self._log.append_sql(many=False)
            self._q_many = self._log.append_sql(many=True)
        except psycopg.Error as exc:
            self._release()
            raise WALError(
                f"cannot open PostgresWAL: {where} failed: {scrub(f'{type(exc).__name__}: {exc}')}"
            ) from exc
        self._start_from(tail)

    # ------------------------------------------------------------------ I/O

    def _probe_durability(self) -> str:
        sc = self._conn.execute("SHOW synchronous_commit").fetchone()[0]
        fs = self._conn.execute("SHOW fsync").fetchone()[0]
        return durability_of(type(self).__name__, self.name, sc, fs)

    def _insert(self, sealed: Sealed) -> None:
        psycopg = _import_psycopg()
        expect = sealed[0][0].seq - 1
        try:
            q = self._q_one if len(sealed) == 1 else self._q_many
            cur = self._cur
            cur.execute(q, self._log.append_params(self._lock_key, self.writer, sealed, expect), prepare=True)
        except psycopg.errors.UniqueViolation as exc:
            raise self._fenced(expect) from exc
        if cur.rowcount != len(sealed):
            raise self._fenced(expect)

    def _fenced(self, expect: int) -> WALError:
        return WALError(
            f"WAL {self.name}: the table's last record of this writer is not seq {expect} as "
            f"this writer last wrote: another process writes with writer id {self.writer!r}, "
            f"or rows were deleted. Nothing was written; open a new PostgresWAL to continue "
            f"from what the table holds"
        )

    def _write_batch(self, sealed: Sealed) -> None:
        self._insert(sealed)

    def _compact_now(self, req: CompactionRequest, prev: str) -> tuple[CompactionReport, str]:
        try:
            plan = CompactionPlan(self._log.resolved(self._conn), req.keep_sagas)
            for _loc, item in self._log.chain(self.writer, conn=self._conn):
                if isinstance(item, WALCorrupt):
                    raise item
                plan.offer(item)
            rec = plan.attestation(req.seq)
            canonical = seal(rec, prev)
        except self._read_errors as exc:
            raise CompactionAborted(
                f"compaction of {self.name} read failed, nothing was changed: "
                f"{self._scrub(f'{type(exc).__name__}: {exc}')}"
            ) from exc
        report = plan.report(req.seq)
        with self._conn.transaction():
            # The attestation first: its fence needs the writer's head, which may be removed.
            self._insert([(rec, canonical)])
            if report.runs:
                cur = self._conn.execute(
                    self._log.q_delete,
                    ([a for a, _ in report.runs], [b for _, b in report.runs], self.writer),
                )
                if cur.rowcount != report.removed:
                    # Rolled back with the transaction: the log is unchanged.
                    raise CompactionAborted(
                        f"compaction of {self.name}: {cur.rowcount} rows matched, "
                        f"{report.removed} expected; the table changed underneath, nothing was changed"
                    )
        return report, rec.hash

    def _pooled(self) -> AbstractContextManager[Any]:
        if self._pool is None:
            try:
                from psycopg_pool import ConnectionPool
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ConfigurationError(
                    "PostgresWAL reads need psycopg_pool: pip install 'agent-saga[postgres]'"
                ) from exc
            self._pool = ConnectionPool(
                self._dsn,
                min_size=1,
                max_size=4,
                open=True,
                kwargs={"autocommit": True, "connect_timeout": self._connect_timeout},
                check=ConnectionPool.check_connection,
                name="agent-saga-wal-read",
                timeout=self._stall_timeout,
            )
        cm: AbstractContextManager[Any] = self._pool.connection()
        return cm

    def _release(self) -> None:
        for obj in (self._conn, self._pool):
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    pass

