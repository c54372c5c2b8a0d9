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

The saga steps (``update``, ``insert``, ``delete``), the compensations and the reconcilers
use psycopg's async API on the event loop: the registered handlers are the ``*_async``
functions, so neither a rollback, the recovery daemon nor ``agent-saga reconcile`` takes a
pool thread for them. ``AGENT_SAGA_PG_DRIVER=thread`` pins psycopg's sync API on the tool
pool instead (nothing else picks the driver: an installed asyncpg changes nothing). Each
call's logic is written once, as a plan (``_common``), and run over either API; the plain
sync functions (``update_row``, ``restore_row``, ``observe_restore``, ...) stay for sync code.

Invariants: psycopg is imported when this module is; ``import agent_saga`` never imports
it. Connection strings are never written to the log or into error messages.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from ..compensation import Compensation, compensator
from ..errors import ConfigurationError
from ..executor import get_tool_executor
from ..recovery.reconcilers import Observation, reconciler
from ..semantics import ActionSemantics
from ._common import Indeterminate, Plan, arun_plan, credential_fields, first_request, run_plan

__all__ = [
    "ENV_PG_DRIVER", "delete", "delete_inserted_row", "delete_inserted_row_async", "delete_row", "delete_row_async",
    "driver", "insert", "insert_row", "insert_row_async", "observe_delete_inserted", "observe_delete_inserted_async",
    "observe_reinsert", "observe_reinsert_async", "observe_restore", "observe_restore_async", "reinsert_row",
    "reinsert_row_async", "restore_row", "restore_row_async", "update", "update_row", "update_row_async",
]

T = TypeVar("T")

APPLICATION_NAME = "agent-saga-connector"
#: ``async`` (default) or ``thread``: how the saga steps reach PostgreSQL (``driver()``).
ENV_PG_DRIVER = "AGENT_SAGA_PG_DRIVER"
CONNECT_TIMEOUT = 10


# ------------------------------------------------------------------------- plumbing
# A call's logic is a plan (``_common``): it yields ``(kind, query, params)`` - kind "one"
# (the first row), "all" (every row) or "count" (the rowcount) - and receives the answer.
# ``_run`` answers it over psycopg's sync API, ``_arun`` over its async API.
def _dsn(credential_ref: str) -> str:
    return str(credential_fields(credential_ref, "PostgreSQL", ("dsn",), plain="dsn")["dsn"])


def _answer(conn: psycopg.Connection[Any], req: tuple[str, Any, Any]) -> Any:
    kind, query, params = req
    cur = conn.execute(query, params)
    return cur.rowcount if kind == "count" else cur.fetchone() if kind == "one" else cur.fetchall()


async def _aanswer(conn: psycopg.AsyncConnection[Any], req: tuple[str, Any, Any]) -> Any:
    kind, query, params = req
    cur = await conn.execute(query, params)
    return cur.rowcount if kind == "count" else await cur.fetchone() if kind == "one" else await cur.fetchall()


def _run(credential_ref: str, plan: Plan[T]) -> T:
    """``plan`` over one autocommit connection of psycopg's sync API."""
    done, first = first_request(plan)
    if done:
        return first  # type: ignore[no-any-return]
    with psycopg.connect(_dsn(credential_ref), autocommit=True, application_name=APPLICATION_NAME,
                         connect_timeout=CONNECT_TIMEOUT) as conn:
        return run_plan(plan, first, functools.partial(_answer, conn))


async def _arun(credential_ref: str, plan: Plan[T]) -> T:
    """``plan`` over one autocommit connection of psycopg's async API, on the event loop."""
    done, first = first_request(plan)
    if done:
        return first  # type: ignore[no-any-return]
    conn = await psycopg.AsyncConnection.connect(
        _dsn(credential_ref), autocommit=True, application_name=APPLICATION_NAME, connect_timeout=CONNECT_TIMEOUT)
    async with conn:
        return await arun_plan(plan, first, functools.partial(_aanswer, conn))


async def _handler(credential_ref: str, plan: Plan[T]) -> T:
    """A compensation's or reconciler's plan where the driver says: on the event loop
    (``async``), or on the process's tool pool over the sync API (``thread``)."""
    if driver() == "thread":
        return await get_tool_executor().submit(_run, {"credential_ref": credential_ref, "plan": plan})  # type: ignore[no-any-return]
    return await _arun(credential_ref, plan)


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


def _primary_key(table: str) -> Plan[list[str]]:
    rows = yield "all", _PK_QUERY, (table,)
    if not rows:
        raise ConfigurationError(f"table {table!r} has no primary key: the PostgreSQL connector undoes rows by primary key")
    return [r[0] for r in rows]


def _check_key(table: str, key: Mapping[str, Any]) -> Plan[list[str]]:
    """The primary key of ``table``, which ``key`` must name exactly."""
    pk = yield from _primary_key(table)
    cols = _columns("key", key)
    if set(cols) != set(pk):
        raise ConfigurationError(f"key names columns {sorted(cols)} but the primary key of {table!r} is {list(pk)}: give every primary-key column, and only those")
    return pk


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


def _read(table: str, key: Mapping[str, Any], cols: list[str] | None) -> Plan[dict[str, Any] | None]:
    tbl, pk = _table(table), list(key)
    what = sql.SQL("to_jsonb(t.*)") if cols is None else _json_object("t", cols)
    q = sql.SQL("SELECT {} FROM {} AS t, {} WHERE {}").format(what, tbl, _record(tbl, "k"), _match("t", "k", pk))
    row = yield "one", q, (json.dumps(dict(key)),)
    return None if row is None else dict(row[0])


def _differs(want: Mapping[str, Any], seen: Mapping[str, Any]) -> list[str]:
    return [f"{c}={seen.get(c)!r} (expected {v!r})" for c, v in want.items() if seen.get(c) != v]


# ------------------------------------------------------------------------- forward calls
def _update(table: str, key: Mapping[str, Any], values: Mapping[str, Any]) -> Plan[dict[str, Any]]:
    cols, tbl = _columns("values", values), _table(table)
    pk = yield from _check_key(table, key)
    sets = sql.SQL(", ").join(sql.SQL("{} = v.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in cols)
    q = sql.SQL(
        "WITH old AS (SELECT t.* FROM {tbl} AS t, {k} WHERE {kmatch} FOR UPDATE OF t) "
        "UPDATE {tbl} AS cur SET {sets} FROM old, {v} WHERE {omatch} "
        "RETURNING {before}, {after}, cur.xmin::text"
    ).format(
        tbl=tbl, k=_record(tbl, "k"), kmatch=_match("t", "k", pk), sets=sets, v=_record(tbl, "v"),
        omatch=_match("cur", "old", pk), before=_json_object("old", cols), after=_json_object("cur", cols),
    )
    row = yield "one", q, (json.dumps(dict(key)), json.dumps(dict(values)))
    if row is None:
        raise LookupError(f"no row of {table} has key {dict(key)!r}: nothing was updated")
    return {"table": table, "key": dict(key), "before": row[0], "after": row[1], "xmin": row[2]}


def _insert(table: str, values: Mapping[str, Any]) -> Plan[dict[str, Any]]:
    cols, tbl = _columns("values", values), _table(table)
    pk = yield from _primary_key(table)
    q = sql.SQL("INSERT INTO {tbl} AS cur ({cols}) SELECT {vals} FROM {v} RETURNING {key}, to_jsonb(cur.*), cur.xmin::text").format(
        tbl=tbl, cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
        vals=sql.SQL(", ").join(sql.SQL("v.{}").format(sql.Identifier(c)) for c in cols),
        v=_record(tbl, "v"), key=_json_object("cur", pk),
    )
    row = yield "one", q, (json.dumps(dict(values)),)
    assert row is not None  # INSERT ... SELECT of one record returns one row or raises
    return {"table": table, "key": row[0], "row": row[1], "xmin": row[2]}


def _delete(table: str, key: Mapping[str, Any]) -> Plan[dict[str, Any]]:
    tbl = _table(table)
    pk = yield from _check_key(table, key)
    q = sql.SQL("DELETE FROM {tbl} AS t USING {k} WHERE {m} RETURNING to_jsonb(t.*)").format(
        tbl=tbl, k=_record(tbl, "k"), m=_match("t", "k", pk),
    )
    row = yield "one", q, (json.dumps(dict(key)),)
    if row is None:
        raise LookupError(f"no row of {table} has key {dict(key)!r}: nothing was deleted")
    return {"table": table, "key": dict(key), "row": row[0]}


def update_row(*, credential_ref: str, table: str, key: Mapping[str, Any], values: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Set ``values`` on the row ``key``; return ``{table, key, before, after, xmin}``.

    One statement: the old values of the changed columns are read under a row lock and
    returned with the new ones. Raises ``LookupError`` if there is no such row (nothing
    changed), ``ConfigurationError`` for a key that is not the primary key.
    """
    return _run(credential_ref, _update(table, key, values))


def insert_row(*, credential_ref: str, table: str, values: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Insert ``values`` (other columns take their defaults); return ``{table, key, row, xmin}``."""
    return _run(credential_ref, _insert(table, values))


def delete_row(*, credential_ref: str, table: str, key: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Delete the row ``key``; return ``{table, key, row}`` (the whole row, to put back).
    Raises ``LookupError`` if there is no such row."""
    return _run(credential_ref, _delete(table, key))


async def update_row_async(*, credential_ref: str, table: str, key: Mapping[str, Any], values: Mapping[str, Any],
                           **_: Any) -> dict[str, Any]:
    """``update_row`` over psycopg's async API."""
    return await _arun(credential_ref, _update(table, key, values))


async def insert_row_async(*, credential_ref: str, table: str, values: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """``insert_row`` over psycopg's async API."""
    return await _arun(credential_ref, _insert(table, values))


async def delete_row_async(*, credential_ref: str, table: str, key: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """``delete_row`` over psycopg's async API."""
    return await _arun(credential_ref, _delete(table, key))


def driver() -> str:
    """``async`` (psycopg's async API on the event loop, the default) or ``thread`` (the
    sync API on the tool pool), from ``$AGENT_SAGA_PG_DRIVER``. Only this variable picks
    the driver: another PostgreSQL client being installed (asyncpg) changes nothing."""
    value = os.environ.get(ENV_PG_DRIVER, "").strip().lower() or "async"
    if value not in ("async", "thread"):
        raise ConfigurationError(
            f"{ENV_PG_DRIVER} must be 'async' or 'thread', got {value!r}: 'async' is psycopg's async API "
            f"on the event loop (the default), 'thread' its sync API on the tool pool")
    return value


# ------------------------------------------------------------------------- compensations
def _restore(table: str, key: Mapping[str, Any], before: Mapping[str, Any], xmin: str) -> Plan[str]:
    tbl, pk, cols = _table(table), list(key), _columns("before", before)
    sets = sql.SQL(", ").join(sql.SQL("{} = b.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in cols)
    q = sql.SQL("UPDATE {tbl} AS t SET {sets} FROM {k}, {b} WHERE {m} AND t.xmin::text = %s RETURNING {now}").format(
        tbl=tbl, sets=sets, k=_record(tbl, "k"), b=_record(tbl, "b"), m=_match("t", "k", pk), now=_json_object("t", cols),
    )
    row = yield "one", q, (json.dumps(dict(key)), json.dumps(dict(before)), xmin)
    if row is not None:
        wrong = _differs(before, row[0])
        if wrong:
            raise Indeterminate(f"restored {table} {dict(key)!r} but the row now reads {', '.join(wrong)}: a trigger rewrote it")
        return "restored"
    seen = yield from _read(table, key, cols)
    if seen is None:
        raise Indeterminate(f"row {dict(key)!r} of {table} is gone: it was deleted after the step; nothing restored")
    if not _differs(before, seen):
        return "already restored"
    raise Indeterminate(
        f"row {dict(key)!r} of {table} was changed by another writer after the step; not overwriting it "
        f"(now {', '.join(_differs(before, seen))})"
    )


def _delete_inserted(table: str, key: Mapping[str, Any], xmin: str) -> Plan[str]:
    tbl, pk = _table(table), list(key)
    q = sql.SQL("DELETE FROM {tbl} AS t USING {k} WHERE {m} AND t.xmin::text = %s").format(
        tbl=tbl, k=_record(tbl, "k"), m=_match("t", "k", pk),
    )
    if (yield "count", q, (json.dumps(dict(key)), xmin)) == 1:
        return "deleted"
    if (yield from _read(table, key, None)) is None:
        return "already deleted"
    raise Indeterminate(f"the inserted row {dict(key)!r} of {table} was changed by another writer; not deleting it")


def _reinsert(table: str, key: Mapping[str, Any], row: Mapping[str, Any]) -> Plan[str]:
    tbl, cols = _table(table), _columns("row", row)
    q = sql.SQL("INSERT INTO {tbl} ({cols}) SELECT {vals} FROM {r} ON CONFLICT DO NOTHING").format(
        tbl=tbl, cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
        vals=sql.SQL(", ").join(sql.SQL("r.{}").format(sql.Identifier(c)) for c in cols), r=_record(tbl, "r"),
    )
    if (yield "count", q, (json.dumps(dict(row)),)) == 1:
        return "reinserted"
    seen = yield from _read(table, key, None)
    if seen is not None and not _differs(row, seen):
        return "already reinserted"
    raise Indeterminate(f"another row took key {dict(key)!r} of {table} after the delete; not reinserting over it")


def restore_row(
    *, credential_ref: str, table: str, key: Mapping[str, Any], before: Mapping[str, Any], xmin: str, **_: Any
) -> str:
    """Put ``before`` back if the row is as the step left it (see the module doc)."""
    return _run(credential_ref, _restore(table, key, before, xmin))


def delete_inserted_row(*, credential_ref: str, table: str, key: Mapping[str, Any], xmin: str, **_: Any) -> str:
    """Delete the inserted row if nobody changed it since (see the module doc)."""
    return _run(credential_ref, _delete_inserted(table, key, xmin))


def reinsert_row(*, credential_ref: str, table: str, key: Mapping[str, Any], row: Mapping[str, Any], **_: Any) -> str:
    """Insert the deleted ``row`` again, unless another row took its key."""
    return _run(credential_ref, _reinsert(table, key, row))


@compensator("postgres.restore_row")
async def restore_row_async(
    *, credential_ref: str, table: str, key: Mapping[str, Any], before: Mapping[str, Any], xmin: str, **_: Any
) -> str:
    """``restore_row`` as the registered compensation: on the event loop (module doc)."""
    return await _handler(credential_ref, _restore(table, key, before, xmin))


@compensator("postgres.delete_inserted_row")
async def delete_inserted_row_async(*, credential_ref: str, table: str, key: Mapping[str, Any], xmin: str, **_: Any) -> str:
    """``delete_inserted_row`` as the registered compensation: on the event loop."""
    return await _handler(credential_ref, _delete_inserted(table, key, xmin))


@compensator("postgres.reinsert_row")
async def reinsert_row_async(*, credential_ref: str, table: str, key: Mapping[str, Any], row: Mapping[str, Any], **_: Any) -> str:
    """``reinsert_row`` as the registered compensation: on the event loop."""
    return await _handler(credential_ref, _reinsert(table, key, row))


# ------------------------------------------------------------------------- reconcilers
def _observe_restore(table: str, key: Mapping[str, Any], before: Mapping[str, Any]) -> Plan[Observation]:
    seen = yield from _read(table, key, list(before))
    if seen is None:
        return Observation(reversed_=False, exists=False, detail=f"row {dict(key)!r} is gone: nothing to restore into")
    wrong = _differs(before, seen)
    if wrong:
        return Observation(reversed_=False, exists=True, detail="not restored: " + ", ".join(wrong))
    return Observation(reversed_=True, exists=True, detail="restored")


def _observe_delete_inserted(table: str, key: Mapping[str, Any]) -> Plan[Observation]:
    if (yield from _read(table, key, None)) is None:
        return Observation(reversed_=True, exists=True, detail="the inserted row is gone")
    return Observation(reversed_=False, exists=True, detail=f"the inserted row {dict(key)!r} is still there")


def _observe_reinsert(table: str, key: Mapping[str, Any], row: Mapping[str, Any]) -> Plan[Observation]:
    seen = yield from _read(table, key, None)
    if seen is None:
        return Observation(reversed_=False, exists=True, detail=f"row {dict(key)!r} is still deleted")
    wrong = _differs(row, seen)
    if wrong:
        return Observation(reversed_=False, exists=True, detail="came back with wrong values: " + ", ".join(wrong))
    return Observation(reversed_=True, exists=True, detail="reinserted")


def observe_restore(*, credential_ref: str, table: str, key: Mapping[str, Any], before: Mapping[str, Any], **_: Any) -> Observation:
    """Is the row back to ``before`` in the changed columns?"""
    return _run(credential_ref, _observe_restore(table, key, before))


def observe_delete_inserted(*, credential_ref: str, table: str, key: Mapping[str, Any], **_: Any) -> Observation:
    """Is the inserted row gone?"""
    return _run(credential_ref, _observe_delete_inserted(table, key))


def observe_reinsert(*, credential_ref: str, table: str, key: Mapping[str, Any], row: Mapping[str, Any], **_: Any) -> Observation:
    """Is the deleted row back, with the values it had?"""
    return _run(credential_ref, _observe_reinsert(table, key, row))


@reconciler("postgres.restore_row")
async def observe_restore_async(
    *, credential_ref: str, table: str, key: Mapping[str, Any], before: Mapping[str, Any], **_: Any
) -> Observation:
    """``observe_restore`` as the registered reconciler: on the event loop."""
    return await _handler(credential_ref, _observe_restore(table, key, before))


@reconciler("postgres.delete_inserted_row")
async def observe_delete_inserted_async(*, credential_ref: str, table: str, key: Mapping[str, Any], **_: Any) -> Observation:
    """``observe_delete_inserted`` as the registered reconciler: on the event loop."""
    return await _handler(credential_ref, _observe_delete_inserted(table, key))


@reconciler("postgres.reinsert_row")
async def observe_reinsert_async(
    *, credential_ref: str, table: str, key: Mapping[str, Any], row: Mapping[str, Any], **_: Any
) -> Observation:
    """``observe_reinsert`` as the registered reconciler: on the event loop."""
    return await _handler(credential_ref, _observe_reinsert(table, key, row))


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
