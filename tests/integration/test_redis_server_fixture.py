"""The real Redis the integration suites use: round trips, restarts, flushes, crashes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis
from fixtures.procs import pid_alive, port_open
from fixtures.redis_server import RedisServer


def _client(server: RedisServer) -> redis.Redis:
    return server.client(socket_timeout=5)


def test_round_trip(fresh_redis: RedisServer) -> None:
    r = _client(fresh_redis)
    try:
        r.set("k", b"v")
        r.hset("h", mapping={"a": "1", "b": "2"})
        r.xadd("wal", {"rec": "1"})
        assert r.get("k") == b"v"
        assert r.hgetall("h") == {b"a": b"1", b"b": b"2"}
        assert r.xlen("wal") == 1
        # A Lua script runs server-side: the limit counters rely on this.
        incr = r.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
        assert incr(keys=["n"], args=[5]) == 5
    finally:
        r.close()


@pytest.mark.single_redis("one redis-server process: its pid changes across a restart, its port does not")
def test_restart_mid_test_without_persistence_loses_data(fresh_redis: RedisServer) -> None:
    r = _client(fresh_redis)
    try:
        r.set("k", "before")
        pid = fresh_redis.pid
        port = fresh_redis.port
        fresh_redis.stop()
        assert not port_open(port)
        with pytest.raises(redis.ConnectionError):
            r.get("k")
        fresh_redis.start()
        assert fresh_redis.port == port, "a restart keeps the port, so clients can reconnect"
        assert fresh_redis.pid != pid and pid is not None and not pid_alive(pid)
        # The same client reconnects on its own; the data is gone (--save '' --appendonly no).
        assert r.get("k") is None
        r.set("k", "after")
        assert r.get("k") == b"after"
    finally:
        r.close()


def test_flush(fresh_redis: RedisServer) -> None:
    r = _client(fresh_redis)
    try:
        r.set("a", 1)
        fresh_redis.flush()
        assert r.dbsize() == 0
    finally:
        r.close()


def test_appendonly_survives_restart_and_crash(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory(appendonly=True)
    r = _client(server)
    try:
        r.set("durable", "1")
        server.restart()
        assert r.get("durable") == b"1"
        r.set("durable", "2")
        server.kill()  # SIGKILL: appendfsync always has it on disk already
        server.start()
        assert r.get("durable") == b"2"
    finally:
        r.close()


def test_stopped_server_leaves_no_process(redis_server_factory: Callable[..., RedisServer]) -> None:
    server = redis_server_factory()
    pid = server.pid
    assert pid is not None and pid_alive(pid)
    server.close()
    assert not pid_alive(pid)
    assert not port_open(server.port)


def test_restart_from_a_worker_thread_outlives_the_thread(fresh_redis: RedisServer) -> None:
    # e.g. `await asyncio.to_thread(redis_server.restart)` in an async fault test: the new
    # server must not die when that worker thread ends (no PR_SET_PDEATHSIG off the main thread).
    t = threading.Thread(target=fresh_redis.restart)
    t.start()
    t.join()
    time.sleep(0.3)  # give a (wrongly) armed parent-death signal time to land
    assert fresh_redis.ping()
    assert fresh_redis.running()
