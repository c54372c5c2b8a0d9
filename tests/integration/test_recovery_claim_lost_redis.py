"""A daemon whose claim is taken from it while a compensation runs writes nothing more
to the saga's log: the claim is checked before every record, not only before every call.

Claims and the ledger in a real Redis, the log in a file. The compensation itself hands
the claim to another owner (it overwrites the claim's key with another token, as a daemon
that took the expired claim would) and returns only once the first daemon's renewal has
been refused. The first daemon then keeps the ledger's done entry (the call ran: that
entry keeps the next holder from calling it again) and stops (CLAIM_LOST) before
COMPENSATION_DONE and the terminal record; a second daemon resolves the saga once, without
calling the compensation again. A resolution whose claim holds writes all its records.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga import compensator, idempotency_key
from agent_saga.recovery import RecoveryDaemon, RedisClaimLock, RedisLedger
from agent_saga.recovery.claims import Claim
from fixtures.redis_server import RedisServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from recovery_support import FUTURE, records  # noqa: E402
from verified_support import orphan_file  # noqa: E402

HANDLER = "test.claimlost.refund"
KEY = idempotency_key("s1", "s1/0", "compensate")
CALLS: list[tuple[str, str]] = []
TAKE: list[Any] = []  # (a client of the server, the claim's key): the handler hands the claim over
REFUSED = threading.Event()  # set once a renewal finds the claim is not ours


class RenewalWatch(RedisClaimLock):
    """A RedisClaimLock that says when a renewal was refused (the claim not ours)."""

    async def renew(self, claim: Claim) -> bool:
        ours = await super().renew(claim)
        if not ours:
            REFUSED.set()
        return ours


@compensator(HANDLER)
def refund(charge_id: str, idempotency_key: str) -> None:
    CALLS.append((charge_id, idempotency_key))
    for client, key in TAKE:
        client.set(key, "another-daemon:token", px=60_000)
        assert REFUSED.wait(30), "the claim's renewal was never refused"


@pytest.fixture
def direct(fresh_redis: RedisServer) -> Iterator[Any]:
    CALLS.clear()
    TAKE.clear()
    REFUSED.clear()
    client = fresh_redis.client()
    try:
        yield client
    finally:
        TAKE.clear()
        client.close()


def orphan(tmp_path: Path) -> Path:
    return orphan_file(tmp_path / "agent.wal", handler=HANDLER)


def daemon(path: Path, url: str, name: str) -> RecoveryDaemon:
    # A short ttl: the guard renews every ttl / 3, so the refusal comes soon after the takeover.
    return RecoveryDaemon(path, lock=RenewalWatch(url, owner=name, namespace="lost"),
                          ledger=RedisLedger(url, namespace="lost"), claim_ttl=0.6, clock=FUTURE,
                          daemon_id=name, compensation_timeout=None)


async def swept(d: RecoveryDaemon) -> Any:
    """One sweep of ``d``, which is closed after it."""
    try:
        return await d.sweep()
    finally:
        await d.close()


def types(path: Path) -> list[str]:
    return [r.type for r in records(path) if r.saga == "s1"]


async def test_a_daemon_whose_claim_is_taken_mid_call_writes_no_more_records_and_the_next_resolves_once(
        fresh_redis: RedisServer, direct: Any, tmp_path: Path) -> None:
    path = orphan(tmp_path)
    first = daemon(path, fresh_redis.url, "d1")
    before = len(types(path))
    TAKE.append((direct, first.lock.key("s1")))
    rep = await swept(first)
    assert CALLS == [("ch_1", KEY)], "the compensation ran once"
    (result,) = rep.results
    assert result.status == "CLAIM_LOST" and rep.recovered == 0
    written = types(path)[before:]
    assert "COMPENSATION_STARTED" in written, written
    assert "COMPENSATION_DONE" not in written and "SAGA_ROLLED_BACK" not in written, written
    ledger = RedisLedger(fresh_redis.url, namespace="lost")
    try:
        assert await ledger.completed([KEY]) == {KEY}, "the call that ran is in the done index"
    finally:
        await ledger.close()

    TAKE.clear()
    direct.delete(first.lock.key("s1"))  # the other owner let its claim go
    rep = await swept(daemon(path, fresh_redis.url, "d2"))
    assert rep.recovered == 1
    assert CALLS == [("ch_1", KEY)], "not called again: the done index has it"
    assert types(path).count("SAGA_ROLLED_BACK") == 1
    done = [r for r in records(path) if r.type == "COMPENSATION_DONE"]
    assert len(done) == 1 and done[0].payload.get("via") == "ledger", done


async def test_a_resolution_whose_claim_holds_writes_all_its_records(
        fresh_redis: RedisServer, direct: Any, tmp_path: Path) -> None:
    path = orphan(tmp_path)
    before = len(types(path))
    rep = await swept(daemon(path, fresh_redis.url, "d1"))
    assert rep.recovered == 1 and CALLS == [("ch_1", KEY)] and not REFUSED.is_set()
    written = types(path)[before:]
    assert written.count("COMPENSATION_DONE") == 1 and written[-1] == "SAGA_ROLLED_BACK", written
