"""A Redis request whose reply is lost after the server ran it is repeated, and lands once.

Through a proxy that forwards a request to the real server, reads the reply and closes
the caller's connection instead of handing it over (``fixtures.reply_proxy``), each
store that repeats is checked both ways: one lost reply is repeated and the request
lands exactly once (a claim taken once with its own token, a ledger entry journaled
once, a lock held once, a compare-and-set applied once, a lever read); replies lost on
every allowed attempt refuse the call with a message that says the connection was lost
and why, names the store without its password, and leaves no double effect. Kill-switch
writes are repeated too (a lever already stored as written changes nothing), up to five
times, and a change is counted once.

On a 3-master cluster (its own, as ``test_redis_cluster.py``), claims, ledger writes (a
resolved saga's journal entry with its claim's release among them) and semantic locks
run while their slot migrates twice: redis-py's cluster client closes the connections in
use to re-read the topology, the calls repeat, and every one lands once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from agent_saga.controls.approvals import ApprovalRequest, Decision
from agent_saga.controls.approvals._redis import RedisApprovalStore
from agent_saga.controls.approvals._store import ApprovalStoreUnavailable
from agent_saga.controls.killswitch import Lever
from agent_saga.controls.killswitch._redis import RedisSwitchStore
from agent_saga.controls.killswitch._store import SwitchStoreUnavailable
from agent_saga.errors import ConfigurationError
from agent_saga.isolation import LockStoreUnavailable, RedisSemanticLocks, SemanticLockTimeout
from agent_saga.recovery import (
    ClaimStoreUnavailable,
    LedgerEntry,
    LedgerKind,
    RedisClaimLock,
    RedisLedger,
)
from agent_saga.recovery.ledger import Escalation
from fixtures.procs import open_tcp_to
from fixtures.redis_ha import RedisClusterGroup
from fixtures.redis_server import RedisServer
from fixtures.reply_proxy import ReplyDroppingProxy

PROXY = "a proxy in front of one server: a cluster client follows MOVED to the nodes' own addresses, past the proxy"
LOST = r"lost its connection during .*the connection closed before the reply came; 2 attempt\(s\)"


@pytest.fixture
def proxy(fresh_redis: RedisServer) -> Iterator[ReplyDroppingProxy]:
    with ReplyDroppingProxy(fresh_redis.port) as p:
        yield p


@pytest.fixture
def direct(fresh_redis: RedisServer) -> Iterator[Any]:
    """A client of the server itself, past the proxy (closed after the test)."""
    client = fresh_redis.client()
    try:
        yield client
    finally:
        client.close()


# ---------------------------------------------------------------------------- claims

@pytest.mark.single_redis(PROXY)
async def test_a_claim_whose_reply_is_lost_is_repeated_and_taken_once_with_its_token(
        fresh_redis: RedisServer, proxy: ReplyDroppingProxy, direct: Any) -> None:
    lock, rival = RedisClaimLock(proxy.url, owner="a"), RedisClaimLock(fresh_redis.url, owner="b")
    try:
        warm = await lock.acquire("warm", 30)  # the scripts are loaded: the next call runs at once
        assert warm is not None
        await lock.release(warm)
        assert await lock.renew(warm) is False
        proxy.arm(1)
        claim = await lock.acquire("s-1", 30)
        assert proxy.dropped == 1, "the claim ran and its reply was lost"
        assert claim is not None, "the repeat found the claim its first attempt took"
        assert direct.get(lock.key("s-1")).decode() == claim.token, "held once, with the caller's token"
        assert await rival.acquire("s-1", 30) is None
        proxy.arm(1)
        assert await lock.renew(claim) is True and proxy.dropped == 1
        proxy.arm(1)
        await lock.release(claim)
        assert proxy.dropped == 1 and direct.get(lock.key("s-1")) is None, "released"
        assert await rival.acquire("s-1", 30) is not None
    finally:
        await lock.close()
        await rival.close()


@pytest.mark.single_redis(PROXY)
async def test_a_claim_whose_every_reply_is_lost_is_refused_and_never_used(
        fresh_redis: RedisServer, proxy: ReplyDroppingProxy, direct: Any) -> None:
    lock = RedisClaimLock(f"redis://:s3cret@127.0.0.1:{proxy.port}/0", owner="a")
    direct.config_set("requirepass", "s3cret")
    try:
        assert await lock.acquire("warm", 30) is not None
        proxy.arm(2)  # the default on one server: one repeat, so both attempts lose their reply
        with pytest.raises(ClaimStoreUnavailable, match=LOST) as err:
            await lock.acquire("s-2", 30)
        assert proxy.dropped == 2
        text = str(err.value)
        assert "s3cret" not in text and "Redis at redis://:***@127.0.0.1" in text and "claiming s-2" in text
        assert "nothing was claimed or acted on" in text and "expires with its ttl" in text
        direct.config_set("requirepass", "")
        keys = [k.decode() for k in direct.keys(lock.key("s-2*"))]
        assert keys == [lock.key("s-2")], "one claim, from the first attempt; the repeat found it, wrote nothing"
        assert 0 < direct.pttl(lock.key("s-2")) <= 30_000, "it expires with its ttl, unused"
    finally:
        direct.config_set("requirepass", "")
        await lock.close()


def test_a_negative_or_non_integer_retries_is_refused_naming_the_field() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigurationError, match="retries must be >= 0"):
            RedisClaimLock("redis://127.0.0.1:1/0", retries=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="retries must be >= 0"):
            RedisApprovalStore("redis://127.0.0.1:1/0", retries=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"marker_ttl must be a number of seconds >= 24 .*socket_timeout=5"):
        RedisLedger("redis://127.0.0.1:1/0", marker_ttl=10)
    RedisLedger("redis://127.0.0.1:1/0", marker_ttl=10, socket_timeout=1.0)  # 4 x 2 s: long enough


# ---------------------------------------------------------------------------- ledger

def entry(kind: LedgerKind, token: str) -> LedgerEntry:
    return LedgerEntry(kind, token, "saga-1", "saga-1/0", "d1")


@pytest.mark.single_redis(PROXY)
async def test_ledger_writes_whose_reply_is_lost_are_repeated_and_journaled_once(
        fresh_redis: RedisServer, proxy: ReplyDroppingProxy, direct: Any) -> None:
    ledger = RedisLedger(proxy.url, namespace="rep")
    journal = "{rep}:recovery:journal"
    try:
        await ledger.record(entry(LedgerKind.SAGA, "warm"))
        assert direct.xlen(journal) == 1
        proxy.arm(1)
        await ledger.record(entry(LedgerKind.ATTEMPT, "tok-1"))
        assert proxy.dropped == 1
        assert await ledger.attempts("tok-1") == 1, "counted once"
        proxy.arm(1)
        await ledger.record(entry(LedgerKind.DONE, "tok-1"))
        assert proxy.dropped == 1 and await ledger.completed(["tok-1", "tok-2"]) == {"tok-1"}
        esc = Escalation("esc-1", "saga-1", "saga-1/0", "wire.send", "IRREVERSIBLE", "manual", "why", False,
                         "log", "d1", time.time())
        proxy.arm(1)
        assert await ledger.escalate(esc) is True, "the repeat answers what its first attempt did: recorded"
        assert proxy.dropped == 1
        proxy.arm(1)
        assert await ledger.resolve_escalation("esc-1", by="oncall") is True, "closed by its first attempt"
        assert proxy.dropped == 1 and await ledger.escalations() == []
        assert direct.xlen(journal) == 4, "saga, attempt, done, escalation: each journaled once"
        proxy.arm(1, b"HGET")
        assert await ledger.attempts("tok-1") == 1 and proxy.dropped == 1, "a read is repeated"
    finally:
        await ledger.close()


@pytest.mark.single_redis(PROXY)
async def test_a_ledger_write_whose_every_reply_is_lost_is_refused_and_written_once(
        fresh_redis: RedisServer, proxy: ReplyDroppingProxy, direct: Any) -> None:
    ledger = RedisLedger(proxy.url, namespace="rep", retries=2)
    try:
        await ledger.record(entry(LedgerKind.SAGA, "warm"))
        proxy.arm(3)
        with pytest.raises(ClaimStoreUnavailable, match=r"lost its connection during journaling attempt.*3 attempt"):
            await ledger.record(entry(LedgerKind.ATTEMPT, "tok-1"))
        assert proxy.dropped == 3
        assert await ledger.attempts("tok-1") == 1, "three attempts ran, the first counted, the repeats found it"
        assert direct.xlen("{rep}:recovery:journal") == 2, "journaled once"
        # A done entry, written after its compensation ran: the refusal says so, and what follows.
        proxy.arm(3)
        with pytest.raises(ClaimStoreUnavailable, match=r"lost its connection during journaling done of") as err:
            await ledger.record(entry(LedgerKind.DONE, "tok-1"))
        text = str(err.value)
        assert "the compensation ran; its done entry may have been written (once) or not" in text
        assert "if not, the next sweep calls it again, with the same idempotency key" in text
        assert "nothing was" not in text
        assert await ledger.completed(["tok-1"]) == {"tok-1"}, "here it was: the next sweep calls nothing again"
    finally:
        await ledger.close()


@pytest.mark.single_redis(PROXY)
async def test_a_journal_and_release_whose_reply_is_lost_journals_the_saga_once_and_frees_only_its_claim(
        fresh_redis: RedisServer, proxy: ReplyDroppingProxy, direct: Any) -> None:
    ledger = RedisLedger(proxy.url, namespace="rep", retries=2)
    lock = RedisClaimLock(proxy.url, namespace="rep", owner="me")
    journal = "{rep}:recovery:journal"

    def sagas() -> list[str]:
        return [json.loads(f[b"e"])["saga"] for _id, f in direct.xrange(journal) if b'"kind":"saga"' in f[b"e"]]

    def closing(saga: str) -> LedgerEntry:
        return LedgerEntry(LedgerKind.SAGA, saga, saga, None, "d1", detail={"status": "SAGA_ROLLED_BACK"})

    try:
        await ledger.record(entry(LedgerKind.ATTEMPT, "warm"))  # the script is loaded: the next call runs at once
        mine = await lock.acquire("saga-1", 30)
        assert mine is not None and ledger.releases_for(lock)
        proxy.arm(1, b'"kind":"saga"')
        assert await ledger.record_release(closing("saga-1"), lock, mine) is True, "the first attempt's answer"
        assert proxy.dropped == 1
        assert sagas() == ["saga-1"], "the repeat found the marker: journaled once"
        assert direct.exists(lock.key("saga-1")) == 0, "the claim released"
        # A claim that expired and was taken by another daemon: journaled once, theirs kept.
        stale = await lock.acquire("saga-2", 30)
        assert stale is not None
        direct.set(lock.key("saga-2"), "theirs")
        proxy.arm(1, b'"kind":"saga"')
        assert await ledger.record_release(closing("saga-2"), lock, stale) is False
        assert proxy.dropped == 1 and sagas() == ["saga-1", "saga-2"]
        assert direct.get(lock.key("saga-2")) == b"theirs", "the repeat freed nothing but a claim holding its token"
        # Every reply lost: refused, and still journaled once, the claim released once.
        last = await lock.acquire("saga-3", 30)
        assert last is not None
        proxy.arm(3, b'"kind":"saga"')
        with pytest.raises(ClaimStoreUnavailable, match=r"lost its connection during journaling saga of saga-3 and "
                                                         r"releasing its claim.*3 attempt"):
            await ledger.record_release(closing("saga-3"), lock, last)
        assert proxy.dropped == 3 and sagas() == ["saga-1", "saga-2", "saga-3"]
        assert direct.exists(lock.key("saga-3")) == 0
    finally:
        await ledger.close()
        await lock.close()


# ---------------------------------------------------------------------------- semantic locks

LockPair = tuple[RedisSemanticLocks, RedisSemanticLocks]


@pytest.fixture
async def semantic_locks(fresh_redis: RedisServer, proxy: ReplyDroppingProxy) -> AsyncIterator[LockPair]:
    """``(locks, rival)``: one namespace's semantic locks through the proxy, and a rival's on
    the server itself, past the proxy (both closed after the test)."""
    locks = RedisSemanticLocks(proxy.url, namespace="rep")
    rival = RedisSemanticLocks(fresh_redis.url, namespace="rep")
    try:
        yield locks, rival
    finally:
        await locks.close()
        await rival.close()


@pytest.mark.single_redis(PROXY)
async def test_semantic_lock_calls_whose_reply_is_lost_are_repeated_and_hold_once(
        proxy: ReplyDroppingProxy, semantic_locks: LockPair) -> None:
    locks, rival = semantic_locks
    warm = await locks.acquire("warm", "saga-w", wait=0)  # the three scripts are loaded
    assert await locks.renew(warm) and await locks.release("warm", "saga-w")
    proxy.arm(1)
    claim = await locks.acquire("account:1", "saga-1", wait=0)
    assert proxy.dropped == 1 and await rival.holder("account:1") == "saga-1"
    with pytest.raises(SemanticLockTimeout):
        await rival.acquire("account:1", "saga-2", wait=0)
    proxy.arm(1)
    assert await locks.renew(claim) is True and proxy.dropped == 1
    proxy.arm(1)
    assert await locks.release("account:1", "saga-1") is True, "the repeat finds it freed by its first attempt"
    assert proxy.dropped == 1 and await rival.holder("account:1") is None
    assert await locks.release("account:1", "saga-1") is False, "a release not repeated still says: lapsed"
    proxy.arm(1, b"GET")
    assert await locks.holder("account:1") is None and proxy.dropped == 1


@pytest.mark.single_redis(PROXY)
async def test_a_lock_acquire_whose_every_reply_is_lost_is_refused_holding_once(
        proxy: ReplyDroppingProxy, semantic_locks: LockPair) -> None:
    locks, rival = semantic_locks
    await locks.acquire("warm", "saga-w", wait=0)  # the script is loaded: the next call runs at once
    proxy.arm(2)
    with pytest.raises(LockStoreUnavailable, match=LOST) as err:
        await locks.acquire("account:2", "saga-1", lease=5, wait=0)
    assert "claiming 'account:2'" in str(err.value) and "lapses with its lease" in str(err.value)
    assert await rival.holder("account:2") == "saga-1", "held once, by its saga, until its lease runs out"


# ---------------------------------------------------------------------------- kill switch

@pytest.mark.single_redis(PROXY)
def test_the_kill_switch_repeats_a_read_and_a_write_whose_reply_is_lost_and_counts_a_change_once(
        fresh_redis: RedisServer, proxy: ReplyDroppingProxy, direct: Any) -> None:
    prefix = "agentsaga:v1"
    writer = RedisSwitchStore(fresh_redis.url, grace=5, prefix=prefix)
    reader = RedisSwitchStore(proxy.url, grace=5, prefix=prefix)
    try:
        lever = Lever.new("Halt", "tool:stripe.*", reason="incident", by="soc@corp", now=time.time(), ttl=600)
        writer.engage(lever)
        assert [lv.id for lv in reader.levers()] == [lever.id]
        proxy.arm(1)
        assert [lv.id for lv in reader.levers()] == [lever.id] and proxy.dropped == 1, "the read was repeated"
        proxy.arm(6)
        with pytest.raises(SwitchStoreUnavailable, match=r"RedisSwitchStore\(redis://127.0.0.1:\d+/0\) lost its "
                                                         r"connection during a read.*6 attempt"):
            reader.levers()
        rev = int(direct.get(f"{prefix}:rev"))
        proxy.arm(1)
        reader.engage(Lever.new("Halt", "tool:wire.*", reason="x", by="soc@corp", now=time.time(), ttl=600))
        assert proxy.dropped == 1 and len(reader.last_repeats) == 1
        assert int(direct.get(f"{prefix}:rev")) == rev + 1, "the write ran twice: one change counted, not two"
        proxy.arm(6)
        with pytest.raises(SwitchStoreUnavailable, match="lost its connection during a write .*6 attempt.*could not "
                                                         "be stored: it may have been written"):
            reader.engage(Lever.new("Halt", "tool:mail.*", reason="x", by="soc@corp", now=time.time(), ttl=600))
        assert int(direct.get(f"{prefix}:rev")) == rev + 2, "six attempts ran: one change counted"
    finally:
        writer.close()
        reader.close()


# ---------------------------------------------------------------------------- approvals

def request(rid: str) -> ApprovalRequest:
    now = time.time()
    return ApprovalRequest(rid, "s", "s/0", "wire.send", "irreversible", "", "sha256:x", "1", now, now + 60)


@pytest.mark.single_redis(PROXY)
def test_approval_calls_whose_reply_is_lost_are_repeated_and_land_once(
        fresh_redis: RedisServer, proxy: ReplyDroppingProxy, direct: Any) -> None:
    store = RedisApprovalStore(proxy.url)
    try:
        store.create(request("ab" * 16))  # the scripts are loaded
        store.decide("ab" * 16, Decision("Denied", "oncall@corp", time.time(), ""))
        req = request("cd" * 16)
        proxy.arm(1)
        stored, created = store.create(req)
        assert proxy.dropped == 1 and created is True, "the repeat found its own document: created, once"
        assert direct.zscore(store.pending_key, req.id) is not None
        proxy.arm(1)
        used = store.update(req.id, lambda r: None if r.consumed_by else _consume(r))
        assert proxy.dropped == 1 and used is not None and used.consumed_by == "agent-1", "applied once"
        rev = int(direct.get(store.rev_key))
        proxy.arm(1)
        decided = store.decide(req.id, Decision("Approved", "oncall@corp", time.time(), ""))
        assert proxy.dropped == 1 and decided is not None and decided.decision is not None
        assert decided.decision.state == "Approved" and decided.decision.approver == "oncall@corp"
        assert int(direct.get(store.rev_key)) == rev + 1, "decided once: one change counted"
        assert direct.zscore(store.pending_key, req.id) is None
        proxy.arm(1, b"MGET")
        got = store.get(req.id)
        assert proxy.dropped == 1 and got is not None and got.consumed_by == "agent-1"
    finally:
        store.close()


def _consume(r: ApprovalRequest) -> ApprovalRequest:
    from dataclasses import replace

    return replace(r, consumed_at=time.time(), consumed_by="agent-1")


@pytest.mark.single_redis(PROXY)
def test_an_approval_request_whose_every_reply_is_lost_is_refused_and_asked_once(
        fresh_redis: RedisServer, proxy: ReplyDroppingProxy, direct: Any) -> None:
    store = RedisApprovalStore(proxy.url)
    try:
        store.create(request("ab" * 16))
        req = request("ef" * 16)
        proxy.arm(2)
        with pytest.raises(ApprovalStoreUnavailable, match=LOST) as err:
            store.create(req)
        assert "RedisApprovalStore(redis://127.0.0.1:" in str(err.value) and "denied" in str(err.value)
        assert proxy.dropped == 2
        assert direct.zcard(store.pending_key) == 2, "asked once: the repeat found its request written"
        assert store.create(req)[1] is False, "and it is there for the next try"
    finally:
        store.close()


# ---------------------------------------------------------------------------- on a cluster

def test_claims_ledger_writes_and_locks_land_once_while_their_slot_migrates(redis_cluster: RedisClusterGroup) -> None:
    redis_cluster.flush()
    counts = {"claims": 0, "attempts": 0, "locks": 0, "sagas": 0}

    async def run() -> None:
        # A bound wide enough for ten callers on a loaded machine: every call must land here
        # (the default bound, and what is refused past it, are tested above).
        lock = RedisClaimLock(redis_cluster.url, owner="m", namespace="mig", retries=8)
        ledger = RedisLedger(redis_cluster.url, namespace="mig", retries=8)
        locks = RedisSemanticLocks(redis_cluster.url, namespace="mig", retries=8)
        moved = asyncio.Event()
        from agent_saga._redis import key_slot

        slot = key_slot(lock.key("x"))
        assert key_slot(locks.key("x")) == slot == key_slot("{mig}:recovery:journal")

        async def claimer(i: int) -> None:
            k = 0
            while not moved.is_set() or k < 10:
                claim = await lock.acquire(f"s-{i}-{k}", 30)
                assert claim is not None, "a free saga is claimed, also across a lost reply"
                await ledger.record(entry(LedgerKind.ATTEMPT, f"t-{i}"))
                if k % 2:
                    await lock.release(claim)
                else:  # a resolved saga: its journal entry and its claim's release in one op
                    saga = f"s-{i}-{k}"
                    await ledger.record_release(LedgerEntry(LedgerKind.SAGA, saga, saga, None, "m"), lock, claim)
                    counts["sagas"] += 1
                counts["claims"] += 1
                counts["attempts"] += 1
                k += 1

        async def locker(i: int) -> None:
            k = 0
            while not moved.is_set() or k < 10:
                await locks.acquire(f"r-{i}-{k}", f"saga-{i}", wait=0)
                assert await locks.release(f"r-{i}-{k}", f"saga-{i}") is True
                counts["locks"] += 1
                k += 1

        task = asyncio.gather(*(claimer(i) for i in range(4)), *(locker(i) for i in range(6)))
        try:
            while counts["locks"] < 10:
                await asyncio.sleep(0.01)
            first = redis_cluster.owner(slot)
            for _ in range(2):
                await asyncio.to_thread(redis_cluster.migrate_slot, slot)
            assert redis_cluster.owner(slot) is not first, "the slot moved (twice) while the calls ran"
            moved.set()
            await asyncio.wait_for(task, 120)
            total = sum([await ledger.attempts(f"t-{i}") for i in range(4)])
            assert total == counts["attempts"], "every attempt counted once, none twice"
            with redis_cluster.client() as direct, redis_cluster.owner(slot).client() as owner:  # the namespace's one slot
                journal = [json.loads(f[b"e"]) for _id, f in direct.xrange("{mig}:recovery:journal")]
                assert len(journal) == counts["attempts"] + counts["sagas"], "journaled once each"
                sagas = [e["saga"] for e in journal if e["kind"] == "saga"]
                assert len(sagas) == len(set(sagas)) == counts["sagas"], "each resolved saga journaled once"
                assert owner.keys("{mig}:recovery:journal") and not owner.keys("{mig}:recovery:claim:*")
                assert not owner.keys("{mig}:lock:*"), "every claim and lock released, none left behind"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await lock.close()
            await ledger.close()
            await locks.close()

    asyncio.run(run())
    assert counts["locks"] >= 60 and counts["claims"] >= 40


def test_a_claim_on_a_cluster_whose_nodes_dropped_their_clients_is_repeated_or_refused_saying_so(
        redis_cluster: RedisClusterGroup) -> None:
    ports = {n.port for n in redis_cluster.nodes}

    async def run() -> None:
        before = open_tcp_to(ports)
        lock = RedisClaimLock(redis_cluster.url, owner="k", namespace="kill", retries=0)
        try:
            assert await lock.acquire("warm", 5.0) is not None
            redis_cluster.command("CLIENT", "KILL", "TYPE", "normal")  # every node drops its clients
            with pytest.raises(ClaimStoreUnavailable, match=r"lost its connection during claiming s-1 .*1 attempt"):
                await lock.acquire("s-1", 5.0)
        finally:
            await lock.close()
        assert open_tcp_to(ports) == before, "closed after the failure: no socket left open"
        again = RedisClaimLock(redis_cluster.url, owner="k", namespace="kill")
        try:
            redis_cluster.command("CLIENT", "KILL", "TYPE", "normal")
            claim = await again.acquire("s-2", 5.0)
            assert claim is not None, "by default the loss is repeated: claimed"
            with redis_cluster.client() as direct:
                assert direct.get(again.key("s-2")).decode() == claim.token
        finally:
            await again.close()

    asyncio.run(run())
