"""Recovery state in a real Redis: claims, the shared ledger, and a daemon over a RedisWAL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga import ActionSemantics, Compensation, compensator, saga_scope, verify_records
from agent_saga.history import ROLLED_BACK, fold
from agent_saga.recovery import (
    ClaimStoreUnavailable,
    Escalation,
    FileLedger,
    LedgerEntry,
    LedgerKind,
    RecoveryDaemon,
    RedisClaimLock,
    RedisLedger,
    escalation_id,
)
from agent_saga.wal.readers import open_reader
from agent_saga.wal.redis import RedisWAL
from fixtures.redis_server import tagged

CALLS: list[tuple[str, str]] = []


@compensator("test.recoveryd.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    CALLS.append((charge_id, idempotency_key))


@pytest.fixture(autouse=True)
def _calls() -> Iterator[None]:
    CALLS.clear()
    yield


async def test_a_claim_admits_one_holder_and_only_the_holder_renews_or_frees_it(fresh_redis) -> None:  # type: ignore[no-untyped-def]
    a, b = RedisClaimLock(fresh_redis.url, owner="a"), RedisClaimLock(fresh_redis.url, owner="b")
    claim = await a.acquire("saga-1", 30)
    assert claim is not None and claim.token.startswith("a:")
    assert await b.acquire("saga-1", 30) is None
    fake = type(claim)(claim.name, "b:forged", claim.ttl)
    assert await b.renew(fake) is False
    await b.release(fake)  # compare-and-delete: not b's, nothing happens
    assert await b.acquire("saga-1", 30) is None
    assert await a.renew(claim) is True
    # A short claim nobody renews expires by itself (polled: no wait longer than needed).
    short = await a.acquire("saga-2", 0.2)
    assert short is not None
    deadline = time.monotonic() + 10
    while (taken := await b.acquire("saga-2", 30)) is None:
        assert time.monotonic() < deadline, "an unrenewed claim never expired"
        await asyncio.sleep(0.02)
    assert await a.renew(short) is False  # the expired holder cannot extend its successor's
    await a.release(short)
    assert await a.acquire("saga-2", 30) is None
    await b.release(taken)
    assert await a.acquire("saga-2", 30) is not None
    await a.close()
    await b.close()


async def test_scripts_survive_a_flushed_script_cache(fresh_redis) -> None:  # type: ignore[no-untyped-def]
    lock = RedisClaimLock(fresh_redis.url)
    claim = await lock.acquire("s", 30)
    assert claim is not None and await lock.renew(claim)
    fresh_redis.client().script_flush()
    assert await lock.renew(claim)  # NOSCRIPT: loaded again, run once
    await lock.close()


async def test_the_ledger_is_shared_and_escalations_are_idempotent(fresh_redis) -> None:  # type: ignore[no-untyped-def]
    a, b = RedisLedger(fresh_redis.url), RedisLedger(fresh_redis.url)
    await a.record(LedgerEntry(LedgerKind.ATTEMPT, "t1", "s", "s/0", "a"))
    assert await b.completed(["t1"]) == set()
    await a.record(LedgerEntry(LedgerKind.DONE, "t1", "s", "s/0", "a"))
    assert await b.completed(["t1", "t2"]) == {"t1"}
    assert await b.attempts("t1") == 1
    esc = Escalation(escalation_id("s", "s/1"), "s", "s/1", "sms.send", "IRREVERSIBLE", "IRREVERSIBLE",
                     "no undo", False, "wal", "a", time.time())
    assert await a.escalate(esc) is True and await b.escalate(esc) is False
    assert [e.id for e in await b.escalations()] == [esc.id]
    assert await b.resolve_escalation(esc.id, by="ops") is True
    assert await a.resolve_escalation(esc.id, by="ops") is False
    assert await a.escalations() == []
    (closed,) = await a.escalations(include_resolved=True)
    assert closed.resolved_by == "ops"
    await a.close()
    await b.close()


async def test_an_unreachable_store_refuses_instead_of_guessing(fresh_redis) -> None:  # type: ignore[no-untyped-def]
    url = fresh_redis.url.replace("127.0.0.1", ":hunter2@127.0.0.1", 1)
    lock, ledger = RedisClaimLock(url, socket_timeout=1), RedisLedger(url, socket_timeout=1)
    fresh_redis.stop()
    with pytest.raises(ClaimStoreUnavailable) as info:
        await lock.acquire("s", 30)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ClaimStoreUnavailable):
        await ledger.completed(["t"])


async def test_a_daemon_over_a_redis_wal_resolves_another_writers_orphan(fresh_redis, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    agent = RedisWAL(fresh_redis.url, key=tagged("rw"), writer="agent-1")

    class Died(BaseException):
        pass

    # The agent commits two charges and "dies": its scope is abandoned without rollback.
    scope = saga_scope(agent, saga_id="s", lease_seconds=1.5)
    saga = await scope.__aenter__()
    for cid in ("c0", "c1"):
        await saga.execute(
            "pay.charge", ActionSemantics.COMPENSABLE, forward=lambda cid=cid: {"id": cid},
            compensate=lambda r: Compensation(handler="test.recoveryd.refund", kwargs={"charge_id": r["id"]}),
        )
    from agent_saga import leases

    assert scope._lease is not None
    leases.unregister(scope._lease)  # a dead process renews nothing
    await agent.barrier()
    agent.close()

    daemon_wal = RedisWAL(fresh_redis.url, key=tagged("rw"), writer="recoveryd-1")
    d = RecoveryDaemon(daemon_wal, ledger=RedisLedger(fresh_redis.url), lock=RedisClaimLock(fresh_redis.url),
                       lease_grace=0)
    rep = await d.sweep()
    assert rep.live == 1 and rep.recovered == 0  # the 1.5 s lease still running
    deadline = time.monotonic() + 10
    while rep.recovered == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
        rep = await d.sweep()
    assert [c for c, _ in CALLS] == ["c1", "c0"]
    again = RecoveryDaemon(daemon_wal, ledger=RedisLedger(fresh_redis.url), lock=RedisClaimLock(fresh_redis.url))
    assert (await again.sweep()).recovered == 0 and len(CALLS) == 2
    await d.close()
    await again.close()
    daemon_wal.close()
    reader = open_reader(f"{fresh_redis.url}?key={tagged('rw')}")
    assert fold(reader.records())["s"].status == ROLLED_BACK
    for writer in reader.chains():  # each writer's chain verifies: the agent's and the daemon's
        assert verify_records(reader.chain(writer)).ok
    reader.close()


async def test_a_local_ledger_behind_a_shared_log_is_warned_about(fresh_redis, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    wal = RedisWAL(fresh_redis.url, key=tagged("rw2"))
    d = RecoveryDaemon(wal, ledger=FileLedger(tmp_path / "j"), lock=RedisClaimLock(fresh_redis.url))
    assert any("may compensate a step twice" in w for w in d.warnings)
    with pytest.raises(Exception, match="needs ledger= and lock="):
        RecoveryDaemon(wal)
    await d.close()
    wal.close()
