"""SinkWAL over a real asynchronous store (psycopg's AsyncConnection on a real PostgreSQL):
the engine runs a saga on it, the log it writes is the same log PostgresWAL and the CLI
read and continue, and a store error fails the pending fence at once with the real cause.
(The whole WAL contract runs against it in test_wal_contract.py; the fence of a second
writer with the same id in test_wal_postgres.py.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from agent_saga import Compensation, ConfigurationError, WALError, saga_scope, verify_records
from agent_saga.wal import AsyncSink, PostgresAsyncSink, PostgresWAL, SinkWAL
from test_wal_postgres import causes, chain_of


async def test_the_engine_runs_a_saga_on_an_async_store_that_postgres_wal_and_the_cli_read(
    postgres_db: str,
) -> None:
    wal = SinkWAL(PostgresAsyncSink(postgres_db), writer="edge-1")
    assert isinstance(wal._sink, AsyncSink) and "synchronous_commit=" in wal.durability
    undone: list[str] = []

    async def fail() -> None:
        raise ValueError("card declined")

    with pytest.raises(ValueError, match="card declined"):
        async with saga_scope(wal, name="checkout") as saga:
            await saga.execute("inventory.reserve", "COMPENSABLE", lambda: "r-1",
                               lambda r: Compensation(fn=lambda: undone.append(r)))
            await saga.execute("stripe.charge", "COMPENSABLE", fail,
                               lambda r: Compensation(fn=lambda: undone.append("never")))
    wal.close()
    assert undone == ["r-1"]
    items = chain_of(postgres_db, "edge-1")
    types = [r.type for _l, r in items]
    assert types[0] == "SAGA_STARTED" and types[-1] == "SAGA_ROLLED_BACK", types
    assert "COMPENSATION_DONE" in types and verify_records(iter(items)).ok
    # PostgresWAL continues the same writer's chain; SinkWAL reads what it wrote.
    pg = PostgresWAL(postgres_db, writer="edge-1")
    await pg.barrier(pg.append("X", "after"))
    pg.close()
    again = SinkWAL(PostgresAsyncSink(postgres_db), writer="edge-1")
    chain = [r async for r in again.read_chain()]
    assert [r.seq for r in chain] == list(range(1, len(items) + 2)) and chain[-1].saga == "after"
    again.close()
    exe = shutil.which("agent-saga", path=str(Path(sys.executable).parent))
    assert exe
    r = subprocess.run([exe, "verify", "--wal-url", f"{postgres_db}?table=saga_wal&writer=edge-1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


async def test_a_store_error_fails_the_pending_fence_with_the_real_cause(postgres_db: str) -> None:
    wal = SinkWAL(PostgresAsyncSink(postgres_db), writer="cut")
    await wal.barrier(wal.append("X", "s-1"))
    with psycopg.connect(postgres_db, autocommit=True) as admin:
        # End the writer's session from the server side (the reader's goes too).
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    with pytest.raises(WALError) as ei:
        await wal.barrier(wal.append("X", "s-1"), timeout=30)
    assert any(isinstance(c, psycopg.OperationalError) for c in causes(ei.value)), causes(ei.value)
    with pytest.raises(WALError, match="failed earlier"):
        wal.append("X", "s-1")
    with pytest.raises(WALError):
        wal.close()
    assert [r.seq for _l, r in chain_of(postgres_db, "cut")] == [1]


def test_a_sink_that_is_not_an_async_sink_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="sink must be an agent_saga.wal.AsyncSink"):
        SinkWAL(object())  # type: ignore[arg-type]


def test_an_unreachable_store_is_a_clear_error_without_the_password() -> None:
    dsn = "postgresql://agent:s3cr3t-pw@127.0.0.1:1/none"
    with pytest.raises(WALError, match="cannot open SinkWAL") as ei:
        SinkWAL(PostgresAsyncSink(dsn, connect_timeout=2), writer="w")
    assert "s3cr3t-pw" not in str(ei.value)
