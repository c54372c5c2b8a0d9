"""Claims, releases and journal writes made in one event-loop turn share one round trip to a
real Redis, and each caller still gets exactly its own answer.

A daemon's workers move in step (the WAL's group commit wakes them together), so their
claims, releases and ledger writes arrive in the same turn: one script over the claim
keys, one pipeline for the journal. Batching must not weaken anything: a claim held by
another is refused inside a batch as it is alone, a release frees only the caller's own
claim, a store that cannot be reached fails every caller of the batch.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent_saga.recovery import (
    ClaimStoreUnavailable,
    LedgerEntry,
    LedgerKind,
    RedisClaimLock,
    RedisLedger,
)
from agent_saga.recovery.claims import Claim


async def test_claims_of_one_turn_are_one_script_and_stay_exclusive(fresh_redis: Any) -> None:
    a, b = RedisClaimLock(fresh_redis.url, owner="a"), RedisClaimLock(fresh_redis.url, owner="b")
    try:
        held = await b.acquire("s3", 30)
        assert held is not None
        # Eight claims in one turn, one of them a saga b holds and one asked twice.
        names = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s0"]
        claims = await asyncio.gather(*(a.acquire(n, 30) for n in names))
        assert a._acquires.batches == 1 and a._acquires.items == 8
        taken = [c.name if c is not None else None for c in claims]
        assert taken == ["s0", "s1", "s2", None, "s4", "s5", "s6", None], "b's claim and a repeat are refused"
        assert len({c.token for c in claims if c is not None}) == 6
        # Releases of one turn: one script; b's claim is not a's to free.
        stale = claims[0]
        assert stale is not None
        await asyncio.gather(*(a.release(c) for c in claims if c is not None),
                             a.release(Claim("s3", "a:not-the-token", 30)))
        assert a._releases.batches == 1
        assert await b.acquire("s0", 30) is not None, "a released s0"
        assert await a.acquire("s3", 30) is None, "b's claim survived a's releases"
        await a.release(stale)  # a's old token: b's new claim on s0 stays
        assert await a.acquire("s0", 30) is None
        assert await b.renew(held)
    finally:
        await a.close()
        await b.close()


async def test_journal_writes_of_one_turn_are_one_pipeline_each_durable_for_its_caller(fresh_redis: Any) -> None:
    ledger = RedisLedger(fresh_redis.url, namespace="batch")
    try:
        entries = [LedgerEntry(LedgerKind.DONE, f"tok-{i}", f"saga-{i}", f"saga-{i}/0", "d1") for i in range(6)]
        attempt = LedgerEntry(LedgerKind.ATTEMPT, "tok-9", "saga-9", "saga-9/0", "d1")
        await asyncio.gather(*(ledger.record(e) for e in entries), ledger.record(attempt), ledger.record(attempt))
        assert ledger._writes.batches == 1
        assert await ledger.completed([f"tok-{i}" for i in range(8)]) == {f"tok-{i}" for i in range(6)}
        assert await ledger.attempts("tok-9") == 2
        done, left = await asyncio.gather(ledger.completed(["tok-1", "tok-7"]), ledger.completed(["tok-9"]))
        assert (done, left) == ({"tok-1"}, set()), "each caller gets its own answer"
    finally:
        await ledger.close()


async def test_a_store_that_cannot_be_reached_fails_every_caller_of_the_batch(fresh_redis: Any) -> None:
    lock = RedisClaimLock(fresh_redis.url, owner="a", socket_timeout=2.0)
    ledger = RedisLedger(fresh_redis.url, namespace="batch", socket_timeout=2.0)
    try:
        assert await lock.acquire("warm", 30) is not None
        fresh_redis.stop()
        results = await asyncio.gather(*(lock.acquire(f"s{i}", 30) for i in range(4)),
                                       *(ledger.record(LedgerEntry(LedgerKind.DONE, f"t{i}", "s", None, "d"))
                                         for i in range(3)), return_exceptions=True)
        assert all(isinstance(r, ClaimStoreUnavailable) for r in results), results
        assert all("nothing was claimed or acted on" in str(r) for r in results[:4]), "the claims"
        assert all("the compensation ran, but its done entry was not written" in str(r) for r in results[4:])
    finally:
        fresh_redis.start()
        await lock.close()
        await ledger.close()


async def test_a_lone_request_is_sent_alone(fresh_redis: Any) -> None:
    lock = RedisClaimLock(fresh_redis.url, owner="a")
    try:
        claim = await lock.acquire("one", 30)
        assert claim is not None and (lock._acquires.batches, lock._acquires.items) == (1, 1)
        await lock.release(claim)
        assert await lock.acquire("one", 30) is not None
    finally:
        await lock.close()
