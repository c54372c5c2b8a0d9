"""The real PostgreSQL the integration suites use: round trips, per-test databases, restart."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from fixtures.postgres_server import PostgresServer
from fixtures.procs import pid_alive, port_open


def test_round_trip(postgres_db: str) -> None:
    with psycopg.connect(postgres_db) as conn:
        conn.execute("CREATE TABLE wal (seq bigint PRIMARY KEY, body jsonb NOT NULL)")
        conn.execute(
            "INSERT INTO wal VALUES (%s, %s), (%s, %s)",
            (1, '{"v": 1, "op": "begin"}', 2, '{"v": 1, "op": "commit"}'),
        )
        conn.commit()
        rows = conn.execute("SELECT seq, body->>'op' FROM wal ORDER BY seq").fetchall()
    assert rows == [(1, "begin"), (2, "commit")]


def test_each_test_gets_a_fresh_database(postgres_db: str) -> None:
    with psycopg.connect(postgres_db) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)


def test_data_survives_restart(postgres_server: PostgresServer, postgres_db: str) -> None:
    with psycopg.connect(postgres_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (42)")
    old_pid = postgres_server.pid
    postgres_server.restart()
    assert old_pid is not None and not pid_alive(old_pid)
    with psycopg.connect(postgres_db) as conn:
        assert conn.execute("SELECT x FROM t").fetchone() == (42,)


def test_server_runs_unprivileged(postgres_server: PostgresServer) -> None:
    with psycopg.connect(postgres_server.dsn) as conn:
        row = conn.execute("SELECT current_setting('listen_addresses'), current_setting('port')").fetchone()
    assert row == ("127.0.0.1", str(postgres_server.port))
    pid = postgres_server.pid
    assert pid is not None
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
    assert uid != 0, "PostgreSQL must not run as root"


def test_closed_server_leaves_no_process() -> None:
    server = PostgresServer().start()
    pid, port, workdir = server.pid, server.port, server.workdir
    assert pid is not None and pid_alive(pid)
    with psycopg.connect(server.dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    server.close()
    assert not pid_alive(pid)
    assert not port_open(port)
    assert not workdir.exists()


def test_refused_connection_after_kill(postgres_server: PostgresServer) -> None:
    server = PostgresServer().start()
    try:
        server.kill()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.dsn, connect_timeout=3).close()
        server.start()
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.close()
