"""A resolved saga's journal entry and the release of its claim are one request to a real
Redis (one Lua script, both or neither) when the claims and the ledger share a server and
a namespace; a failure of that request, or a daemon killed on either side of it, leaves
what the order "journal the saga, then release" left: every step compensated exactly
once, the done index complete, the claim released or left to expire.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agent_saga import idempotency_key
from agent_saga.history import ROLLED_BACK
from agent_saga.recovery import LedgerEntry, LedgerKind, RecoveryDaemon, RedisClaimLock, RedisLedger
from agent_saga.recovery.claims import Claim
from agent_saga.wal.redis import RedisWAL

ROOT = Path(__file__).resolve().parents[2]
CHAOS = ROOT / "tests" / "chaos"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHAOS))

from chaos_bank import Bank  # noqa: E402
from fixtures.redis_server import tagged  # noqa: E402
from fixtures.reply_proxy import ReplyDroppingProxy  # noqa: E402
from test_recovery_bounded_scan import CALLS, FUTURE, KEY, write_orphans  # noqa: E402
from test_recoveryd_fleet import env, resolved  # noqa: E402 - recoveryd's environment, the log's statuses

NS = "bounded"  # the namespace the bounded-scan daemon uses


def journal(server: Any, ns: str = NS) -> list[dict[str, Any]]:
    """Every entry of the ledger's audit stream, oldest first."""
    client = server.client()
    try:
        return [json.loads(fields[b"e"]) for _id, fields in client.xrange(f"{{{ns}}}:recovery:journal")]
    finally:
        client.close()


def saga_entries(server: Any, ns: str = NS) -> Counter[str]:
    """Journal entries closing a saga, per saga."""
    return Counter(e["saga"] for e in journal(server, ns) if e["kind"] == "saga")


def claim_keys(server: Any, ns: str = NS, sagas: int = 12, prefix: str = "s") -> list[str]:
    """The claim keys held among sagas ``<prefix>0..`` (one EXISTS each: a pattern scan
    on a cluster client asks one node)."""
    client = server.client()
    try:
        keys = [f"{{{ns}}}:recovery:claim:{prefix}{i}" for i in range(sagas)]
        return [k for k in keys if client.exists(k)]
    finally:
        client.close()


def make_daemon(wal_url: str, ledger_url: str, lock_url: str | None = None, *, lock_ns: str = NS,
                concurrency: int = 8, ledger_retries: int | None = None) -> RecoveryDaemon:
    wal = RedisWAL(wal_url, key=KEY, writer="recovery-a")
    return RecoveryDaemon(wal, ledger=RedisLedger(ledger_url, namespace=NS, retries=ledger_retries),
                          lock=RedisClaimLock(lock_url or ledger_url, namespace=lock_ns), clock=FUTURE,
                          daemon_id="a", compensation_timeout=None, concurrency=concurrency)


async def sweep_all(d: RecoveryDaemon) -> list[Any]:
    try:
        return [await d.sweep(), await d.sweep()]
    finally:
        await d.close()
        d.source.wal.close()  # type: ignore[attr-defined]


async def test_a_resolved_saga_is_journaled_and_its_claim_released_in_one_request(fresh_redis: Any) -> None:
    CALLS.clear()
    write_orphans(fresh_redis.url, 12)
    d = make_daemon(fresh_redis.url, fresh_redis.url)
    assert d._journal_release is not None, "same server, same namespace: one request"
    first, second = await sweep_all(d)
    assert first.ok and first.recovered == 12 and second.recovered == 0 and second.in_flight == 0
    assert CALLS == Counter({f"ch_{i}": 1 for i in range(12)})
    assert d.lock._releases.batches == 0, "no release went on its own"  # type: ignore[attr-defined]
    assert saga_entries(fresh_redis) == Counter({f"s{i}": 1 for i in range(12)})
    assert claim_keys(fresh_redis) == [], "every claim released"
    client = fresh_redis.client()
    try:
        assert client.hlen(f"{{{NS}}}:recovery:done") == 12
        assert sorted(int(v) for v in client.hvals(f"{{{NS}}}:recovery:attempts")) == [1] * 12
    finally:
        client.close()


async def test_claims_in_another_namespace_are_released_on_their_own(fresh_redis: Any) -> None:
    CALLS.clear()
    write_orphans(fresh_redis.url, 4)
    d = make_daemon(fresh_redis.url, fresh_redis.url, lock_ns="elsewhere")
    assert d._journal_release is None
    first, _ = await sweep_all(d)
    assert first.ok and first.recovered == 4 and CALLS == Counter({f"ch_{i}": 1 for i in range(4)})
    assert d.lock._releases.batches >= 1  # type: ignore[attr-defined]
    assert saga_entries(fresh_redis) == Counter({f"s{i}": 1 for i in range(4)})
    assert claim_keys(fresh_redis, "elsewhere") == []


async def test_record_release_frees_only_its_own_claim_and_journals_either_way(fresh_redis: Any) -> None:
    ledger = RedisLedger(fresh_redis.url, namespace=NS)
    mine, theirs = RedisClaimLock(fresh_redis.url, namespace=NS, owner="me"), RedisClaimLock(fresh_redis.url, namespace=NS)
    try:
        assert ledger.releases_for(mine) and not ledger.releases_for(RedisClaimLock(fresh_redis.url, namespace="x"))
        assert not ledger.releases_for(RedisClaimLock("redis://127.0.0.1:1/0", namespace=NS))
        held = await mine.acquire("s1", 30)
        other = await theirs.acquire("s2", 30)
        assert held is not None and other is not None
        entry = LedgerEntry(LedgerKind.SAGA, "s1", "s1", None, "me", detail={"status": "SAGA_ROLLED_BACK"})
        assert await ledger.record_release(entry, mine, held) is True
        stale = Claim("s2", "me:not-the-token", 30)
        entry2 = LedgerEntry(LedgerKind.SAGA, "s2", "s2", None, "me", detail={"status": "SAGA_ROLLED_BACK"})
        assert await ledger.record_release(entry2, mine, stale) is False, "another's claim stays"
        assert claim_keys(fresh_redis) == [f"{{{NS}}}:recovery:claim:s2"]
        assert saga_entries(fresh_redis) == Counter({"s1": 1, "s2": 1})
        with pytest.raises(Exception, match="audit stream only"):
            await ledger.record_release(LedgerEntry(LedgerKind.DONE, "t", "s1", "s1/0", "me"), mine, held)
    finally:
        await ledger.close()
        await mine.close()
        await theirs.close()


async def test_an_op_the_server_refuses_fails_only_its_caller_in_the_ledgers_one_request(fresh_redis: Any) -> None:
    ledger = RedisLedger(fresh_redis.url, namespace=NS)
    lock = RedisClaimLock(fresh_redis.url, namespace=NS, owner="me")
    client = fresh_redis.client()
    try:
        client.set(f"{{{NS}}}:recovery:attempts", "not a hash")  # every attempt op: WRONGTYPE
        held = await lock.acquire("s1", 30)
        assert held is not None
        saga = LedgerEntry(LedgerKind.SAGA, "s1", "s1", None, "me", detail={"status": "SAGA_ROLLED_BACK"})
        done = LedgerEntry(LedgerKind.DONE, "tok-1", "s1", "s1/0", "me")
        attempt = LedgerEntry(LedgerKind.ATTEMPT, "tok-2", "s2", "s2/0", "me")
        out = await asyncio.gather(ledger.record(done), ledger.record(attempt), ledger.completed(["tok-0"]),
                                   ledger.record_release(saga, lock, held), return_exceptions=True)
        assert ledger._writes.batches == 1, "one request for the turn"
        assert out[0] is None and out[2] == set() and out[3] is True
        assert isinstance(out[1], Exception) and "WRONGTYPE" in str(out[1]), out
        assert await ledger.completed(["tok-1", "tok-2"]) == {"tok-1"}
        assert claim_keys(fresh_redis) == [] and saga_entries(fresh_redis) == Counter({"s1": 1})
        # The refused op's journal entry was still written (as in a pipeline: each command
        # on its own); the done one's and the saga's too.
        assert sorted(e["kind"] for e in journal(fresh_redis)) == ["attempt", "done", "saga"]
    finally:
        client.close()
        await ledger.close()
        await lock.close()


async def test_a_saga_with_more_tokens_than_a_lua_stack_holds_is_looked_up_in_the_ledgers_one_request(
        fresh_redis: Any) -> None:
    """The done index's lookup of a saga with 20,000 steps (past Lua's ~8,000-value
    unpack limit) answers, next to another op of the same turn."""
    ledger = RedisLedger(fresh_redis.url, namespace=NS)
    try:
        tokens = [f"tok-{i}" for i in range(20_000)]
        await asyncio.gather(*(ledger.record(LedgerEntry(LedgerKind.DONE, t, "big", f"big/{i}", "me"))
                               for i, t in enumerate(tokens[::997])))
        done, other = await asyncio.gather(ledger.completed(tokens), ledger.completed(["tok-1", "tok-997"]))
        assert done == set(tokens[::997]) and other == {"tok-997"}
        assert ledger._writes.batches == 2, "the writes' turn, then the two lookups' turn"
    finally:
        await ledger.close()


@pytest.mark.single_redis("one server's memory limit (a cluster's nodes each keep their own)")
async def test_a_refused_journal_and_release_leaves_the_saga_resolved_once_and_the_claim_released(fresh_redis: Any) -> None:
    CALLS.clear()
    write_orphans(fresh_redis.url, 1)
    admin = fresh_redis.client()
    d = make_daemon(fresh_redis.url, fresh_redis.url)
    real = d._journal_release
    assert real is not None

    async def out_of_memory_then(entry: LedgerEntry, lock: Any, claim: Claim) -> object:
        # Redis refuses writes (OOM) exactly for the request that journals and releases.
        admin.config_set("maxmemory", "1")
        try:
            return await real(entry, lock, claim)
        finally:
            admin.config_set("maxmemory", "0")

    d._journal_release = out_of_memory_then
    try:
        first, second = await sweep_all(d)
    finally:
        admin.config_set("maxmemory", "0")
    try:
        assert first.recovered == 0 and first.error is not None
        assert "journaling saga of s0 and releasing its claim" in first.error and "maxmemory" in first.error
        assert [r.status for r in first.results] == ["FAILED"]
        # The terminal record was durable first: the saga is resolved, nothing is done again.
        assert second.in_flight == 0 and second.recovered == 0 and second.error is None
        assert CALLS == Counter({"ch_0": 1})
        assert admin.hlen(f"{{{NS}}}:recovery:done") == 1
        assert saga_entries(fresh_redis) == Counter(), "refused: no entry, so the claim was kept by the script"
        assert claim_keys(fresh_redis) == [], "released on its own after the refusal"
        assert d.lock._releases.batches == 1  # type: ignore[attr-defined]
    finally:
        admin.close()


@pytest.mark.single_redis("a proxy in front of one server: a cluster client follows MOVED to the nodes' own addresses, past the proxy")
async def test_a_lost_reply_to_the_journal_and_release_leaves_both_done_once(fresh_redis: Any) -> None:
    CALLS.clear()
    write_orphans(fresh_redis.url, 1)
    with ReplyDroppingProxy(fresh_redis.port) as proxy:
        # Not repeated (a repeat lands: tests/integration/test_redis_repeats.py): this test
        # is about the request that failed.
        d = make_daemon(fresh_redis.url, proxy.url, ledger_retries=0)
        proxy.arm(1, b'"kind":"saga"')  # the reply to the saga's journal-and-release is lost
        first, second = await sweep_all(d)
    assert proxy.dropped == 1
    assert first.recovered == 0 and first.error is not None and "releasing its claim" in first.error
    assert second.in_flight == 0 and second.recovered == 0
    assert CALLS == Counter({"ch_0": 1})
    # The script ran whole before its reply was lost: journaled once, claim gone; the
    # release the daemon sent after the failure found nothing of its own to free.
    assert saga_entries(fresh_redis) == Counter({"s0": 1})
    assert claim_keys(fresh_redis) == []
    assert d.lock._releases.batches == 1  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- SIGKILL

N_KILL = 3
NS_D = "agent-saga"  # recoveryd's default namespace


def bank_orphans(url: str, key: str, bank: Bank, n: int) -> None:
    """``n`` dead agents' sagas, each one committed charge in ``bank`` and a lease run out."""
    wal = RedisWAL(url, key=key, writer="agent-1")
    try:
        for i in range(n):
            saga = f"k{i}"
            step = f"{saga}/0"
            fwd = idempotency_key(saga, step, "forward")
            charge = bank.charge(saga, 100, fwd)
            wal.append("SAGA_STARTED", saga, None, {"name": None, "tags": []})
            wal.append("SAGA_LEASE", saga, None, {"lease_seconds": 0.001})
            wal.append("STEP_INTENT", saga, step, {"tool": "chaos.charge", "semantics": "COMPENSABLE",
                                                   "idempotency_key": fwd})
            wal.append("STEP_COMMITTED", saga, step, {"compensation": {
                "handler": "chaos.refund", "kwargs": {"bank": bank.path, "charge_id": charge["id"]},
                "description": ""}})
        wal.barrier_sync()
    finally:
        wal.close()


def recoveryd_once(log_url: str, redis_url: str, fault: str | None) -> subprocess.CompletedProcess[str]:
    extra = {"AGENT_SAGA_FAULT": fault} if fault else {}
    return subprocess.run(
        [sys.executable, "-m", "agent_saga_recoveryd", "--wal-url", log_url, "--redis-url", redis_url,
         "--imports", "chaos_handlers", "--metrics-port", "-1", "--once", "--claim-ttl", "60",
         "--lease-grace", "0", "--concurrency", "1", "--daemon-id", "replica"],
        env=env(**extra), capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("point", ["recovery.before_release", "recovery.after_release"])
def test_a_daemon_killed_at_the_journal_and_release_leaves_each_saga_compensated_once(
    tmp_path: Path, fresh_redis: Any, point: str
) -> None:
    key = tagged("release:wal")
    log_url = f"{fresh_redis.url}?key={key}"
    bank = Bank(tmp_path / "bank")
    bank_orphans(fresh_redis.url, key, bank, N_KILL)
    killed = recoveryd_once(log_url, fresh_redis.url, f"{point}:1:sigkill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # One saga went through its terminal record, then the daemon died at ``point``.
    at_kill = resolved(log_url)
    done = [s for s, st in at_kill.items() if st == ROLLED_BACK]
    assert len(done) == 1, at_kill
    first = done[0]
    held = claim_keys(fresh_redis, NS_D, N_KILL, "k")
    if point == "recovery.before_release":
        # The order's first state: the saga not journaled, its claim held until it expires.
        assert saga_entries(fresh_redis, NS_D) == Counter()
        assert held == [f"{{{NS_D}}}:recovery:claim:{first}"]
        client = fresh_redis.client()
        try:
            assert 0 < client.pttl(held[0]) <= 60_000
        finally:
            client.close()
    else:
        # Both done in the one request: nothing left of that saga.
        assert saga_entries(fresh_redis, NS_D) == Counter({first: 1})
        assert held == []
    # The next daemon (the held claim unexpired: its saga is resolved in the log, so no
    # claim on it is needed) finishes the others and touches that one not at all.
    finished = recoveryd_once(log_url, fresh_redis.url, None)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert resolved(log_url) == {f"k{i}": ROLLED_BACK for i in range(N_KILL)}
    charges = bank.state().values()
    assert len(charges) == N_KILL and all(len(c.attempts) == 1 and len(c.applied) == 1 for c in charges)
    entries = saga_entries(fresh_redis, NS_D)
    others = {f"k{i}" for i in range(N_KILL)} - {first}
    assert {s: entries[s] for s in others} == {s: 1 for s in others}
    assert entries[first] == (0 if point == "recovery.before_release" else 1)
    client = fresh_redis.client()
    try:
        assert client.hlen(f"{{{NS_D}}}:recovery:done") == N_KILL
        assert sorted(int(v) for v in client.hvals(f"{{{NS_D}}}:recovery:attempts")) == [1] * N_KILL
    finally:
        client.close()
    assert claim_keys(fresh_redis, NS_D, N_KILL, "k") == ([f"{{{NS_D}}}:recovery:claim:{first}"]
                                            if point == "recovery.before_release" else [])
