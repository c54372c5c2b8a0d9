"""The PostgreSQL connector against the real server the suite starts.

Compound primary keys; a concurrent writer between the step and its undo; triggers that
rewrite what the undo wrote (one the undo sees, one it cannot); a row that comes back
wrong; the connection killed mid-restore (``pg_terminate_backend``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from agent_saga import FileWAL, saga_scope
from agent_saga.connectors import Indeterminate, set_credential_resolver
from agent_saga.connectors import postgres as pg
from agent_saga.errors import ConfigurationError
from fixtures.polling import until

pytestmark = pytest.mark.integration

REF = "orders_db"
PASSWORD = "hunter2-not-in-the-log"
T = "shop.orders"
KEY = {"tenant": "t1", "id": 7}


@pytest.fixture
def db(postgres_db: str) -> Iterator[psycopg.Connection[Any]]:
    dsn = postgres_db.replace("postgres@", f"postgres:{PASSWORD}@")
    prev = set_credential_resolver(lambda ref: {"dsn": dsn} if ref == REF else None)
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shop")
        conn.execute(
            "CREATE TABLE shop.orders (tenant text, id int, status text NOT NULL, total numeric(10,2), "
            "note text DEFAULT 'none', PRIMARY KEY (tenant, id))"
        )
        conn.execute("INSERT INTO shop.orders VALUES ('t1', 7, 'open', 42.50, 'n'), ('t2', 7, 'open', 1, 'n')")
        yield conn
    set_credential_resolver(prev)


def row(conn: psycopg.Connection[Any], tenant: str = "t1", id_: int = 7) -> tuple[Any, ...] | None:
    return conn.execute("SELECT status, total::text, note FROM shop.orders WHERE tenant=%s AND id=%s", (tenant, id_)).fetchone()


def comp_kwargs(r: dict[str, Any]) -> dict[str, Any]:
    return {"credential_ref": REF, "table": T, "key": r["key"], "before": r["before"], "after": r["after"], "xmin": r["xmin"]}


def test_update_snapshots_the_changed_columns_and_restore_puts_them_back(db: psycopg.Connection[Any]) -> None:
    r = pg.update_row(credential_ref=REF, table=T, key=KEY, values={"status": "cancelled", "total": 0})
    assert r["before"] == {"status": "open", "total": 42.50} and r["after"] == {"status": "cancelled", "total": 0}
    assert row(db) == ("cancelled", "0.00", "n") and row(db, "t2") == ("open", "1.00", "n")  # compound key: one row
    assert pg.observe_restore(**comp_kwargs(r)).reversed_ is False
    assert pg.restore_row(**comp_kwargs(r)) == "restored"
    assert row(db) == ("open", "42.50", "n")
    assert pg.restore_row(**comp_kwargs(r)) == "already restored"  # a replay under the same key
    obs = pg.observe_restore(**comp_kwargs(r))
    assert (obs.reversed_, obs.exists) == (True, True)


def test_a_concurrent_writer_makes_the_restore_indeterminate_not_a_guess(db: psycopg.Connection[Any]) -> None:
    r = pg.update_row(credential_ref=REF, table=T, key=KEY, values={"status": "cancelled"})
    db.execute("UPDATE shop.orders SET note = 'someone else' WHERE tenant='t1' AND id=7")  # another writer
    with pytest.raises(Indeterminate, match="changed by another writer"):
        pg.restore_row(**comp_kwargs(r))
    assert row(db) == ("cancelled", "42.50", "someone else")  # nothing overwritten
    obs = pg.observe_restore(**comp_kwargs(r))
    assert obs.reversed_ is False and "status='cancelled' (expected 'open')" in obs.detail


def test_a_trigger_that_rewrites_the_restore_is_caught(db: psycopg.Connection[Any]) -> None:
    r = pg.update_row(credential_ref=REF, table=T, key=KEY, values={"status": "cancelled"})
    db.execute(
        "CREATE FUNCTION shop.rewrite() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.status = 'open' THEN NEW.status := 'reopened'; END IF; RETURN NEW; END $$"
    )
    db.execute("CREATE TRIGGER rewrite BEFORE UPDATE ON shop.orders FOR EACH ROW EXECUTE FUNCTION shop.rewrite()")
    with pytest.raises(Indeterminate, match="a trigger rewrote it"):
        pg.restore_row(**comp_kwargs(r))
    obs = pg.observe_restore(**comp_kwargs(r))
    assert obs.reversed_ is False and "status='reopened' (expected 'open')" in obs.detail


def test_the_reconciler_catches_a_rewrite_the_restore_could_not_see(db: psycopg.Connection[Any]) -> None:
    r = pg.update_row(credential_ref=REF, table=T, key=KEY, values={"status": "cancelled"})
    # An AFTER trigger writes again once the restore's own statement is done: RETURNING
    # showed the restored value, so the compensation reports success - a 200, not a fact.
    db.execute(
        "CREATE FUNCTION shop.later() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "UPDATE shop.orders SET status = 'archived' WHERE tenant = NEW.tenant AND id = NEW.id AND status = 'open'; "
        "RETURN NULL; END $$"
    )
    db.execute("CREATE TRIGGER later AFTER UPDATE ON shop.orders FOR EACH ROW EXECUTE FUNCTION shop.later()")
    assert pg.restore_row(**comp_kwargs(r)) == "restored"
    obs = pg.observe_restore(**comp_kwargs(r))
    assert obs.reversed_ is False and "status='archived' (expected 'open')" in obs.detail


def test_insert_is_undone_by_deleting_only_the_untouched_row(db: psycopg.Connection[Any]) -> None:
    a = pg.insert_row(credential_ref=REF, table=T, values={"tenant": "t3", "id": 1, "status": "new"})
    assert a["key"] == {"tenant": "t3", "id": 1} and a["row"]["note"] == "none"  # the default was taken
    b = pg.insert_row(credential_ref=REF, table=T, values={"tenant": "t3", "id": 2, "status": "new"})
    db.execute("UPDATE shop.orders SET status = 'paid' WHERE tenant='t3' AND id=2")
    kw = {"credential_ref": REF, "table": T}
    assert pg.delete_inserted_row(**kw, key=a["key"], xmin=a["xmin"]) == "deleted"
    assert pg.delete_inserted_row(**kw, key=a["key"], xmin=a["xmin"]) == "already deleted"
    with pytest.raises(Indeterminate, match="changed by another writer"):
        pg.delete_inserted_row(**kw, key=b["key"], xmin=b["xmin"])
    assert pg.observe_delete_inserted(**kw, key=a["key"]).reversed_ is True
    assert pg.observe_delete_inserted(**kw, key=b["key"]).reversed_ is False
    assert row(db, "t3", 2) == ("paid", None, "none")


def test_delete_is_undone_by_reinserting_and_a_row_that_came_back_wrong_is_caught(db: psycopg.Connection[Any]) -> None:
    d = pg.delete_row(credential_ref=REF, table=T, key=KEY)
    assert row(db) is None and d["row"]["total"] == 42.50
    kw = {"credential_ref": REF, "table": T, "key": d["key"], "row": d["row"]}
    assert pg.observe_reinsert(**kw).reversed_ is False
    db.execute(
        "CREATE FUNCTION shop.scrub() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "NEW.note := 'scrubbed'; RETURN NEW; END $$"
    )
    db.execute("CREATE TRIGGER scrub BEFORE INSERT ON shop.orders FOR EACH ROW EXECUTE FUNCTION shop.scrub()")
    assert pg.reinsert_row(**kw) == "reinserted"
    obs = pg.observe_reinsert(**kw)
    assert obs.reversed_ is False and "came back with wrong values: note='scrubbed' (expected 'n')" in obs.detail
    db.execute("DROP TRIGGER scrub ON shop.orders")
    db.execute("UPDATE shop.orders SET note = 'n' WHERE tenant='t1' AND id=7")
    assert pg.reinsert_row(**kw) == "already reinserted"
    assert pg.observe_reinsert(**kw).reversed_ is True


def test_a_reinsert_never_overwrites_a_row_that_took_the_key(db: psycopg.Connection[Any]) -> None:
    d = pg.delete_row(credential_ref=REF, table=T, key=KEY)
    db.execute("INSERT INTO shop.orders VALUES ('t1', 7, 'other', 9, 'x')")
    with pytest.raises(Indeterminate, match="another row took key"):
        pg.reinsert_row(credential_ref=REF, table=T, key=d["key"], row=d["row"])
    assert row(db) == ("other", "9.00", "x")


def test_the_connection_killed_mid_restore_leaves_the_row_and_a_replay_finishes(db: psycopg.Connection[Any]) -> None:
    r = pg.update_row(credential_ref=REF, table=T, key=KEY, values={"status": "cancelled"})
    errors: list[BaseException] = []
    with psycopg.connect(db.info.dsn) as blocker:  # holds the row lock: the restore waits on it
        blocker.execute("SELECT 1 FROM shop.orders WHERE tenant='t1' AND id=7 FOR UPDATE")

        def restore() -> None:
            try:
                pg.restore_row(**comp_kwargs(r))
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                errors.append(exc)

        t = threading.Thread(target=restore)
        t.start()
        q = ("SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'")
        pid = until("the restore waiting on the row lock", lambda: (db.execute(q, (pg.APPLICATION_NAME,)).fetchone() or [None])[0])
        assert db.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        t.join(30)
        blocker.rollback()
    assert not t.is_alive() and len(errors) == 1 and isinstance(errors[0], psycopg.OperationalError)
    assert row(db) == ("cancelled", "42.50", "n")  # the killed statement changed nothing
    assert pg.observe_restore(**comp_kwargs(r)).reversed_ is False
    assert pg.restore_row(**comp_kwargs(r)) == "restored"  # the replay under the same key finishes it


def test_a_key_that_is_not_the_primary_key_is_refused_by_name(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(ConfigurationError, match=r"primary key of 'shop.orders' is \['tenant', 'id'\]"):
        pg.update_row(credential_ref=REF, table=T, key={"id": 7}, values={"status": "x"})
    with pytest.raises(LookupError, match="nothing was updated"):
        pg.update_row(credential_ref=REF, table=T, key={"tenant": "zz", "id": 7}, values={"status": "x"})


async def test_a_saga_rolls_back_through_the_handler_and_the_log_holds_only_the_reference(
    db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    wal = FileWAL(tmp_path / "w")
    with pytest.raises(RuntimeError, match="model changed its mind"):
        async with saga_scope(wal) as saga:
            await pg.update(saga, credential_ref=REF, table=T, key=KEY, values={"status": "cancelled"})
            assert row(db) == ("cancelled", "42.50", "n")
            raise RuntimeError("model changed its mind")
    wal.close()
    assert row(db) == ("open", "42.50", "n")
    text = (tmp_path / "w").read_text()
    assert "postgres.restore_row" in text and REF in text and PASSWORD not in text


async def test_insert_and_delete_steps_roll_back_lifo(db: psycopg.Connection[Any], tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w")
    with pytest.raises(RuntimeError):
        async with saga_scope(wal) as saga:
            await pg.insert(saga, credential_ref=REF, table=T, values={"tenant": "t9", "id": 1, "status": "new"})
            await pg.delete(saga, credential_ref=REF, table=T, key={"tenant": "t2", "id": 7})
            assert row(db, "t9", 1) is not None and row(db, "t2") is None
            raise RuntimeError("abort")
    wal.close()
    assert row(db, "t9", 1) is None and row(db, "t2") == ("open", "1.00", "n")


@pytest.mark.parametrize("driver, pool_calls", [("async", 0), ("thread", 3)])
async def test_the_steps_use_psycopgs_async_api_unless_the_thread_driver_is_pinned(
    db: psycopg.Connection[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, driver: str, pool_calls: int
) -> None:
    """By default a step awaits PostgreSQL on the event loop and takes no tool-pool thread;
    AGENT_SAGA_PG_DRIVER=thread runs the sync API on the pool. Counted at the pool's submit."""
    from agent_saga.executor import ToolExecutor

    submitted: list[str] = []
    real_submit = ToolExecutor.submit

    def counting(self: ToolExecutor, fn: Any, kwargs: Any) -> Any:
        submitted.append(getattr(getattr(fn, "func", fn), "__name__", repr(fn)))
        return real_submit(self, fn, kwargs)

    monkeypatch.setattr(ToolExecutor, "submit", counting)
    monkeypatch.setenv("AGENT_SAGA_PG_DRIVER", driver)
    wal = FileWAL(tmp_path / "w")
    with pytest.raises(RuntimeError, match="abort"):
        async with saga_scope(wal) as saga:
            await pg.update(saga, credential_ref=REF, table=T, key=KEY, values={"status": "cancelled"})
            await pg.insert(saga, credential_ref=REF, table=T, values={"tenant": "t9", "id": 1, "status": "new"})
            await pg.delete(saga, credential_ref=REF, table=T, key={"tenant": "t2", "id": 7})
            assert len(submitted) == pool_calls, submitted
            assert row(db) == ("cancelled", "42.50", "n") and row(db, "t9", 1) is not None and row(db, "t2") is None
            raise RuntimeError("abort")
    wal.close()
    assert row(db) == ("open", "42.50", "n") and row(db, "t9", 1) is None and row(db, "t2") == ("open", "1.00", "n")


def test_an_unknown_driver_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_SAGA_PG_DRIVER", "gevent")
    with pytest.raises(ConfigurationError, match="AGENT_SAGA_PG_DRIVER must be 'async' or 'thread'"):
        pg.driver()
