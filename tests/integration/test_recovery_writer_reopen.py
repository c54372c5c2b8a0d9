"""A recovery daemon's writer that failed (a failover) is opened again; the failed one is
closed only once no read still uses it. Closing a RedisWAL closes its client's
connections, including the one a read in another thread is using: redis-py then fails
that read with an AttributeError, not a connection error, and the daemon crashed."""

from __future__ import annotations

import asyncio

import pytest
from agent_saga.recovery.sources import WALSource
from agent_saga.wal.redis import RedisWAL
from fixtures.redis_server import RedisServer, tagged

pytestmark = pytest.mark.integration

KEY = tagged("reopen:wal")  # on a cluster a WAL's keys share one slot


def _failed_writer(wal: RedisWAL) -> None:
    """Make ``wal`` fail as a writer whose stream vanished under it (a failover that lost it)."""
    wal.append("SAGA_STARTED", "s-0", None, {"name": None, "tags": []})
    wal.barrier_sync()
    wal._client.delete(wal._log.stream(wal.writer))
    wal.append("SAGA_STARTED", "s-1", None, {"name": None, "tags": []})
    with pytest.raises(Exception):  # noqa: B017, PT011 - whichever WALError the fence reports
        wal.barrier_sync()
    assert wal.stats().failed is not None


async def test_a_failed_writer_is_closed_only_after_the_read_using_it_ends(fresh_redis: RedisServer) -> None:
    url = fresh_redis.url
    seed = RedisWAL(url, key=KEY, writer="seed")
    for i in range(6):
        seed.append("SAGA_STARTED", f"seed-{i}", None, {"name": None, "tags": []})
    seed.barrier_sync()
    seed.close()

    first = RedisWAL(url, key=KEY, writer="daemon-1", socket_timeout=5.0)
    reopened: list[RedisWAL] = []

    def reopen() -> RedisWAL:
        reopened.append(RedisWAL(url, key=KEY, writer=f"daemon-{len(reopened) + 2}", socket_timeout=5.0))
        return reopened[-1]

    src = WALSource(first, reopen)
    src.page_size = 2
    try:
        pages = src._fetch_pages(True)
        got = [await anext(pages)]  # a read in flight, suspended between pages
        _failed_writer(first)
        fresh = await asyncio.to_thread(src._fresh_writer)
        assert fresh is reopened[0] and src.wal is fresh
        assert not first.closed, "the failed writer was closed under a read still using it"
        async for page in pages:  # the read goes on over the same (still open) client
            got.append(page)
        saga_ids = [rec.saga for page in got for _, rec in page]
        assert saga_ids[:6] == [f"seed-{i}" for i in range(6)]
        assert first.closed, "the failed writer is closed once the last read using it ended"
        # No read in flight: a writer failing now is closed at once.
        _failed_writer(fresh)
        assert await asyncio.to_thread(src._fresh_writer) is reopened[1]
        assert fresh.closed
    finally:
        for wal in (first, *reopened):
            if not wal.closed:
                wal.close()
