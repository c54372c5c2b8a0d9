"""RedisSwitchStore's synced marker, stepped through on a real Redis with a manual clock:
the test writes the policy plane's keys (lever documents, index, marker) directly and
drives the store's reads itself. The watcher-driven versions are in
tests/integration/test_killswitch_redis.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from agent_saga.controls import KillSwitch, Lever, ManualClock, RedisSwitchStore
from fixtures.redis_server import PLANE_PREFIX as K
from fixtures.redis_server import client_for
from fixtures.steps import req


class Plane:
    """Writes the keys the operator and the CLI write, on a real Redis."""

    def __init__(self, url: str) -> None:

        self.client = client_for(url)
        self.client.flushall()

    def put(self, lever: Lever) -> None:
        self.client.set(f"{K}:killswitch:{lever.id}", json.dumps({"rev": 1, **lever.to_doc()}))
        self.client.sadd(f"{K}:killswitch:index", lever.id)

    def mark(self, writer: str = "operator") -> None:
        self.client.hset(f"{K}:synced", writer, "{}")

    def unmark(self) -> None:
        self.client.delete(f"{K}:synced")

    def halt(self, clock: ManualClock, scope: str, writer: str = "operator") -> Lever:
        lever = Lever.new("Halt", scope, reason="fraud pattern", by="soc@corp", now=clock.time())
        self.put(lever)
        self.mark(writer)
        return lever

    def flushall(self) -> None:
        self.client.flushall()


@pytest.fixture
def plane(fresh_redis: Any) -> Iterator[Plane]:
    p = Plane(fresh_redis.url)
    yield p
    p.client.close()


async def refusal(ks: KillSwitch, tool: str) -> str | None:
    r = await ks.check(req(tool))
    return None if r is None else r.reason


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class Unwatched(RedisSwitchStore):
    """No watcher thread, no connection: the test drives ``_load`` itself."""

    def start(self) -> None:
        pass


def make(clock: ManualClock, grace: float = 30) -> RedisSwitchStore:
    return Unwatched("redis://127.0.0.1:1/0", prefix=K, grace=grace, heartbeat=0.5, clock=clock)


async def test_marker_lost_honours_the_last_levers_for_grace_then_refuses(plane, clock, caplog):
    redis, store = plane, make(clock)
    ks = KillSwitch(store, clock=clock)
    redis.halt(clock, "tool:wire.send")
    store._load(redis.client)
    assert store.writers_seen == {"operator"}
    assert await refusal(ks, "wire.send") and await refusal(ks, "stripe.charge") is None

    redis.flushall()
    with caplog.at_level(logging.WARNING, logger="agent_saga.controls"):
        store._load(redis.client)
        store._load(redis.client)  # a second read of the empty plane: one warning, grace not reset
    warnings = [r for r in caplog.records if "lost its data" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert store.data_lost and "synced marker" in store.data_lost
    assert "fraud pattern" in (await refusal(ks, "wire.send") or ""), "the empty index is not 'no levers'"
    assert await refusal(ks, "stripe.charge") is None
    status = ks.status()
    assert status["posture"] == "degraded" and [lv["scope"] for lv in status["levers"]] == ["tool:wire.send"]

    clock.advance(29.9)
    store._load(redis.client)  # still empty: the heartbeat does not extend the grace window
    assert await refusal(ks, "stripe.charge") is None
    clock.advance(0.2)
    reason = await refusal(ks, "stripe.charge")
    assert reason and "grace window of 30s has passed" in reason and "re-projected" in reason
    assert ks.status()["posture"] == "closed"

    # Re-projected (the operator's resync, or a CLI write): the documents, then the marker.
    redis.halt(clock, "tool:wire.send")
    redis.unmark()
    store._load(redis.client)  # documents back without the marker: a partial state, still closed
    assert await refusal(ks, "stripe.charge")
    redis.mark("operator")
    with caplog.at_level(logging.WARNING, logger="agent_saga.controls"):
        store._load(redis.client)
    assert any("marker is back" in r.getMessage() for r in caplog.records)
    assert store.data_lost is None and ks.status()["posture"] == "ok"
    assert await refusal(ks, "stripe.charge") is None and await refusal(ks, "wire.send")


async def test_grace_zero_fails_closed_at_once_on_data_loss(plane, clock):
    redis, store = plane, make(clock, grace=0)
    ks = KillSwitch(store, clock=clock)
    redis.halt(clock, "tool:wire.send")
    store._load(redis.client)
    redis.flushall()
    store._load(redis.client)
    reason = await refusal(ks, "stripe.charge")
    assert reason and "grace window of 0s has passed" in reason


async def test_a_fresh_installation_without_marker_has_no_levers(plane, clock):
    redis, store = plane, make(clock)
    ks = KillSwitch(store, clock=clock)
    store._load(redis.client)
    assert store.writers_seen == frozenset() and store.data_lost is None
    assert await refusal(ks, "wire.send") is None and ks.status()["posture"] == "ok"
    # Documents without any marker (an operator mid-way through its first projection):
    # a store that never saw a marker takes what it finds.
    redis.put(Lever.new("Halt", "tool:wire.send", reason="r", by="b", now=clock.time()))
    store._load(redis.client)
    assert await refusal(ks, "wire.send")


async def test_every_writer_seen_must_be_present(plane, clock):
    # The CLI re-engaging a halt after a FLUSHALL does not vouch for the operator's levers.
    redis, store = plane, make(clock)
    ks = KillSwitch(store, clock=clock)
    redis.halt(clock, "tool:wire.send", writer="operator")
    redis.halt(clock, "tool:stripe.*", writer="store")
    store._load(redis.client)
    assert store.writers_seen == {"operator", "store"}
    redis.flushall()
    redis.halt(clock, "tool:stripe.*", writer="store")
    store._load(redis.client)
    assert store.data_lost and "operator" in store.data_lost
    assert await refusal(ks, "wire.send"), "the operator's halt is still honoured"
    redis.halt(clock, "tool:wire.send", writer="operator")
    store._load(redis.client)
    assert store.data_lost is None


def test_the_write_scripts_set_the_marker_with_the_document():
    for script in (RedisSwitchStore.LUA_PUT, RedisSwitchStore.LUA_DELETE):
        assert "redis.call('HSET', KEYS[4]" in script
    assert RedisSwitchStore.WRITER == "store"


async def test_a_plane_gone_back_in_time_keeps_a_later_halt_until_the_operator_vouches_again(plane, clock):
    """Redis restored from an older snapshot: ``rev`` lower than one read, the marker's
    old value present. A halt engaged after the snapshot is not lifted; the plane is
    trusted again only once the operator writes its marker anew."""
    redis, store = plane, make(clock, grace=30)
    ks = KillSwitch(store, clock=clock)
    c = redis.client
    redis.halt(clock, "tool:wire.send")
    c.hset(f"{K}:synced", "operator", '{"rev":10}')
    c.set(f"{K}:rev", 10)
    store._load(c)
    snapshot = {k: c.dump(k) for k in c.keys(f"{K}:*")}
    redis.halt(clock, "tool:stripe.*")  # engaged after the snapshot
    c.set(f"{K}:rev", 12)
    store._load(c)
    assert store.top_rev == 12 and await refusal(ks, "stripe.charge")

    c.flushall()  # restored from the snapshot: the old documents, the old marker, rev 10
    for k, v in snapshot.items():
        c.restore(k, 0, v)
    store._load(c)
    assert store.data_lost and "went back in time" in store.data_lost and "is 10" in store.data_lost
    assert await refusal(ks, "stripe.charge"), "a halt engaged after the snapshot is not lifted"
    assert ks.status()["posture"] == "degraded"
    clock.advance(31)
    assert await refusal(ks, "search.docs"), "past grace, the kill switch fails closed"

    # the operator re-projects, then writes its marker anew
    redis.put(Lever.new("Halt", "tool:stripe.*", reason="fraud pattern", by="soc@corp", now=clock.time()))
    c.set(f"{K}:rev", 11)
    store._load(c)
    assert store.data_lost, "documents alone, under the old marker, are not the whole plane"
    c.hset(f"{K}:synced", "operator", '{"rev":11}')
    store._load(c)
    assert store.data_lost is None and store.top_rev == 11 and ks.status()["posture"] == "ok"
    assert await refusal(ks, "stripe.charge") and await refusal(ks, "search.docs") is None
