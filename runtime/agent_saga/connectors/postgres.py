"""PostgreSQL connector (COMPENSABLE): update, insert and delete rows, undone exactly.

    from agent_saga.connectors import postgres as pg

    row = await pg.update(saga, credential_ref="orders_db", table="shop.orders",
                          key={"tenant": "t1", "order_id": 42}, values={"status": "cancelled"})

``credential_ref`` resolves (``set_credential_resolver``) to a libpq connection string or
``{"dsn": ...}``. Every call is one statement on an autocommit connection: the affected
columns are read and changed in the same round trip (``WITH old AS (SELECT ... FOR
UPDATE) UPDATE ... RETURNING``), so no transaction is held open across the model's
thinking time. ``key`` must name the table's whole primary key (compound keys are
ordinary); values travel as JSON and are cast by PostgreSQL (``jsonb_populate_record``).

=========== ================================ ============================================
tool         compensation (and reconciler)    undo
=========== ================================ ============================================
postgres.update  postgres.restore_row          put the old values of the changed columns back
postgres.insert  postgres.delete_inserted_row  delete the inserted row
postgres.delete  postgres.reinsert_row         insert the deleted row again
=========== ================================ ============================================

A compensation acts only if no concurrent writer touched the row since the step (the
row's ``xmin`` is the one the step left), or if the row is already as the undo would
leave it (a replay). Otherwise it changes nothing and raises ``Indeterminate``: recovery
escalates the step instead of overwriting someone else's write. A restore whose result
differs from the snapshot (a ``BEFORE UPDATE`` trigger rewrote it) raises too.

The reconcilers re-read the row and compare it with what the undo should have left:
a trigger that rewrote the restored value, a row that came back with other values, a row
that is gone, or an inserted row still present are reported as not reversed.

The saga steps (``update``, ``insert``, ``delete``) use psycopg's async API on the event
loop (``*_row_async``), so a step occupies no tool-pool thread; ``AGENT_SAGA_PG_DRIVER=thread``
pins the sync API on the tool pool instead. The compensations and reconcilers are sync
functions (the recovery daemon and the rollback run them on the tool pool).

Invariants: psycopg is imported when this module is; ``import agent_saga`` never imports
it. Connection strings are never written to the log or into error messages.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from ..compensation import Compensation, compensator
from ..errors import ConfigurationError
from ..recovery.reconcilers import Observation, reconciler
from ..semantics import ActionSemantics
from ._common import Indeterminate, credential_fields

__all__ = [
    "ENV_PG_DRIVER", "delete", "delete_inserted_row", "delete_row", "delete_row_async", "driver", "insert",
    "insert_row", "insert_row_async", "reinsert_row", "restore_row", "update", "update_row", "update_row_async",
]

APPLICATION_NAME = "agent-saga-connector"
#: ``async`` (default) or ``thread``: how the saga steps reach PostgreSQL (``driver()``).
ENV_PG_DRIVER = "AGENT_SAGA_PG_DRIVER"
CONNECT_TIMEOUT = 10


# ------------------------------------------------------------------------- plumbing
def _connect(credential_ref: str) -> psycopg.Connection[Any]:
    dsn = credential_fields(credential_ref, "PostgreSQL", ("dsn",), plain="dsn")["dsn"]
    return psycopg.connect(dsn, autocommit=True, application_name=APPLICATION_NAME, connect_timeout=CONNECT_TIMEOUT)


def _table(name: str) -> sql.Composable:
    if not isinstance(name, str) or not name or name.count(".") > 1:
        raise ConfigurationError(f"table {name!r} is not valid: give 'table' or 'schema.table'")
    return sql.Identifier(*name.split("."))


def _columns(what: str, cols: Mapping[str, Any]) -> list[str]:
    if not isinstance(cols, Mapping) or not cols or not all(isinstance(c, str) and c for c in cols):
        raise ConfigurationError(f"{what} must be a non-empty mapping of column name -> value, got {cols!r}")
    return list(cols)


_PK_QUERY = (
    "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
    "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
    "ORDER BY array_position(i.indkey, a.attnum)"
)


def _pk_of(table: str, rows: list[Any]) -> list[str]:
    if not rows:
        raise ConfigurationError(f"table {table!r} has no primary key: the PostgreSQL connector undoes rows by primary key")
    return [r[0] for r in rows]


def _primary_key(conn: psycopg.Connection[Any], table: str) -> list[str]:
    return _pk_of(table, conn.execute(_PK_QUERY, (table,)).fetchall())


def _key_matches(table: str, key: Mapping[str, Any], pk: list[str]) -> list[str]:
    cols = _columns("key", key)
    if set(cols) != set(pk):
        raise ConfigurationError(f"key names columns {sorted(cols)} but the primary key of {table!r} is {list(pk)}: give every primary-key column, and only those")
    return list(pk)


def _check_key(conn: psycopg.Connection[Any], table: str, key: Mapping[str, Any]) -> list[str]:
    return _key_matches(table, key, _primary_key(conn, table))


def _json_object(alias: str, cols: list[str]) -> sql.Composable:
    """``jsonb_build_object('c', alias.c, ...)``."""
    parts = [sql.SQL("{}, {}.{}").format(sql.Literal(c), sql.Identifier(alias), sql.Identifier(c)) for c in cols]
    return sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(parts))


def _match(left: str, right: str, cols: list[str]) -> sql.Composable:
    """``left.k1 = right.k1 AND ...``."""
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}.{}").format(sql.Identifier(left), sql.Identifier(c), sql.Identifier(right), sql.Identifier(c))
        for c in cols
    )


def _record(tbl: sql.Composable, alias: str) -> sql.Composable:
    """``jsonb_populate_record(NULL::tbl, %s::jsonb) AS alias``: JSON cast to the row type."""
    return sql.SQL("jsonb_populate_record(NULL::{}, %s::jsonb) AS {}").format(tbl, sql.Identifier(alias))


def _read(conn: psycopg.Connection[Any], table: str, key: Mapping[str, Any], cols: list[str] | None) -> dict[str, Any] | None:
    tbl, pk = _table(table), list(key)
    what = sql.SQL("to_jsonb(t.*)") if cols is None else _json_object("t", cols)
    q = sql.SQL("SELECT {} FROM {} AS t, {} WHERE {}").format(what, tbl, _record(tbl, "k"), _match("t", "k", pk))
    row = conn.execute(q, (json.dumps(dict(key)),)).fetchone()
    return None if row is None else dict(row[0])


def _differs(want: Mapping[str, Any], seen: Mapping[str, Any]) -> list[str]:
    return [f"{c}={seen.get(c)!r} (expected {v!r})" for c, v in want.items() if seen.get(c) != v]


# ------------------------------------------------------------------------- forward calls
def update_row(*, credential_ref: str, table: str, key: Mapping[str, Any], values: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Set ``values`` on the row ``key``; return ``{table, key, before, after, xmin}``.

    One statement: the old values of the changed columns are read under a row lock and
    returned with the new ones. Raises ``LookupError`` if there is no such row (nothing
    changed), ``ConfigurationError`` for a key that is not the primary key.
    """
    cols = _columns("values", values)
    tbl = _table(table)
    with _connect(credential_ref) as conn:
        pk = _check_key(conn, table, key)
        return _update(conn, tbl, table, pk, key, cols, values)


def _update_query(tbl: sql.Composable, pk: list[str], cols: list[str]) -> sql.Composed:
    sets = sql.SQL(", ").join(sql.SQL("{} = v.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in cols)
    return sql.SQL(
        "WITH old AS (SELECT t.* FROM {tbl} AS t, {k} WHERE {kmatch} FOR UPDATE OF t) "
        "UPDATE {tbl} AS cur SET {sets} FROM old, {v} WHERE {omatch} "
        "RETURNING {before}, {after}, cur.xmin::text"
    ).format(
        tbl=tbl, k=_record(tbl, "k"), kmatch=_match("t", "k", pk), sets=sets, v=_record(tbl, "v"),
        omatch=_match("cur", "old", pk), before=_json_object("old", cols), after=_json_object("cur", cols),
    )


def _updated(table: str, key: Mapping[str, Any], row: Any) -> dict[str, Any]:
    if row is None:
        raise LookupError(f"no row of {table} has key {dict(key)!r}: nothing was updated")
    return {"table": table, "key": dict(key), "before": row[0], "after": row[1], "xmin": row[2]}


def _update(
    conn: psycopg.Connection[Any], tbl: sql.Composable, table: str, pk: list[str],
    key: Mapping[str, Any], cols: list[str], values: Mapping[str, Any],
) -> dict[str, Any]:
    row = conn.execute(_update_query(tbl, pk, cols), (json.dumps(dict(key)), json.dumps(dict(values)))).fetchone()
    return _updated(table, key, row)


def _insert_query(tbl: sql.Composable, pk: list[str], cols: list[str]) -> sql.Composed:
    return sql.SQL("INSERT INTO {tbl} AS cur ({cols}) SELECT {vals} FROM {v} RETURNING {key}, to_jsonb(cur.*), cur.xmin::text").format(
        tbl=tbl, cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
        vals=sql.SQL(", ").join(sql.SQL("v.{}").format(sql.Identifier(c)) for c in cols),
        v=_record(tbl, "v"), key=_json_object("cur", pk),
    )


def _inserted(table: str, row: Any) -> dict[str, Any]:
    assert row is not None  # INSERT ... SELECT of one record returns one row or raises
    return {"table": table, "key": row[0], "row": row[1], "xmin": row[2]}


def insert_row(*, credential_ref: str, table: str, values: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Insert ``values`` (other columns take their defaults); return ``{table, key, row, xmin}``."""
    cols = _columns("values", values)
    tbl = _table(table)
    with _connect(credential_ref) as conn:
        pk = _primary_key(conn, table)
        row = conn.execute(_insert_query(tbl, pk, cols), (json.dumps(dict(values)),)).fetchone()
    return _inserted(table, row)


def _delete_query(tbl: sql.Composable, pk: list[str]) -> sql.Composed:
    return sql.SQL("DELETE FROM {tbl} AS t USING {k} WHERE {m} RETURNING to_jsonb(t.*)").format(
        tbl=tbl, k=_record(tbl, "k"), m=_match("t", "k", pk),
    )


def _deleted(table: str, key: Mapping[str, Any], row: Any) -> dict[str, Any]:
    if row is None:
        raise LookupError(f"no row of {table} has key {dict(key)!r}: nothing was deleted")
    return {"table": table, "key": dict(key), "row": row[0]}


def delete_row(*, credential_ref: str, table: str, key: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Delete the row ``key``; return ``{table, key, row}`` (the whole row, to put back).
    Raises ``LookupError`` if there is no such row."""
    tbl = _table(table)
    with _connect(credential_ref) as conn:
        pk = _check_key(conn, table, key)
        row = conn.execute(_delete_query(tbl, pk), (json.dumps(dict(key)),)).fetchone()
    return _deleted(table, key, row)


# ------------------------------------------------------------------------- the same, async
# psycopg's async API: the saga's steps run on the event loop, not the tool pool
# (AGENT_SAGA_PG_DRIVER=thread runs the sync functions above on the pool instead).
async def _aconnect(credential_ref: str) -> psycopg.AsyncConnection[Any]:
    dsn = credential_fields(credential_ref, "PostgreSQL", ("dsn",), plain="dsn")["dsn"]
    return await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, application_name=APPLICATION_NAME, connect_timeout=CONNECT_TIMEOUT)


async def _apk(conn: psycopg.AsyncConnection[Any], table: str) -> list[str]:
    return _pk_of(table, await (await conn.execute(_PK_QUERY, (table,))).fetchall())


async def update_row_async(*, credential_ref: str, table: str, key: Mapping[str, Any], values: Mapping[str, Any],
                           **_: Any) -> dict[str, Any]:
    """``update_row`` over psycopg's async API."""
    cols, tbl = _columns("values", values), _table(table)
    async with await _aconnect(credential_ref) as conn:
        pk = _key_matches(table, key, await _apk(conn, table))
        cur = await conn.execute(_update_query(tbl, pk, cols), (json.dumps(dict(key)), json.dumps(dict(values))))
        return _updated(table, key, await cur.fetchone())


async def insert_row_async(*, credential_ref: str, table: str, values: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """``insert_row`` over psycopg's async API."""
    cols, tbl = _columns("values", values), _table(table)
    async with await _aconnect(credential_ref) as conn:
        pk = await _apk(conn, table)
        cur = await conn.execute(_insert_query(tbl, pk, cols), (json.dumps(dict(values)),))
        return _inserted(table, await cur.fetchone())


async def delete_row_async(*, credential_ref: str, table: str, key: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """``delete_row`` over psycopg's async API."""
    tbl = _table(table)
    async with await _aconnect(credential_ref) as conn:
        pk = _key_matches(table, key, await _apk(conn, table))
        cur = await conn.execute(_delete_query(tbl, pk), (json.dumps(dict(key)),))
        return _deleted(table, key, await cur.fetchone())


def driver() -> str:
    """``async`` (psycopg's async API on the event loop, the default) or ``thread`` (the
    sync API on the tool pool), from ``$AGENT_SAGA_PG_DRIVER``."""
    value = os.environ.get(ENV_PG_DRIVER, "").strip().lower() or "async"
    if value not in ("async", "thread"):
        raise ConfigurationError(f"{ENV_PG_DRIVER} must be 'async' or 'thread', got {value!r}")
    return value


# ------------------------------------------------------------------------- compensations
@compensator("postgres.restore_row")
def restore_row(
    *, credential_ref: str, table: str, key: Mapping[str, Any], before: Mapping[str, Any], xmin: str, **_: Any
) -> str:
    """Put ``before`` back if the row is as the step left it (see the module doc)."""
    tbl, pk, cols = _table(table), list(key), _columns("before", before)
    sets = sql.SQL(", ").join(sql.SQL("{} = b.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in cols)
    q = sql.SQL("UPDATE {tbl} AS t SET {sets} FROM {k}, {b} WHERE {m} AND t.xmin::text = %s RETURNING {now}").format(
        tbl=tbl, sets=sets, k=_record(tbl, "k"), b=_record(tbl, "b"), m=_match("t", "k", pk), now=_json_object("t", cols),
    )
    with _connect(credential_ref) as conn:
        row = conn.execute(q, (json.dumps(dict(key)), json.dumps(dict(before)), xmin)).fetchone()
        if row is not None:
            wrong = _differs(before, row[0])
            if wrong:
                raise Indeterminate(f"restored {table} {dict(key)!r} but the row now reads {', '.join(wrong)}: a trigger rewrote it")
            return "restored"
        seen = _read(conn, table, key, cols)
    if seen is None:
        raise Indeterminate(f"row {dict(key)!r} of {table} is gone: it was deleted after the step; nothing restored")
    if not _differs(before, seen):
        return "already restored"
    raise Indeterminate(
        f"row {dict(key)!r} of {table} was changed by another writer after the step; not overwriting it "
        f"(now {', '.join(_differs(before, seen))})"
    )


@compensator("postgres.delete_inserted_row")
def delete_inserted_row(*, credential_ref: str, table: str, key: Mapping[str, Any], xmin: str, **_: Any) -> str:
    """Delete the inserted row if nobody changed it since (see the module doc)."""
    tbl, pk = _table(table), list(key)
    q = sql.SQL("DELETE FROM {tbl} AS t USING {k} WHERE {m} AND t.xmin::text = %s").format(
        tbl=tbl, k=_record(tbl, "k"), m=_match("t", "k", pk),
    )
    with _connect(credential_ref) as conn:
        if conn.execute(q, (json.dumps(dict(key)), xmin)).rowcount == 1:
            return "deleted"
        seen = _read(conn, table, key, None)
    if seen is None:
        return "already deleted"
    raise Indeterminate(f"the inserted row {dict(key)!r} of {table} was changed by another writer; not deleting it")


@compensator("postgres.reinsert_row")
def reinsert_row(*, credential_ref: str, table: str, key: Mapping[str, Any], row: Mapping[str, Any], **_: Any) -> str:
    """Insert the deleted ``row`` again, unless another row took its key."""
    tbl = _table(table)
    cols = _columns("row", row)
    q = sql.SQL("INSERT INTO {tbl} ({cols}) SELECT {vals} FROM {r} ON CONFLICT DO NOTHING").format(
        tbl=tbl, cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
        vals=sql.SQL(", ").join(sql.SQL("r.{}").format(sql.Identifier(c)) for c in cols), r=_record(tbl, "r"),
    )
    with _connect(credential_ref) as conn:
        if conn.execute(q, (json.dumps(dict(row)),)).rowcount == 1:
            return "reinserted"
        seen = _read(conn, table, key, None)
    if seen is not None and not _differs(row, seen):
        return "already reinserted"
    raise Indeterminate(f"another row took key {dict(key)!r} of {table} after the delete; not reinserting over it")


# ------------------------------------------------------------------------- reconcilers
@reconciler("postgres.restore_row")
def observe_restore(*, credential_ref: str, table: str, key: Mapping[str, Any], before: Mapping[str, Any], **_: Any) -> Observation:
    """Is the row back to ``before`` in the changed columns?"""
    with _connect(credential_ref) as conn:
        seen = _read(conn, table, key, list(before))
    if seen is None:
        return Observation(reversed_=False, exists=False, detail=f"row {dict(key)!r} is gone: nothing to restore into")
    wrong = _differs(before, seen)
    if wrong:
        return Observation(reversed_=False, exists=True, detail="not restored: " + ", ".join(wrong))
    return Observation(reversed_=True, exists=True, detail="restored")


@reconciler("postgres.delete_inserted_row")
def observe_delete_inserted(*, credential_ref: str, table: str, key: Mapping[str, Any], **_: Any) -> Observation:
    """Is the inserted row gone?"""
    with _connect(credential_ref) as conn:
        seen = _read(conn, table, key, None)
    if seen is None:
        return Observation(reversed_=True, exists=True, detail="the inserted row is gone")
    return Observation(reversed_=False, exists=True, detail=f"the inserted row {dict(key)!r} is still there")


@reconciler("postgres.reinsert_row")
def observe_reinsert(*, credential_ref: str, table: str, key: Mapping[str, Any], row: Mapping[str, Any], **_: Any) -> Observation:
    """Is the deleted row back, with the values it had?"""
    with _connect(credential_ref) as conn:
        seen = _read(conn, table, key, None)
    if seen is None:
        return Observation(reversed_=False, exists=True, detail=f"row {dict(key)!r} is still deleted")
    wrong = _differs(row, seen)
    if wrong:
        return Observation(reversed_=False, exists=True, detail="came back with wrong values: " + ", ".join(wrong))
    return Observation(reversed_=True, exists=True, detail="reinserted")


# ------------------------------------------------------------------------- saga steps
_STEPS: dict[str, tuple[Any, Any, str, tuple[str, ...]]] = {
    # tool: (forward call, its async twin, compensation handler, the result fields its kwargs take)
    "postgres.update": (update_row, update_row_async, "postgres.restore_row", ("key", "before", "after", "xmin")),
    "postgres.insert": (insert_row, insert_row_async, "postgres.delete_inserted_row", ("key", "xmin")),
    "postgres.delete": (delete_row, delete_row_async, "postgres.reinsert_row", ("key", "row")),
}


async def _step(saga: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    sync_forward, async_forward, handler, carried = _STEPS[tool]
    forward = functools.partial(async_forward if driver() == "async" else sync_forward, **args)
    base = {"credential_ref": args["credential_ref"], "table": args["table"]}
    return await saga.execute(  # type: ignore[no-any-return]
        tool, ActionSemantics.COMPENSABLE, forward,
        lambda r: None if r is None else Compensation(
            handler=handler, description=f"{handler} {args['table']} {r['key']}",
            kwargs={**base, **{k: r[k] for k in carried}},
        ),
        policy_args=args,
    )


async def update(saga: Any, *, credential_ref: str, table: str, key: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``update_row`` as a COMPENSABLE saga step (tool ``postgres.update``)."""
    return await _step(saga, "postgres.update", {"credential_ref": credential_ref, "table": table, "key": dict(key), "values": dict(values)})


async def insert(saga: Any, *, credential_ref: str, table: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``insert_row`` as a COMPENSABLE saga step (tool ``postgres.insert``)."""
    return await _step(saga, "postgres.insert", {"credential_ref": credential_ref, "table": table, "values": dict(values)})


async def delete(saga: Any, *, credential_ref: str, table: str, key: Mapping[str, Any]) -> dict[str, Any]:
    """``delete_row`` as a COMPENSABLE saga step (tool ``postgres.delete``)."""
    return await _step(saga, "postgres.delete", {"credential_ref": credential_ref, "table": table, "key": dict(key)})
