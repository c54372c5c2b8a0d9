"""Replicas over one RedisWAL split the orphans by a hash of the saga id over their live
membership, and a replica that dies mid-shard (its membership not renewed, a claim it
took never released) has its share taken over once its entry and its claim expire:
every saga compensated exactly once, by one of the two."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from agent_saga import compensator
from agent_saga.recovery import RecoveryDaemon, RedisClaimLock, RedisLedger
from agent_saga.recovery.shards import owner_of
from agent_saga.wal.redis import RedisWAL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from fixtures.polling import until_async  # noqa: E402
from fixtures.redis_server import tagged  # noqa: E402
from verified_support import write_orphan  # noqa: E402

KEY = tagged("shards:wal")  # on a cluster the WAL's keys share one slot (claims and ledger tag their own)
CALLS: Counter[str] = Counter()
FUTURE = lambda: __import__("time").time() + 3600  # noqa: E731 - far past every lease


@compensator("test.shards.refund")
def refund(charge_id: str, idempotency_key: str) -> str:
    CALLS[charge_id] += 1
    return "refunded"


def replica(url: str, name: str) -> tuple[RecoveryDaemon, RedisWAL]:
    # A claim a daemon takes is renewed every ttl/3 from its event loop; a loaded machine
    # can stall that loop longer than a 1 s ttl allows, and the daemon then (rightly)
    # gives up its own claims. Only the dead peer's entry has to expire here: b's
    # membership (3 s) and the claim b takes by hand (1 s).
    wal = RedisWAL(url, key=KEY, writer=f"recovery-{name}")
    d = RecoveryDaemon(wal, ledger=RedisLedger(url, namespace="shards"), lock=RedisClaimLock(url, namespace="shards"),
                       clock=FUTURE, daemon_id=name, shard=True, membership_ttl=3.0, claim_ttl=30.0,
                       compensation_timeout=None)
    return d, wal


async def test_replicas_split_the_orphans_and_take_over_a_dead_peers_share(fresh_redis: Any) -> None:
    CALLS.clear()
    agent = RedisWAL(fresh_redis.url, key=KEY, writer="agent-1")
    sagas = [f"s{i}" for i in range(12)]
    for s in sagas:
        write_orphan(agent, s, f"ch_{s}", handler="test.shards.refund")
    agent.close()
    a, wal_a = replica(fresh_redis.url, "a")
    b, wal_b = replica(fresh_redis.url, "b")
    try:
        assert b.heartbeat is not None and a.heartbeat is not None
        await b.heartbeat.beat()
        b.heartbeat.start()  # b is a live member: a leaves b's share alone
        mine = {s for s in sagas if owner_of(s, ["a", "b"]) == "a"}
        assert 0 < len(mine) < len(sagas)
        first = await a.sweep()
        assert {r.saga_id for r in first.results} == mine and first.recovered == len(mine)
        assert set(a.scan.in_flight) == set(sagas) - mine, "b's share is untouched while b lives"
        # b dies mid-shard: it claimed one of its sagas and stops renewing anything.
        theirs = sorted(set(sagas) - mine)
        assert await b.lock.acquire(theirs[0], 1.0) is not None
        await b.heartbeat.stop()
        # Once b's entry (and its claim) expire, a takes its share over, each saga once.
        run = asyncio.ensure_future(a.run(interval=0.05))
        try:
            await until_async("a took over b's share", lambda: not a.scan.in_flight, timeout=30)
        finally:
            a.drain()
            await run
    finally:
        await a.close()
        await b.close()
        wal_a.close()
        wal_b.close()
    assert CALLS == Counter({f"ch_{s}": 1 for s in sagas})

