"""A 3-master Redis Cluster (``redis-cli --cluster create``): the Redis stores through a
``redis+cluster://`` URL, with the documented hash-tagged prefixes, and a slot migration
in the middle of a run (``CLUSTER SETSLOT IMPORTING/MIGRATING``, ``MIGRATE``, ``SETSLOT
NODE``: the clients follow the MOVED that follows).

The cross-section, one test per kind of data: the RedisWAL (8 sagas appending while its
slot moves to another master; every acknowledged record read back, the chain verified),
the spend counters (4 callers spending one budget while its slot moves: exactly the
budget authorised), the recovery claims, the kill switch and the approval store on the
policy plane (``{agentsaga}`` prefix), and the operator's projection read by a limit
source that follows an edit. A key prefix without a hash tag is refused at open, naming
the fix; ``wait_replicas`` / ``min_replicas`` are refused on a cluster (WAIT needs the
connection that wrote). ``make test-redis-cluster`` runs the whole Redis suite on a cluster.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from datetime import UTC, datetime

import pytest
from agent_saga import verify_records
from agent_saga._redis import key_slot
from agent_saga.controls.approvals import ApprovalRequest, Decision
from agent_saga.controls.approvals._redis import RedisApprovalStore
from agent_saga.controls.killswitch import Lever
from agent_saga.controls.killswitch._redis import RedisSwitchStore
from agent_saga.controls.limits import Charge, LimitStoreUnavailable, RedisLimitStore
from agent_saga.errors import ConfigurationError
from agent_saga.recovery.errors import ClaimStoreUnavailable
from agent_saga.recovery.redis import RedisClaimLock
from agent_saga.wal.readers import open_reader
from agent_saga.wal.redis import RedisWAL
from fixtures.polling import until, until_async
from fixtures.redis_ha import RedisClusterGroup

PLANE = "{agentsaga}:v1"
WAL_KEY = "{agent-saga}:wal"


def test_the_wal_keeps_appending_while_its_slot_migrates_and_reads_back_verified(redis_cluster: RedisClusterGroup) -> None:
    redis_cluster.flush()
    slot = key_slot(WAL_KEY)
    before = redis_cluster.owner(slot)
    wal = RedisWAL(redis_cluster.url, key=WAL_KEY, writer="c-1", socket_timeout=2.0)
    acked: list[tuple[str, int]] = []
    moved = threading.Event()

    async def saga(i: int) -> None:
        k = 0
        while not moved.is_set() or k < 5:
            await wal.barrier(wal.append("STEP_COMMITTED", f"s-{i}", None, {"k": k}))
            acked.append((f"s-{i}", k))
            k += 1

    async def run() -> None:
        task = asyncio.gather(*(saga(i) for i in range(8)))
        await until_async("the writers to make progress", lambda: len(acked) >= 40, timeout=30)
        await asyncio.to_thread(redis_cluster.migrate_slot, slot)
        moved.set()
        await asyncio.wait_for(task, 60)

    try:
        asyncio.run(run())
    finally:
        wal.close()
    assert redis_cluster.owner(slot) is not before, "the WAL's slot moved to another master mid-run"
    reader = open_reader(f"{redis_cluster.url}?key={WAL_KEY}")
    try:
        present = [(r.saga, (r.payload or {})["k"]) for r in reader.records() if r.type == "STEP_COMMITTED"]
        assert sorted(present) == sorted(acked)
        assert verify_records(reader.chain("c-1")).ok
    finally:
        reader.close()


def test_a_wal_key_without_a_hash_tag_is_refused_naming_the_fix(redis_cluster: RedisClusterGroup) -> None:
    with pytest.raises(ConfigurationError, match=r"give the key prefix one hash tag.*\{agent-saga\}:wal"):
        RedisWAL(redis_cluster.url, key="agent-saga:wal", writer="c-2")
    with pytest.raises(ConfigurationError, match="not available on a Redis Cluster"):
        RedisWAL(redis_cluster.url, key=WAL_KEY, writer="c-3", wait_replicas=1)


def test_a_budget_spent_by_concurrent_callers_holds_across_a_slot_migration(redis_cluster: RedisClusterGroup) -> None:
    redis_cluster.flush()
    store = RedisLimitStore(redis_cluster.url, namespace="cluster-budget")
    charge = [Charge("spend", "fleet", 1.0, 30.0, 3600.0)]
    slot = key_slot(store._keys[0])
    before = redis_cluster.owner(slot)
    verdicts: list[bool] = []
    unavailable: list[str] = []
    moved = asyncio.Event()

    async def spender(i: int) -> None:
        k = 0
        while not moved.is_set() or k < 10:  # debits before, during and after the move
            try:
                verdicts.append((await store.debit(charge, f"d-{i}-{k}")).ok)
            except LimitStoreUnavailable as exc:
                # The slot's keys half moved (TRYAGAIN) for longer than the client's
                # redirects last: the script did not run, and the store fails closed.
                unavailable.append(exc.message)
                verdicts.append(False)
            k += 1

    async def run() -> None:
        task = asyncio.gather(*(spender(i) for i in range(4)))
        await until_async("10 debits before the migration", lambda: len(verdicts) >= 10, timeout=30)
        await asyncio.to_thread(redis_cluster.migrate_slot, slot)
        moved.set()
        try:
            await asyncio.wait_for(task, 60)
        finally:
            await store.aclose()  # also when a spender failed: nothing leaks into the next test

    asyncio.run(run())
    assert redis_cluster.owner(slot) is not before, "the counters' slot moved to another master mid-run"
    assert len(verdicts) > 30 and sum(verdicts) == 30, "exactly the budget: the counters moved with their slot"
    assert all("failed during debit" in why for why in unavailable), unavailable  # refused, never counted

    async def replicated() -> None:
        s = RedisLimitStore(redis_cluster.url, namespace="x", min_replicas=1)
        try:
            with pytest.raises(ConfigurationError, match="not available on a Redis Cluster"):
                await s.debit(charge, "d")
        finally:
            await s.aclose()

    asyncio.run(replicated())


def test_a_budget_split_between_two_masters_by_a_multi_batch_reshard_is_refused_never_exceeded(
        redis_cluster: RedisClusterGroup) -> None:
    """A reshard moves the counters' keys one MIGRATE at a time: while the totals are on
    the new master and the log still on the old one, the debit script (both keys) gets
    TRYAGAIN from the cluster. redis-py sends it again a bounded number of times, then
    the debit is refused (``LimitStoreUnavailable``); once both keys moved, spending goes
    on and the budget is spent exactly."""
    redis_cluster.flush()
    store = RedisLimitStore(redis_cluster.url, namespace="cluster-split")
    charge = [Charge("spend", "fleet", 1.0, 30.0, 3600.0)]
    totals, log = store._keys[:2]
    slot = key_slot(totals)
    outcomes: list[str] = []
    moved = asyncio.Event()

    async def spender(i: int) -> None:
        k = 0
        while not moved.is_set() or "over" not in outcomes:  # before, during, after: until the budget refuses
            try:
                outcomes.append("ok" if (await store.debit(charge, f"d-{i}-{k}")).ok else "over")
            except LimitStoreUnavailable as exc:
                # The split itself (TRYAGAIN until redis-py gives up), or redis-py's client
                # closing its connections to re-read the moved slot (retried once first).
                assert "TTL exhausted" in str(exc) or "TRYAGAIN" in str(exc) or "re-read the cluster" in str(exc), exc
                outcomes.append("refused")
            k += 1

    async def run() -> None:
        task = asyncio.gather(*(spender(i) for i in range(4)))
        try:
            await until_async("4 debits before the reshard", lambda: len(outcomes) >= 4, timeout=30)
            await asyncio.to_thread(redis_cluster.begin_migration, slot)
            await asyncio.to_thread(redis_cluster.migrate_keys, slot, [totals])  # batch 1 of 2: the keys are split
            await until_async("debits refused while the keys are split", lambda: outcomes.count("refused") >= 4,
                              timeout=30)
            await asyncio.to_thread(redis_cluster.migrate_keys, slot, [log])  # batch 2 of 2
            await asyncio.to_thread(redis_cluster.end_migration, slot)
            moved.set()
            await asyncio.wait_for(task, 60)
        finally:
            task.cancel()  # a failed step leaves the spenders running: stop them first
            await asyncio.gather(task, return_exceptions=True)
            await store.aclose()  # also when something failed: nothing leaks into the next test

    before = redis_cluster.owner(slot)
    asyncio.run(run())
    assert redis_cluster.owner(slot) is not before, "the counters' slot moved to another master"
    assert outcomes.count("ok") == 30, "the budget, never more, though debits were refused mid-reshard"
    assert set(outcomes) == {"ok", "over", "refused"}


def test_the_operator_projects_limits_a_source_reads_on_a_cluster_and_refuses_an_untagged_prefix(
        redis_cluster: RedisClusterGroup) -> None:
    from agent_saga.controls import RedisLimitSource
    from agent_saga_operator.documents import Identity, budget_limit_doc
    from agent_saga_operator.models import BudgetLimitSpec
    from agent_saga_operator.projection import Projector

    redis_cluster.flush()
    with pytest.raises(ConfigurationError, match=r"operator's projection.*needs a hash tag.*--key-prefix"):
        Projector(redis_cluster.url, prefix="agentsaga")
    who = Identity("payments", "daily-spend", "uid-1", 1, datetime(2026, 7, 1, tzinfo=UTC))

    async def project(max_total: int) -> None:
        projector = Projector(redis_cluster.url, prefix=PLANE.removesuffix(":v1"))
        spec = BudgetLimitSpec.model_validate(
            {"kind": "Budget", "arg": "amount", "maxTotal": max_total, "window": "24h"})
        try:
            await projector.begin_sync("n-1")
            await projector.put("BudgetLimit", who.id, budget_limit_doc(spec, who))
            assert await projector.mark_synced("n-1", now=time.time()) >= 0
        finally:
            await projector.aclose()

    asyncio.run(project(900))
    source = RedisLimitSource(redis_cluster.url, namespaces=["payments"], prefix=PLANE, heartbeat=0.2)
    try:
        source.start()
        assert [s.max_total for s in source.snapshot().specs] == [900]
        assert source.writers_seen == {"operator"}
        asyncio.run(project(500))  # an edit: the running source follows it
        until("the source to read the edit", lambda: [s.max_total for s in source.snapshot().specs] == [500],
              timeout=30)
    finally:
        source.close()


def test_claims_are_exclusive_on_a_cluster(redis_cluster: RedisClusterGroup) -> None:
    async def run() -> None:
        a, b = RedisClaimLock(redis_cluster.url, owner="a"), RedisClaimLock(redis_cluster.url, owner="b")
        try:
            claim = await a.acquire("saga-1", 5.0)
            assert claim is not None
            assert await b.acquire("saga-1", 5.0) is None, "one claim per saga"
            assert await a.renew(claim)
            await a.release(claim)
            assert await b.acquire("saga-1", 5.0) is not None
        finally:
            await a.close()
            await b.close()

    asyncio.run(run())


def sockets_to(ports: set[int]) -> int:
    """How many TCP sockets this process holds open to ``ports`` (from /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/self/net/tcp") as table:
        rows = [line.split() for line in table.read().splitlines()[1:]]
    return sum(1 for r in rows if r[9] in inodes and int(r[2].rsplit(":", 1)[1], 16) in ports)


def test_a_store_closed_after_its_cluster_connections_failed_leaves_no_socket_open(redis_cluster: RedisClusterGroup) -> None:
    ports = {n.port for n in redis_cluster.nodes}

    async def run() -> None:
        # retries=0: with repeats the claim is taken; this test is about the sockets of a failed store.
        lock = RedisClaimLock(redis_cluster.url, owner="leak", socket_timeout=2.0, retries=0)
        before = sockets_to(ports)
        try:
            assert await lock.acquire("leak-warm", 5.0) is not None
            assert sockets_to(ports) > before, "the client connected (the seed for the slot map, the claim's master)"
            redis_cluster.command("CLIENT", "KILL", "TYPE", "normal")  # every node drops its clients
            with pytest.raises(ClaimStoreUnavailable, match="nothing was claimed"):
                await lock.acquire("leak-after", 5.0)
        finally:
            await lock.close()
        assert sockets_to(ports) == before, "closing the store closed every node's connections"

    asyncio.run(run())


def test_the_kill_switch_and_approvals_on_a_cluster_policy_plane(redis_cluster: RedisClusterGroup) -> None:
    redis_cluster.flush()
    switch = RedisSwitchStore(redis_cluster.url, grace=5, prefix=PLANE, socket_timeout=1.0)
    try:
        lever = Lever.new("Halt", "tool:stripe.*", reason="incident", by="soc@corp", now=time.time(), ttl=600)
        switch.engage(lever)
        assert [lv.id for lv in switch.levers()] == [lever.id]
        assert switch.lift(lever.id) is not None
        assert switch.levers() == []
    finally:
        switch.close()
    approvals = RedisApprovalStore(redis_cluster.url, prefix=PLANE)
    try:
        now = time.time()
        req = ApprovalRequest("cd" * 16, "s", "s/0", "wire.send", "irreversible", "", "sha256:x", "1", now, now + 60)
        assert approvals.create(req)[1] is True
        assert approvals.create(req)[1] is False, "asked once"
        assert [r.id for r in approvals.list(pending_only=True)] == [req.id]
        decided = approvals.decide(req.id, Decision("Denied", "oncall@corp", time.time(), ""))
        assert decided is not None and approvals.list(pending_only=True) == []
    finally:
        approvals.close()
