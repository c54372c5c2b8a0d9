"""PostgresWAL on a real PostgreSQL: restarts and crashes mid-append, the indexed head lookup,
several writer processes on one table, fencing, durability reporting, passwords."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from agent_saga import ConfigurationError, WALError, verify_records
from agent_saga.wal.postgres import PostgresLog, PostgresWAL
from fixtures.cli import cli


def chain_of(dsn: str, writer: str, table: str = "saga_wal") -> list[tuple[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        log = PostgresLog(lambda: _same(conn), table, "test")
        return list(log.chain(writer))


class _same:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __enter__(self) -> Any:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        pass


def causes(exc: BaseException | None) -> list[BaseException]:
    out = []
    while exc is not None:
        out.append(exc)
        exc = exc.__cause__
    return out


async def _append_until_the_server_goes(wal: PostgresWAL, server_down: Callable[[], None]) -> tuple[list[int], list[BaseException]]:
    acked: list[int] = []

    async def agent(a: int) -> None:
        k = 0
        while True:
            i = a * 1_000_000 + k
            await wal.barrier(wal.append("STEP_COMMITTED", f"s-{a}", None, {"i": i}))
            acked.append(i)
            k += 1

    tasks = [asyncio.ensure_future(agent(a)) for a in range(8)]
    while len(acked) < 300:
        await asyncio.sleep(0.005)
    await asyncio.to_thread(server_down)
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    return acked, [r for r in results if isinstance(r, BaseException)]


@pytest.mark.parametrize("how", ["restart", "kill"])
async def test_postgres_restarted_mid_append_loses_nothing_acknowledged(
    postgres_server: Any, postgres_db: str, how: str
) -> None:
    # The test server runs with synchronous_commit=off; a crash-safe commit is asked for here.
    wal = PostgresWAL(postgres_db, writer="w1", synchronous_commit="on")
    assert "synchronous_commit=on" in wal.durability
    down = postgres_server.stop if how == "restart" else postgres_server.kill
    try:
        acked, errors = await _append_until_the_server_goes(wal, down)
    finally:
        await asyncio.to_thread(postgres_server.start)
    assert len(errors) == 8 and all(isinstance(e, WALError) for e in errors)
    assert any(isinstance(c, psycopg.OperationalError) for e in errors for c in causes(e))
    with pytest.raises(WALError):
        wal.close()
    wal = PostgresWAL(postgres_db, writer="w1")  # continues from what the table holds
    seq = wal.append("STEP_COMMITTED", "after", None, {"i": -1})
    await wal.barrier(seq)
    wal.close()
    items = chain_of(postgres_db, "w1")
    assert verify_records(iter(items)).ok
    present = {r.payload["i"] for _l, r in items}
    assert set(acked) <= present  # nothing acknowledged is lost
    assert items[-1][1].seq == seq


async def test_reopen_finds_the_head_with_one_index_lookup(postgres_db: str) -> None:
    wal = PostgresWAL(postgres_db, writer="w1")
    other = PostgresWAL(postgres_db, writer="w0")
    for i in range(3000):
        wal.append("X", "s-1", None, {"i": i})
        other.append("X", "s-0", None, {"i": i})
    await wal.barrier()
    await other.barrier()
    wal.close()
    other.close()
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        conn.execute("ANALYZE saga_wal")
        log = PostgresLog(lambda: _same(conn), "saga_wal", "test")
        row = conn.execute(psycopg.sql.SQL("EXPLAIN (FORMAT JSON) ") + log.q_tail, ("w1",)).fetchone()
        assert row is not None
        plan = row[0]
    text = json.dumps(plan)
    assert "Seq Scan" not in text and "saga_wal_pkey" in text, text
    assert '"Node Type": "Limit"' in text
    wal = PostgresWAL(postgres_db, writer="w1")
    assert wal.head[0] == 3000
    wal.close()


WRITER_SCRIPT = """
import asyncio, sys
from agent_saga.wal.postgres import PostgresWAL

async def main(dsn, writer, n):
    wal = PostgresWAL(dsn, writer=writer)
    async def agent(a):
        for k in range(n // 10):
            await wal.barrier(wal.append("STEP_COMMITTED", f"{writer}-{a}", None, {"k": k}))
    await asyncio.gather(*(agent(a) for a in range(10)))
    wal.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_writer_processes_share_one_table_in_gseq_order(postgres_db: str) -> None:
    PostgresWAL(postgres_db, writer="setup").close()  # create the table once, up front
    n = 300
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, postgres_db, f"proc-{i}", str(n)])
        for i in range(3)
    ]
    # Read with a cursor while they write: no record may be skipped.
    reader = PostgresWAL(postgres_db, writer="reader")
    seen: list[Any] = []
    cursor = 0
    while any(p.poll() is None for p in procs) or len(seen) < 3 * n:
        async for rec in reader.read_since(cursor, page_size=64):
            seen.append(rec)
            cursor = rec.extra["gseq"]
        await asyncio.sleep(0.01)
        assert len(seen) <= 3 * n
    for p in procs:
        assert p.wait(120) == 0
    reader.close()
    gseqs = [r.extra["gseq"] for r in seen]
    assert gseqs == sorted(set(gseqs)) and len(gseqs) == 3 * n
    for w in ("proc-0", "proc-1", "proc-2"):
        res = verify_records(iter(chain_of(postgres_db, w)))
        assert res.ok and res.records == n
    r = cli("verify", "--wal-url", f"{postgres_db}?table=saga_wal")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": OK:") == 3


async def test_concurrent_first_opens_create_the_table_once(postgres_db: str) -> None:
    errors: list[BaseException] = []
    wals: list[PostgresWAL] = []

    def open_one(i: int) -> None:
        try:
            wals.append(PostgresWAL(postgres_db, writer=f"w{i}"))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in wals:
        w.close()
    assert not errors and len(wals) == 6


def _sink_wal(dsn: str, **kw: Any) -> Any:
    from agent_saga.wal import PostgresAsyncSink, SinkWAL

    return SinkWAL(PostgresAsyncSink(dsn), **kw)


@pytest.mark.parametrize("open_wal", [PostgresWAL, _sink_wal], ids=["postgres", "postgres-async"])
async def test_a_second_process_with_the_same_writer_id_is_fenced(postgres_db: str, open_wal: Any) -> None:
    first = open_wal(postgres_db, writer="dup")
    await first.barrier(first.append("X", "s-1"))
    second = open_wal(postgres_db, writer="dup")
    await first.barrier(first.append("X", "s-1"))
    with pytest.raises(WALError) as ei:
        await second.barrier(second.append("X", "s-2"))
    assert any("another process writes with writer id 'dup'" in str(c) for c in causes(ei.value))
    first.close()
    with pytest.raises(WALError):
        second.close()
    items = chain_of(postgres_db, "dup")
    assert [r.saga for _l, r in items] == ["s-1", "s-1"] and verify_records(iter(items)).ok


async def test_durability_states_synchronous_commit(postgres_db: str) -> None:
    wal = PostgresWAL(postgres_db, writer="a")
    assert "synchronous_commit=off" in wal.durability  # the test server's setting, honoured
    wal.close()
    wal = PostgresWAL(postgres_db, writer="b", synchronous_commit="on")
    assert "synchronous_commit=on" in wal.durability
    wal.close()
    with pytest.raises(ConfigurationError, match="synchronous_commit"):
        PostgresWAL(postgres_db, synchronous_commit="sometimes")
    with pytest.raises(ConfigurationError, match="table name"):
        PostgresWAL(postgres_db, table_name="saga_wal; DROP TABLE x")


async def test_the_password_never_leaks(
    postgres_server: Any, postgres_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "Pa55-" + uuid.uuid4().hex
    dbname = postgres_db.rsplit("/", 1)[1]
    # The test cluster trusts local connections, so the password is carried but not checked:
    # what is tested is that it never comes back out.
    dsn = f"postgresql://postgres:{secret}@127.0.0.1:{postgres_server.port}/{dbname}"
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    wal = PostgresWAL(dsn, writer="w1")
    for i in range(5):
        wal.append("STEP_COMMITTED", "s-1", None, {"i": i})
    await wal.barrier()
    seen += [repr(wal), wal.name, wal.durability, str(wal.stats())]
    seen += [json.dumps(r.to_dict()) async for r in wal.read_all()]
    await asyncio.to_thread(postgres_server.stop)
    try:
        with pytest.raises(WALError) as ei:
            await wal.barrier(wal.append("X", "s-1"))
        seen += [str(c) for c in causes(ei.value)]
        with pytest.raises(WALError) as ei:
            wal.close()
        seen += [str(c) for c in causes(ei.value)] + [str(wal.stats())]
        with pytest.raises(WALError) as ei:
            PostgresWAL(dsn, writer="w1", connect_timeout=2)
        seen += [str(c) for c in causes(ei.value)]
        r = cli("verify", "--wal-url", f"{dsn}?table=saga_wal")
        seen += [r.stdout, r.stderr]
        assert r.returncode == 2
    finally:
        await asyncio.to_thread(postgres_server.start)
    r = cli("verify", "--wal-url", f"{dsn}?table=saga_wal")
    seen += [r.stdout, r.stderr]
    assert r.returncode == 0 and "postgresql://postgres@127.0.0.1" in r.stdout
    r = cli("inspect", "--wal-url", f"{dsn}?table=saga_wal&writer=w1")
    seen += [r.stdout, r.stderr]
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        seen += [json.dumps(row, default=str) for row in conn.execute("SELECT * FROM saga_wal").fetchall()]
    seen += [rec.getMessage() for rec in caplog.records]
    leaks = [s for s in seen if secret in s]
    assert not leaks, leaks


async def test_cli_names_a_damaged_row(postgres_db: str) -> None:
    wal = PostgresWAL(postgres_db, writer="w1")
    for i in range(5):
        wal.append("STEP_COMMITTED", "s-1", "s-1/0", {"amount": i})
    await wal.barrier()
    wal.close()
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        conn.execute("UPDATE saga_wal SET payload = '{\"amount\":99}' WHERE seq = 3")
    r = cli("verify", "--wal-url", f"{postgres_db}?table=saga_wal&writer=w1", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["chains"][0]["first_bad_seq"] == 3
    assert "writer w1 seq 3" in out["chains"][0]["location"]
    r = cli("verify", "--wal-url", f"{postgres_db}?table=nope")
    assert r.returncode == 2 and "does not exist" in r.stderr
