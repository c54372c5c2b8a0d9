"""What the recovery stores say when Redis fails them is what is true for that request:
a claim or a read that fails claimed or acted on nothing; a ledger write made after the
daemon acted says what ran and was not recorded, and what the next sweep does.

A daemon over a file log with its ledger in a real Redis that refuses writes
(``min-replicas-to-write`` with no replica: ``NOREPLICAS``, reads still answered) from a
chosen moment: before a compensation is called (its attempt entry refused: nothing was
called, the next sweep calls it) and after it ran (its done entry refused: it ran, and
the next sweep calls it again with the same key, which it does). The stores' other
requests are refused by a stopped server, each with its own account.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga import compensator, idempotency_key
from agent_saga.recovery import (
    ClaimStoreUnavailable,
    LedgerEntry,
    LedgerKind,
    RecoveryDaemon,
    RedisClaimLock,
    RedisLedger,
)
from agent_saga.recovery.claims import Claim
from agent_saga.recovery.ledger import Escalation
from fixtures.redis_server import RedisServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from recovery_support import FUTURE  # noqa: E402
from verified_support import orphan_file  # noqa: E402

HANDLER = "test.storemsg.refund"
CALLS: list[tuple[str, str]] = []
BREAK: list[Any] = []  # a client of the server: the handler makes it refuse writes once it ran
KEY = idempotency_key("s1", "s1/0", "compensate")
NOREPLICAS = "CONFIG SET min-replicas-to-write on one server (a cluster's nodes each keep their own)"


@compensator(HANDLER)
def refund(charge_id: str, idempotency_key: str) -> None:
    CALLS.append((charge_id, idempotency_key))
    for client in BREAK:
        client.config_set("min-replicas-to-write", 1)


@pytest.fixture
def direct(fresh_redis: RedisServer) -> Iterator[Any]:
    """A client of the server; it accepts writes again after the test."""
    CALLS.clear()
    BREAK.clear()
    client = fresh_redis.client()
    try:
        yield client
    finally:
        BREAK.clear()
        client.config_set("min-replicas-to-write", 0)
        client.close()


def orphan(tmp_path: Path) -> Path:
    return orphan_file(tmp_path / "agent.wal", handler=HANDLER)


def daemon(path: Path, url: str) -> RecoveryDaemon:
    # Claims in files next to the log: only the ledger is in Redis.
    return RecoveryDaemon(path, ledger=RedisLedger(url, namespace="msg"), clock=FUTURE, daemon_id="d1",
                          compensation_timeout=None)


@pytest.mark.single_redis(NOREPLICAS)
async def test_a_ledger_write_refused_before_the_call_says_nothing_was_called(
        fresh_redis: RedisServer, direct: Any, tmp_path: Path) -> None:
    path = orphan(tmp_path)
    d = daemon(path, fresh_redis.url)
    try:
        direct.config_set("min-replicas-to-write", 1)  # reads answered, writes refused
        rep = await d.sweep()
        assert rep.recovered == 0 and CALLS == []
        (result,) = rep.results
        assert result.status == "FAILED" and rep.error is not None
        assert "failed while journaling attempt of" in rep.error and "NOREPLICAS" in rep.error
        assert "the compensation was not called" in rep.error
        assert "the next sweep resumes the saga and calls it" in rep.error
        assert "compensation ran" not in rep.error
        direct.config_set("min-replicas-to-write", 0)
        rep = await d.sweep()
        assert rep.recovered == 1 and CALLS == [("ch_1", KEY)], "called once, by the next sweep"
    finally:
        await d.close()


@pytest.mark.single_redis(NOREPLICAS)
async def test_a_done_entry_refused_after_the_compensation_ran_says_it_ran_and_is_called_again(
        fresh_redis: RedisServer, direct: Any, tmp_path: Path) -> None:
    path = orphan(tmp_path)
    d = daemon(path, fresh_redis.url)
    try:
        BREAK.append(direct)  # the compensation runs, then the server refuses its done entry
        rep = await d.sweep()
        assert CALLS == [("ch_1", KEY)] and rep.recovered == 0
        assert rep.error is not None and "failed while journaling done of" in rep.error
        assert "the compensation ran, but its done entry was not written" in rep.error
        assert "the next sweep calls it again, with the same idempotency key" in rep.error
        assert "nothing was" not in rep.error
        BREAK.clear()
        direct.config_set("min-replicas-to-write", 0)
        rep = await d.sweep()
        assert rep.recovered == 1
        assert CALLS == [("ch_1", KEY), ("ch_1", KEY)], "called again by the next sweep, with the same key"
    finally:
        await d.close()


async def test_each_request_refused_says_what_it_did_and_did_not_do(fresh_redis: RedisServer) -> None:
    url = fresh_redis.url.replace("127.0.0.1", ":hunter2@127.0.0.1", 1)
    lock = RedisClaimLock(url, namespace="msg", socket_timeout=1)
    ledger = RedisLedger(url, namespace="msg", socket_timeout=1, marker_ttl=60)
    claim = Claim("s1", "d1:tok", 30)

    def entry(kind: LedgerKind) -> LedgerEntry:
        return LedgerEntry(kind, KEY, "s1", "s1/0", "d1")

    closing = LedgerEntry(LedgerKind.SAGA, "s1", "s1", None, "d1", detail={"status": "SAGA_ROLLED_BACK"})
    esc = Escalation("esc-1", "s1", "s1/0", "pay.charge", "COMPENSABLE", "COMPENSATION_FAILED", "why", False,
                     "log", "d1", 0.0)
    expected = [  # (the request, what its error must say)
        (lambda: lock.acquire("s1", 30), "claiming s1", "nothing was claimed or acted on, the next sweep retries"),
        (lambda: ledger.completed([KEY]), "reading the done index", "nothing was written or acted on"),
        (lambda: ledger.record(entry(LedgerKind.ATTEMPT)), "journaling attempt of",
         "the compensation was not called (its start is in the log)"),
        (lambda: ledger.record(entry(LedgerKind.DONE)), "journaling done of",
         "the compensation ran, but its done entry was not written: the next sweep calls it again, with the "
         "same idempotency key"),
        (lambda: ledger.record(entry(LedgerKind.FAILED)), "journaling failed of",
         "the next sweep calls nothing again and escalates the step to a human"),
        (lambda: ledger.record(closing), "journaling saga of s1", "the saga is resolved"),
        (lambda: ledger.record_release(closing, lock, claim), "journaling saga of s1 and releasing its claim",
         "the daemon releases the claim on its own, or it expires with its ttl"),
        (lambda: ledger.escalate(esc), "queueing escalation esc-1",
         "the escalation was not queued for a human: the next sweep queues it from the log"),
        (lambda: ledger.resolve_escalation("esc-1", by="ops"), "resolving escalation esc-1",
         "the escalation was not resolved"),
        (lambda: lock.renew(claim), "renewing the claim on s1", "the claim was not extended"),
        (lambda: lock.release(claim), "releasing the claim on s1",
         "the claim is still held and expires with its ttl: what was done under it stands"),
        (lambda: lock.members("d1", 30), "renewing the recovery membership", "it takes every orphan"),
        (lambda: lock.leave("d1"), "leaving the recovery membership", "share of the orphans moves to the others then"),
    ]
    fresh_redis.stop()
    try:
        for request, doing, says in expected:
            with pytest.raises(ClaimStoreUnavailable) as err:
                await request()
            text = str(err.value)
            assert f"failed while {doing}" in text and says in text, text
            assert "hunter2" not in text and ":***@127.0.0.1" in text  # redis:// or redis+cluster://
            if "acted on" not in says:
                assert "nothing was claimed" not in text, text
    finally:
        fresh_redis.start()
        await lock.close()
        await ledger.close()
