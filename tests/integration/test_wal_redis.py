"""RedisWAL on a real redis-server: a fleet of writer processes, restarts and crashes mid-append,
WAIT for replicas, fencing, and passwords that never leak."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from agent_saga import BaseWAL, ConfigurationError, WALError, WALStalled, verify_records
from agent_saga.wal.redis import RedisLog, RedisWAL
from fixtures.cli import cli
from fixtures.polling import until
from fixtures.redis_server import client_for, tagged


def new_key() -> str:
    return tagged(f"t-{uuid.uuid4().hex[:8]}:wal")


def chain_of(url: str, key: str, writer: str) -> list[tuple[str, Any]]:
    client = client_for(url)
    try:
        return list(RedisLog(client, key, "test").chain(writer))
    finally:
        client.close()


def causes(exc: BaseException | None) -> list[BaseException]:
    out = []
    while exc is not None:
        out.append(exc)
        exc = exc.__cause__
    return out


WRITER_SCRIPT = """
import asyncio, sys
from agent_saga.wal.redis import RedisWAL

async def main(url, key, writer, n):
    wal = RedisWAL(url, key=key, writer=writer)
    async def agent(a):
        for k in range(n // 10):
            await wal.barrier(wal.append("STEP_COMMITTED", f"{writer}-{a}", None, {"k": k}))
    await asyncio.gather(*(agent(a) for a in range(10)))
    wal.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


def test_three_writer_processes_share_one_log(fresh_redis: Any) -> None:
    key, n = new_key(), 400
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, fresh_redis.url, key, f"proc-{i}", str(n)])
        for i in range(3)
    ]
    for p in procs:
        assert p.wait(120) == 0
    client = fresh_redis.client()
    log = RedisLog(client, key, "test")
    assert log.writers() == ["proc-0", "proc-1", "proc-2"]
    gseqs: list[int] = []
    for w in log.writers():
        res = verify_records(log.chain(w))
        assert res.ok and res.records == n, (w, res)
        gseqs += [r.extra["gseq"] for _l, r in log.chain(w)]
    assert len(gseqs) == len(set(gseqs)) == 3 * n  # every record uniquely identified
    merged = [r for page in log.pages_since(0, page_size=97) for r in page]
    assert [r.extra["gseq"] for r in merged] == sorted(gseqs)
    # A cursor resumes exactly after the last record read.
    cut = merged[500].extra["gseq"]
    rest = [r for page in log.pages_since(cut, page_size=50) for r in page]
    assert rest == merged[501:]
    client.close()
    r = cli("verify", "--wal-url", f"{fresh_redis.url}?key={key}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": OK:") == 3 and "OK: 3 chain(s)" in r.stdout
    r = cli("verify", "--wal-url", f"{fresh_redis.url}?key={key}&writer=proc-1", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and [c["writer"] for c in out["chains"]] == ["proc-1"]


async def _append_until_the_server_goes(wal: RedisWAL, server_down: Callable[[], None]) -> tuple[list[int], list[BaseException]]:
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
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    return acked, [r for r in results if isinstance(r, BaseException)]


@pytest.mark.parametrize("how", ["restart", "kill"])
async def test_redis_restarted_mid_append_loses_nothing_acknowledged(
    redis_server_factory: Any, how: str
) -> None:
    server = redis_server_factory(appendonly=True)  # appendfsync always
    key = new_key()
    wal = RedisWAL(server.url, key=key, writer="w1")
    down = server.stop if how == "restart" else server.kill
    acked, errors = await _append_until_the_server_goes(wal, down)
    # Every in-flight append failed with the real error, none silently.
    assert len(errors) == 8 and all(isinstance(e, WALError) for e in errors)
    assert any(isinstance(c, redis.exceptions.ConnectionError) for e in errors for c in causes(e))
    with pytest.raises(WALError):
        wal.close()
    server.start()
    wal = RedisWAL(server.url, key=key, writer="w1")  # continues from what Redis holds
    seq = wal.append("STEP_COMMITTED", "after", None, {"i": -1})
    await wal.barrier(seq)
    wal.close()
    items = chain_of(server.url, key, "w1")
    assert verify_records(iter(items)).ok
    present = {r.payload["i"] for _l, r in items}
    assert set(acked) <= present  # nothing acknowledged is lost
    assert -1 in present and items[-1][1].seq == seq


async def test_a_writer_failed_by_a_restart_stays_failed_when_redis_is_back(fresh_redis: Any) -> None:
    """Fail-stop, not reconnect: the server came back empty (no AOF), so what this writer
    had acknowledged is gone; resuming its chain there would hide that. Every later
    append is refused naming the first failure; only a new RedisWAL continues."""
    key = new_key()
    wal = RedisWAL(fresh_redis.url, key=key, writer="w1", socket_timeout=1.0)
    await wal.barrier(wal.append("STEP_COMMITTED", "s-1"))
    await asyncio.to_thread(fresh_redis.stop)
    with pytest.raises(WALError):
        await wal.barrier(wal.append("STEP_COMMITTED", "s-1"))
    await asyncio.to_thread(fresh_redis.start)
    assert fresh_redis.client().exists(f"{key}:w:w1") == 0  # the acknowledged record is gone
    # The first failure is named: a refused connection (on a cluster: no node reachable).
    with pytest.raises(WALError, match="ConnectionError|Redis Cluster cannot be connected"):
        wal.append("STEP_COMMITTED", "s-2")  # Redis answers again; this writer does not resume
    assert wal.stats().failed
    assert fresh_redis.client().exists(f"{key}:w:w1") == 0  # nothing written behind the failure
    with pytest.raises(WALError):
        wal.close()


async def test_a_second_process_with_the_same_writer_id_is_fenced(fresh_redis: Any) -> None:
    key = new_key()
    first = RedisWAL(fresh_redis.url, key=key, writer="dup")
    await first.barrier(first.append("X", "s-1"))
    second = RedisWAL(fresh_redis.url, key=key, writer="dup")  # reads the same head
    await first.barrier(first.append("X", "s-1"))
    with pytest.raises(WALError) as ei:
        await second.barrier(second.append("X", "s-2"))
    assert "another process writes with writer id 'dup'" in str(ei.value)
    first.close()
    with pytest.raises(WALError):
        second.close()
    items = chain_of(fresh_redis.url, key, "dup")
    assert [r.saga for _l, r in items] == ["s-1", "s-1"] and verify_records(iter(items)).ok


async def test_script_cache_flush_is_survived(fresh_redis: Any) -> None:
    key = new_key()
    wal = RedisWAL(fresh_redis.url, key=key, writer="w1")
    await wal.barrier(wal.append("X", "s-1"))
    fresh_redis.command("SCRIPT", "FLUSH")
    await wal.barrier(wal.append("X", "s-1"))  # NOSCRIPT: reloaded, sent once more
    wal.close()
    assert len(chain_of(fresh_redis.url, key, "w1")) == 2


async def test_wait_replicas(redis_server_factory: Any) -> None:
    primary = redis_server_factory()
    replica = redis_server_factory(extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
    rc = redis.Redis.from_url(replica.url)
    until("the replica to sync", lambda: rc.info("replication").get("master_link_status") == "up")
    key = new_key()
    wal = RedisWAL(primary.url, key=key, writer="w1", wait_replicas=1, wait_timeout_ms=2000)
    assert "1 replica(s) acknowledged it (WAIT)" in wal.durability
    for i in range(20):
        await wal.barrier(wal.append("X", "s-1", None, {"i": i}))
    until("the replica to hold the records", lambda: rc.xlen(f"{key}:w:w1") == 20)
    replica.stop()
    wal2 = RedisWAL(primary.url, key=key, writer="w1", wait_replicas=1, wait_timeout_ms=200)
    wal.close()
    with pytest.raises(WALError) as ei:
        await wal2.barrier(wal2.append("X", "s-1"))
    stalled = [c for c in causes(ei.value) if isinstance(c, WALStalled)]
    assert stalled and "only 0 of 1 replicas acknowledged within 200 ms" in str(stalled[0])
    with pytest.raises(WALError):
        wal2.close()
    rc.close()


async def test_clients_it_accepts_and_refuses(fresh_redis: Any) -> None:

    aclient = fresh_redis.async_client()
    with pytest.raises(ConfigurationError, match="cannot share an asyncio client"):
        RedisWAL(aclient, key=new_key())
    await aclient.aclose()
    with pytest.raises(ConfigurationError, match="not PosixPath"):
        RedisWAL(Path("/tmp"), key=new_key())
    client = fresh_redis.client()
    wal = RedisWAL(client, key=new_key())
    await wal.barrier(wal.append("X", "s-1"))
    wal.close()
    assert client.ping()  # a client we were given is not closed for you
    client.close()


async def test_unreachable_redis_is_a_walerror(tmp_path: Path) -> None:
    from fixtures.procs import free_port

    with pytest.raises(WALError, match="cannot open RedisWAL") as ei:
        RedisWAL(f"redis://127.0.0.1:{free_port()}/0", key=new_key(), socket_timeout=2)
    assert isinstance(ei.value.__cause__, redis.exceptions.ConnectionError)


async def test_the_password_never_leaks(
    redis_server_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "Pa55-" + uuid.uuid4().hex
    server = redis_server_factory()
    assert server.command("CONFIG", "SET", "requirepass", secret).startswith(b"+OK")
    url = f"redis://:{secret}@127.0.0.1:{server.port}/0"
    key = new_key()
    seen: list[str] = []
    caplog.set_level(logging.DEBUG)

    with pytest.raises(WALError) as ei:
        RedisWAL(f"redis://:wrong-{secret}@127.0.0.1:{server.port}/0", key=key)
    seen += [str(c) for c in causes(ei.value)]

    wal = RedisWAL(url, key=key, writer="w1")
    for i in range(5):
        wal.append("STEP_COMMITTED", "s-1", None, {"i": i})
    await wal.barrier()
    seen += [repr(wal), wal.name, wal.durability, str(wal.stats())]
    records = [r async for r in wal.read_all()]
    seen += [json.dumps(r.to_dict()) for r in records]
    server.kill()  # the writer fails: every message it makes names the server
    with pytest.raises(WALError) as ei:
        await wal.barrier(wal.append("X", "s-1"))
    seen += [str(c) for c in causes(ei.value)]
    with pytest.raises(WALError) as ei:
        wal.append("X", "s-1")
    seen += [str(c) for c in causes(ei.value)]
    with pytest.raises(WALError) as ei:
        wal.close()
    seen += [str(c) for c in causes(ei.value)] + [str(wal.stats())]
    with pytest.raises(WALError) as ei:
        RedisWAL(url, key=key, socket_timeout=1)
    seen += [str(c) for c in causes(ei.value)]
    r = cli("verify", "--wal-url", f"{url}?key={key}")
    seen += [r.stdout, r.stderr]
    assert r.returncode == 2 and "redis://:***@127.0.0.1" in r.stderr
    server.start()
    assert server.command("CONFIG", "SET", "requirepass", secret).startswith(b"+OK")
    r = cli("verify", "--wal-url", f"{url}?key={key}")
    seen += [r.stdout, r.stderr]
    r = cli("inspect", "--wal-url", f"{url}?key={key}")
    seen += [r.stdout, r.stderr]
    seen += [rec.getMessage() for rec in caplog.records]
    leaks = [s for s in seen if secret in s]
    assert not leaks, leaks
    assert any("***" in s for s in seen)


async def test_cli_detects_tampering_in_a_redis_log(fresh_redis: Any) -> None:
    key = new_key()
    wal = RedisWAL(fresh_redis.url, key=key, writer="w1")
    for i in range(5):
        wal.append("STEP_COMMITTED", "s-1", "s-1/0", {"amount": i})
    await wal.barrier()
    wal.close()
    client = fresh_redis.client()
    entries = client.xrange(f"{key}:w:w1")
    client.xdel(f"{key}:w:w1", entries[2][0])
    client.close()
    r = cli("verify", "--wal-url", f"{fresh_redis.url}?key={key}", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["ok"] is False
    assert out["chains"][0]["first_bad_seq"] == 4 and "missing" in out["chains"][0]["reason"]


def test_cursor_of_a_record_is_its_gseq() -> None:
    from agent_saga.records import Record

    r = Record("X", "s", None, None, seq=3, extra={"gseq": 41})
    assert BaseWAL.cursor(r) == 41
    assert BaseWAL.cursor(Record("X", "s", None, None, seq=3)) == 3


async def test_a_batch_sent_as_one_argument_lands_as_one_entry_a_record(fresh_redis: Any) -> None:
    """A batch goes to Redis as its lines joined in one argument and the script splits it:
    every record is its own entry, with consecutive ids, in seq order, each line as
    FileWAL writes it (a newline inside a value is escaped, so it never splits a line)."""
    import dataclasses

    from agent_saga.records import encode_line

    key = new_key()
    wal = RedisWAL(fresh_redis.url, key=key, writer="w1")
    payloads = [{"note": "two\nlines", "i": i} if i % 2 else {"i": i} for i in range(7)]
    seqs = [wal.append("STEP_INTENT", "s-1", f"s-1/{i}", p) for i, p in enumerate(payloads)]
    await wal.barrier(seqs[-1])
    assert wal.stats().batches == 1  # the seven records went in one script call
    wal.close()
    client = client_for(fresh_redis.url)
    try:
        entries = client.xrange(RedisLog(client, key, "test").stream("w1"))
    finally:
        client.close()
    items = chain_of(fresh_redis.url, key, "w1")
    assert [r.payload for _l, r in items] == payloads and verify_records(iter(items)).ok
    gseqs = [int(eid.split(b"-")[0]) for eid, _ in entries]
    assert gseqs == list(range(gseqs[0], gseqs[0] + 7))
    unstamped = [dataclasses.replace(r, extra={}) for _l, r in items]  # gseq, writer: the reader's
    assert [fields[b"r"] + b"\n" for _, fields in entries] == [encode_line(r) for r in unstamped]
