"""RedisSwitchStore's synced marker, without a server: a fake client answers the two
reads (index + marker, then the documents) so the data-loss rules can be stepped through
with a manual clock. The real-server versions are in
tests/integration/test_killswitch_redis.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from agent_saga.controls import KillSwitch, Lever, ManualClock, RedisSwitchStore
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics


class FakeRedis:
    """Just what ``RedisSwitchStore._read`` uses: a MULTI of SMEMBERS + HKEYS, then MGET."""

    def __init__(self) -> None:
        self.docs: dict[str, str] = {}
        self.marker: dict[str, str] = {}

    def pipeline(self, transaction: bool = True) -> FakeRedis:
        assert transaction, "index and marker are read atomically"
        self._queued: list[str] = []
        return self

    def smembers(self, key: str) -> None:
        assert key == "agentsaga:v1:killswitch:index"
        self._queued.append("index")

    def hkeys(self, key: str) -> None:
        assert key == "agentsaga:v1:synced"
        self._queued.append("marker")

    def execute(self) -> list[Any]:
        assert self._queued == ["index", "marker"]
        return [{k.encode() for k in self.docs}, [f.encode() for f in self.marker]]

    def mget(self, keys: list[str]) -> list[Any]:
        return [self.docs.get(k.removeprefix("agentsaga:v1:killswitch:")) for k in keys]

    def halt(self, clock: ManualClock, scope: str, writer: str = "operator") -> Lever:
        lever = Lever.new("Halt", scope, reason="fraud pattern", by="soc@corp", now=clock.time())
        self.docs[lever.id] = json.dumps({"rev": 1, **lever.to_doc()})
        self.marker[writer] = "{}"
        return lever

    def flushall(self) -> None:
        self.docs.clear()
        self.marker.clear()


def req(tool: str) -> StepRequest:
    return StepRequest("s-1", "s-1/0", tool, ActionSemantics.COMPENSABLE, {}, ())


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
    return Unwatched("redis://127.0.0.1:1/0", grace=grace, heartbeat=0.5, clock=clock)


async def test_marker_lost_honours_the_last_levers_for_grace_then_refuses(clock, caplog):
    redis, store = FakeRedis(), make(clock)
    ks = KillSwitch(store, clock=clock)
    redis.halt(clock, "tool:wire.send")
    store._load(redis)
    assert store.writers_seen == {"operator"}
    assert await refusal(ks, "wire.send") and await refusal(ks, "stripe.charge") is None

    redis.flushall()
    with caplog.at_level(logging.WARNING, logger="agent_saga.controls"):
        store._load(redis)
        store._load(redis)  # a second read of the empty plane: one warning, grace not reset
    warnings = [r for r in caplog.records if "lost its data" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert store.data_lost and "synced marker" in store.data_lost
    assert "fraud pattern" in (await refusal(ks, "wire.send") or ""), "the empty index is not 'no levers'"
    assert await refusal(ks, "stripe.charge") is None
    status = ks.status()
    assert status["posture"] == "degraded" and [lv["scope"] for lv in status["levers"]] == ["tool:wire.send"]

    clock.advance(29.9)
    store._load(redis)  # still empty: the heartbeat does not extend the grace window
    assert await refusal(ks, "stripe.charge") is None
    clock.advance(0.2)
    reason = await refusal(ks, "stripe.charge")
    assert reason and "grace window of 30s has passed" in reason and "re-projected" in reason
    assert ks.status()["posture"] == "closed"

    # Re-projected (the operator's resync, or a CLI write): the documents, then the marker.
    redis.halt(clock, "tool:wire.send")
    redis.marker.clear()
    store._load(redis)  # documents back without the marker: a partial state, still closed
    assert await refusal(ks, "stripe.charge")
    redis.marker["operator"] = "{}"
    with caplog.at_level(logging.WARNING, logger="agent_saga.controls"):
        store._load(redis)
    assert any("marker is back" in r.getMessage() for r in caplog.records)
    assert store.data_lost is None and ks.status()["posture"] == "ok"
    assert await refusal(ks, "stripe.charge") is None and await refusal(ks, "wire.send")


async def test_grace_zero_fails_closed_at_once_on_data_loss(clock):
    redis, store = FakeRedis(), make(clock, grace=0)
    ks = KillSwitch(store, clock=clock)
    redis.halt(clock, "tool:wire.send")
    store._load(redis)
    redis.flushall()
    store._load(redis)
    reason = await refusal(ks, "stripe.charge")
    assert reason and "grace window of 0s has passed" in reason


async def test_a_fresh_installation_without_marker_has_no_levers(clock):
    redis, store = FakeRedis(), make(clock)
    ks = KillSwitch(store, clock=clock)
    store._load(redis)
    assert store.writers_seen == frozenset() and store.data_lost is None
    assert await refusal(ks, "wire.send") is None and ks.status()["posture"] == "ok"
    # Documents without any marker (an operator mid-way through its first projection):
    # a store that never saw a marker takes what it finds.
    redis.docs.update({"cli/x": json.dumps({"rev": 1, **Lever.new(
        "Halt", "tool:wire.send", reason="r", by="b", now=clock.time()).to_doc()})})
    store._load(redis)
    assert await refusal(ks, "wire.send")


async def test_every_writer_seen_must_be_present(clock):
    # The CLI re-engaging a halt after a FLUSHALL does not vouch for the operator's levers.
    redis, store = FakeRedis(), make(clock)
    ks = KillSwitch(store, clock=clock)
    redis.halt(clock, "tool:wire.send", writer="operator")
    redis.halt(clock, "tool:stripe.*", writer="store")
    store._load(redis)
    assert store.writers_seen == {"operator", "store"}
    redis.flushall()
    redis.halt(clock, "tool:stripe.*", writer="store")
    store._load(redis)
    assert store.data_lost and "operator" in store.data_lost
    assert await refusal(ks, "wire.send"), "the operator's halt is still honoured"
    redis.halt(clock, "tool:wire.send", writer="operator")
    store._load(redis)
    assert store.data_lost is None


def test_the_write_scripts_set_the_marker_with_the_document():
    for script in (RedisSwitchStore.LUA_PUT, RedisSwitchStore.LUA_DELETE):
        assert "redis.call('HSET', KEYS[4]" in script
    assert RedisSwitchStore.WRITER == "store"
