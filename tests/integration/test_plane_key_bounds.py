"""No Redis key of the policy plane grows with the fleet past 64 KB (docs/scale.md).

700 agent processes beat on one plane and 900 spend (pod names as a Deployment gives them): more than one sorted set of their
heartbeats' index (~130 B an entry: past 64 KB at ~500) or one set of the limit parts
(~70 B a part: past 64 KB at ~900) could hold. Every key stays under 64 KB, the operator's
read still finds every heartbeat, and the budget still sums every part. The previous
release's unbucketed keys are still read (a rolling upgrade)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agent_saga._shared import SharedConnections
from agent_saga.controls import BudgetLimit, RedisLimitStore
from agent_saga.controls.limits import Charge
from agent_saga.heartbeat import (
    AppliedState,
    HeartbeatWriter,
    heartbeat_buckets_key,
    heartbeat_legacy_index_key,
)
from agent_saga_operator.acks import read_fleet
from fixtures.redis_server import PLANE_PREFIX as P
from fixtures.redis_server import RedisServer, client_for

pytestmark = [pytest.mark.integration, pytest.mark.single_redis("MEMORY USAGE of one server's keys")]

BEATING, SPENDING = 700, 900
BOUND = 64 * 1024
CAP = 10.0 * SPENDING


def largest(admin: Any) -> tuple[int, str]:
    """(bytes, key) of the largest key (``MEMORY USAGE`` with every element counted)."""
    return max((admin.memory_usage(k, samples=0) or 0, k.decode()) for k in admin.scan_iter(count=1000))


def writers(url: str, shared: SharedConnections, pods: range) -> list[HeartbeatWriter]:
    out = []
    for i in pods:
        w = HeartbeatWriter(url, prefix=P, namespace="fleet", agent="a", state=AppliedState, pod=f"pod-{i:05d}",
                            interval=60)
        w.share_connections(shared)
        out.append(w)
    return out


def test_the_heartbeats_index_stays_under_64_kb_at_700_agents(fresh_redis: RedisServer) -> None:
    admin = fresh_redis.client()
    admin.set(heartbeat_buckets_key(P), "1")  # an operator that reads the buckets runs
    shared = SharedConnections()
    try:
        for w in writers(fresh_redis.url, shared, range(BEATING)):
            w.beat()
        size, key = largest(admin)
        assert size < BOUND, f"{key} holds {size} bytes with {BEATING} agents (bound {BOUND})"
        assert not admin.exists(heartbeat_legacy_index_key(P)), "nothing written to the unbucketed index"
        fleet = asyncio.run(_read(fresh_redis.url))
        assert len(fleet.beats) == BEATING and fleet.largest_bucket < 40, "every heartbeat read, in small buckets"
    finally:
        shared.close()
        admin.close()


def test_a_reader_reads_the_previous_releases_index_and_a_writer_feeds_it_until_told(
        fresh_redis: RedisServer) -> None:
    admin = fresh_redis.client()
    shared = SharedConnections()
    try:
        new, old = writers(fresh_redis.url, shared, range(2))
        new.beat()  # no operator says it reads the buckets: the unbucketed index gets it too
        assert admin.zscore(heartbeat_legacy_index_key(P), new.id) is not None
        # a process of the previous release: its heartbeat in the unbucketed index only
        old.beat()
        admin.zrem(f"{P}:agent:index:" + old._keys(old.id)[1].rsplit(":", 1)[1], old.id)
        fleet = asyncio.run(_read(fresh_redis.url))
        assert sorted(b.id for b in fleet.beats) == sorted([new.id, old.id]), "the unbucketed index is read too"
        admin.set(heartbeat_buckets_key(P), "1")
        admin.delete(heartbeat_legacy_index_key(P))
        new.beat()
        assert not admin.exists(heartbeat_legacy_index_key(P)), "once told, the bucket only"
    finally:
        shared.close()
        admin.close()


async def _read(url: str) -> Any:
    client = client_for(url, asynchronous=True)
    try:
        return await read_fleet(client, P)
    finally:
        await client.aclose()


async def test_the_limit_parts_stay_under_64_kb_at_900_spending_pods(fresh_redis: RedisServer) -> None:
    client = client_for(fresh_redis.url, asynchronous=True)
    spec = BudgetLimit("daily", arg="amount", max_total=CAP, window=86_400).spec()
    stores = [RedisLimitStore(client=client, part=f"fleet/payments-agent-7d9f8b6c5d-{i:05d}") for i in range(SPENDING)]
    try:
        for i, store in enumerate(stores):
            assert (await store.debit([Charge("daily", "*", 10.0, CAP, 86_400)], f"d-{i}")).ok
        admin = fresh_redis.client()
        size, key = largest(admin)
        admin.close()
        assert size < BOUND, f"{key} holds {size} bytes with {SPENDING} spending pods (bound {BOUND})"
        (row,) = await stores[0].usage([spec])
        assert (row.used, row.entries) == (CAP, SPENDING), "every part counted"
        over = await stores[1].debit([Charge("daily", "*", 10.0, CAP, 86_400)], "over")
        assert not over.ok and over.used == (CAP,), "the cap holds over every part"
    finally:
        await client.aclose()
