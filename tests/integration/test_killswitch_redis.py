"""RedisSwitchStore against a real redis-server: the policy-plane documents, change
notifications reaching a running agent, and the deliberate failure mode: when Redis
dies the last known levers are honoured for ``grace``, then everything is refused
(``grace=0``: at once); with no known state, everything is refused from the start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga.clocks import format_instant
from agent_saga.controls import KillSwitch, Lever, ManualClock, PreFlightGate, RedisSwitchStore
from agent_saga.errors import GateBlocked
from agent_saga.scope import saga_scope
from agent_saga.wal.file import FileWAL, iter_file_records
from fixtures.polling import until
from fixtures.redis_server import PLANE_ENV, RedisServer
from fixtures.redis_server import PLANE_PREFIX as P
from fixtures.steps import req


@pytest.fixture
def stores() -> Iterator[list[RedisSwitchStore]]:
    made: list[RedisSwitchStore] = []
    yield made
    for s in made:
        s.close()


def store(stores: list[RedisSwitchStore], url: str, **kw: Any) -> RedisSwitchStore:
    kw.setdefault("grace", 30)
    kw.setdefault("heartbeat", 0.1)
    kw.setdefault("socket_timeout", 0.5)
    kw.setdefault("prefix", P)
    s = RedisSwitchStore(url, **kw)
    stores.append(s)
    return s


async def refusal(ks: KillSwitch, tool: str) -> str | None:
    r = await ks.check(req(tool))
    return None if r is None else r.reason


def test_levers_are_the_policy_plane_documents(fresh_redis: RedisServer, stores):
    s = store(stores, fresh_redis.url)
    now = time.time()
    lever = Lever.new("Halt", "tool:stripe.*", reason="stripe incident", by="soc@corp", now=now, ttl=600)
    s.engage(lever)
    r = fresh_redis.client()
    try:
        assert r.smembers(f"{P}:killswitch:index") == {lever.id.encode()}
        raw = r.get(f"{P}:killswitch:{lever.id}")
        assert raw.startswith(b'{"rev":'), "rev first, as every policy-plane document"
        doc = json.loads(raw)
        assert int(r.get(f"{P}:rev")) == doc.pop("rev")
        ns, name = lever.id.split("/")
        assert doc == {"v": 1, "kind": "KillSwitch", "id": lever.id, "namespace": ns, "name": name, "action": "Halt", "scope": "tool:stripe.*", "reason": "stripe incident",
                       "requestedBy": "soc@corp", "ttl": 600, "engagedAt": format_instant(now),
                       "expiresAt": format_instant(now + 600)}
        assert doc["engagedAt"].endswith("Z") and "T" in doc["engagedAt"]
        assert r.pttl(f"{P}:killswitch:{lever.id}") > 0, "Redis forgets a lapsed lever on its own"
        # a document as the operator projects a KillSwitch resource (object scope, no ttl)
        r.set(f"{P}:killswitch:payments/stop-eu", json.dumps({
            "rev": 7, "v": 1, "kind": "KillSwitch", "id": "payments/stop-eu", "namespace": "payments",
            "name": "stop-eu", "uid": "6f1c", "generation": 1, "action": "Halt", "scope": {"tag": "eu"}, "reason": "regulator", "requestedBy": "soc@corp",
            "ttl": None, "engagedAt": "2025-06-01T03:00:00Z", "expiresAt": None}))
        r.sadd(f"{P}:killswitch:index", "payments/stop-eu")
    finally:
        r.close()
    assert sorted((lv.id, lv.scope) for lv in s.levers()) == [
        (lever.id, "tool:stripe.*"), ("payments/stop-eu", "tag:eu")]
    only_other = store(stores, fresh_redis.url, namespaces=["risk"])
    assert [lv.id for lv in only_other.levers()] == [lever.id], "namespaced: payments' switch is not ours"


def test_a_secret_in_a_reason_is_scrubbed_in_the_redis_document(fresh_redis: RedisServer, stores):
    s = store(stores, fresh_redis.url)
    leaked = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
    lever = Lever.new("Halt", "tool:stripe.*", reason=f"stripe key {leaked} leaked; password=hunter2",
                      by="soc@corp", now=time.time())
    # a lever built directly (an embedding application) is scrubbed when stored, too
    direct = Lever("cli/halt-direct", lever.action, "tool:wire.send", f"rotated {leaked}", "soc@corp", time.time(),
                   None, None)
    s.engage(lever)
    s.engage(direct)
    r = fresh_redis.client()
    try:
        raws = [r.get(f"{P}:killswitch:{lv.id}") for lv in (lever, direct)]
    finally:
        r.close()
    assert all(raw is not None and leaked.encode() not in raw and b"hunter2" not in raw for raw in raws)
    assert json.loads(raws[0])["reason"] == "stripe key [REDACTED] leaked; password=[REDACTED]"
    assert json.loads(raws[1])["reason"] == "rotated [REDACTED]"
    assert {lv.reason for lv in s.levers()} == {"stripe key [REDACTED] leaked; password=[REDACTED]",
                                                "rotated [REDACTED]"}


def test_two_cli_halts_on_one_scope_are_two_levers(fresh_redis: RedisServer, stores):
    s = store(stores, fresh_redis.url)
    now = time.time()
    first = Lever.new("Halt", "tool:wire.send", reason="fraud pattern", by="soc@corp", now=now, ttl=600)
    second = Lever.new("Halt", "tool:wire.send", reason="regulator hold", by="risk@corp", now=now)
    assert first.id != second.id and first.id.rsplit("-", 1)[0] == second.id.rsplit("-", 1)[0]
    s.engage(first)
    s.engage(second)
    assert sorted((lv.requested_by, lv.reason, lv.ttl) for lv in s.levers()) == [
        ("risk@corp", "regulator hold", None), ("soc@corp", "fraud pattern", 600)], "neither replaced the other"
    s.lift(first.id)
    assert [lv.id for lv in s.levers()] == [second.id], "lifting one leaves the other engaged"


def test_changes_are_notified_as_the_operator_does(fresh_redis: RedisServer, stores):
    s = store(stores, fresh_redis.url)
    r = fresh_redis.client()
    events = r.pubsub()
    events.subscribe(f"{P}:events")
    try:
        until("the subscription", lambda: (events.get_message(timeout=0.1) or {}).get("type") == "subscribe", timeout=10)
        lever = Lever.new("Halt", "global", reason="r", by="b", now=time.time())
        s.engage(lever)
        s.lift(lever.id)
        got = []
        while len(got) < 2:
            msg = until("a notification", lambda: events.get_message(timeout=0.1), timeout=10)
            if msg["type"] == "message":
                got.append(json.loads(msg["data"]))
        assert [(e["kind"], e["id"], e["op"]) for e in got] == [
            ("KillSwitch", lever.id, "put"), ("KillSwitch", lever.id, "delete")]
        assert got[1]["rev"] == got[0]["rev"] + 1 == int(r.get(f"{P}:rev"))
    finally:
        events.close()
        r.close()


async def test_a_halt_from_another_process_is_seen_by_a_running_agent(fresh_redis: RedisServer, stores, tmp_path):
    agent = store(stores, fresh_redis.url)
    wal = FileWAL(tmp_path / "agent.wal")
    try:
        ks = KillSwitch(agent, wal=wal)
        assert await refusal(ks, "wire.send") is None
        out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "halt", "--scope", "tool:wire.send",
                              "--reason", "fraud pattern", "--by", "soc@corp", "--store", f"{fresh_redis.url}"],
                             capture_output=True, text=True, timeout=60, env={**os.environ, **PLANE_ENV})
        assert out.returncode == 0, out.stderr
        assert f"RedisSwitchStore({fresh_redis.url.split('://')[0]}://127.0.0.1" in out.stdout
        until("the halt to reach the agent", lambda: agent.view().levers, timeout=10)
        assert "fraud pattern" in (await refusal(ks, "wire.send") or "")
        assert await refusal(ks, "wire.receive") is None
        out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "resume", "--scope", "tool:wire.send",
                              "--by", "soc@corp", "--store", fresh_redis.url], capture_output=True, text=True,
                             timeout=60, env={**os.environ, **PLANE_ENV})
        assert out.returncode == 0, out.stderr
        until("the lift to reach the agent", lambda: not agent.view().levers, timeout=10)
        assert await refusal(ks, "wire.send") is None
        wal.barrier_sync()
    finally:
        wal.close()
    types = [item.type for _, item in iter_file_records(tmp_path / "agent.wal")]
    assert types == ["KILL_SWITCH_ENGAGED", "KILL_SWITCH_LIFTED"]


async def test_redis_killed_the_last_state_is_honoured_for_grace_then_everything_is_refused(
        fresh_redis: RedisServer, stores, tmp_path):
    clock = ManualClock()
    agent = store(stores, fresh_redis.url, grace=30, clock=clock)
    wal = FileWAL(tmp_path / "agent.wal")
    try:
        ks = KillSwitch(agent, wal=wal, clock=clock)
        gate = PreFlightGate(default_rules=(), checks=[ks])
        halt = Lever.new("Halt", "tool:wire.send", reason="fraud pattern", by="soc@corp", now=clock.time())
        store(stores, fresh_redis.url).engage(halt)
        await ks.check(req("x"))  # started
        until("the halt to reach the agent", lambda: agent.view().levers, timeout=10)

        fresh_redis.kill()
        until("the agent to notice", lambda: not agent.connected, timeout=10)
        view = agent.view()
        assert view.usable and view.degraded and "honouring the last known levers" in view.degraded
        assert "fraud pattern" in (await refusal(ks, "wire.send") or ""), "the halt still holds"
        assert await refusal(ks, "stripe.charge") is None, "a blip is survived"
        clock.advance(29.9)
        assert await refusal(ks, "stripe.charge") is None
        clock.advance(0.2)
        reason = await refusal(ks, "stripe.charge")
        assert reason is not None and "grace window of 30s has passed" in reason and "refuses everything" in reason
        with pytest.raises(GateBlocked, match="refuses everything"):
            async with saga_scope(wal, gate):
                pass

        fresh_redis.start()  # came back empty (it kept nothing): data loss, not "no levers"
        until("the agent to reconnect", lambda: agent.connected and agent.data_lost, timeout=10)
        assert not agent.view().usable and "synced marker" in (await refusal(ks, "stripe.charge") or "")
        store(stores, fresh_redis.url).engage(halt)  # re-projected through the store: marker back
        until("the agent to recover", lambda: agent.view().usable and agent.data_lost is None, timeout=10)
        assert await refusal(ks, "stripe.charge") is None
        assert "fraud pattern" in (await refusal(ks, "wire.send") or "")
        wal.barrier_sync()
    finally:
        wal.close()
    types = [item.type for _, item in iter_file_records(tmp_path / "agent.wal")]
    assert types == ["KILL_SWITCH_ENGAGED", "KILL_SWITCH_DEGRADED", "KILL_SWITCH_FAILED_CLOSED",
                     "KILL_SWITCH_RESTORED"]


async def test_grace_zero_refuses_everything_as_soon_as_redis_is_lost(fresh_redis: RedisServer, stores):
    clock = ManualClock()
    agent = store(stores, fresh_redis.url, grace=0, clock=clock)
    ks = KillSwitch(agent, clock=clock)
    assert await refusal(ks, "stripe.charge") is None
    fresh_redis.kill()
    until("the agent to notice", lambda: not agent.connected, timeout=10)
    reason = await refusal(ks, "stripe.charge")
    assert reason is not None and "grace window of 0s has passed" in reason


async def test_a_silent_loss_is_noticed_by_the_heartbeat(fresh_redis: RedisServer, stores):
    clock = ManualClock()
    agent = store(stores, fresh_redis.url, grace=0, clock=clock, heartbeat=0.1, socket_timeout=0.3)
    ks = KillSwitch(agent, clock=clock)
    assert await refusal(ks, "stripe.charge") is None
    pids = fresh_redis.pids  # one server, or every node of a cluster
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # the server hangs: connections stay open, nothing answers
    try:
        until("the agent to notice", lambda: not agent.connected, timeout=10)
        assert await refusal(ks, "stripe.charge") is not None
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    until("the agent to recover", lambda: agent.connected and agent.view().usable, timeout=10)
    assert await refusal(ks, "stripe.charge") is None


async def test_with_redis_down_at_start_up_everything_is_refused(redis_server_factory, stores):
    server = redis_server_factory()
    url = server.url
    server.kill()
    agent = store(stores, url, grace=3600, connect_timeout=0.2)
    ks = KillSwitch(agent)
    reason = await refusal(ks, "anything")
    assert reason is not None and "no known state" in reason
    assert agent.is_quarantined("any-saga"), "recovery leaves sagas alone while it cannot tell"


async def test_a_quarantine_in_redis_is_seen_by_recovery(fresh_redis: RedisServer, stores, tmp_path: Path):
    from agent_saga.recovery import RecoveryDaemon
    from agent_saga.wal.file import FileWAL as _W

    log = tmp_path / "a.wal"
    w = _W(log)
    w.append("SAGA_STARTED", "saga-q", None, {"name": None, "tags": []})
    w.barrier_sync()
    w.close()
    store(stores, fresh_redis.url).engage(
        Lever.new("Quarantine", "saga:saga-q", reason="suspected duplicate charges", by="soc@corp", now=time.time()))
    source = store(stores, fresh_redis.url)
    assert source.is_quarantined("saga-q") and not source.is_quarantined("saga-r")
    rep = await RecoveryDaemon(log, quarantine=source, clock=lambda: time.time() + 3600).sweep()
    assert [r.status for r in rep.results] == ["QUARANTINED"]


# ---------------------------------------------------------------------- data loss (synced marker)
async def test_flushall_keeps_the_halt_for_grace_then_refuses_until_re_projected(
        fresh_redis: RedisServer, stores, tmp_path, caplog):
    clock = ManualClock()
    agent = store(stores, fresh_redis.url, grace=30, clock=clock)
    wal = FileWAL(tmp_path / "agent.wal")
    try:
        ks = KillSwitch(agent, wal=wal, clock=clock)
        halt = Lever.new("Halt", "tool:wire.send", reason="fraud pattern", by="soc@corp", now=clock.time())
        store(stores, fresh_redis.url).engage(halt)
        r = fresh_redis.client()
        try:
            marker = json.loads(r.hget(f"{P}:synced", "store"))
            assert marker["writer"] == "store" and marker["rev"] == int(r.get(f"{P}:rev"))
        finally:
            r.close()
        await ks.check(req("x"))  # started
        until("the halt to reach the agent", lambda: agent.view().levers, timeout=10)
        assert ks.status()["posture"] == "ok"

        with caplog.at_level("WARNING", logger="agent_saga.controls"):
            fresh_redis.flush()
            # The watcher notes the loss (data_lost), degrades, then logs the warning: wait
            # for the last of the three, or the checks below race the watcher thread.
            until("the agent to notice the data loss", lambda: agent.data_lost and any(
                "lost its data" in rec.getMessage() and rec.levelname == "WARNING" for rec in caplog.records),
                timeout=10)
        view = agent.view()
        assert view.usable and view.levers and "synced marker" in (view.degraded or "")
        assert "fraud pattern" in (await refusal(ks, "wire.send") or ""), "the empty index is not 'no levers'"
        assert await refusal(ks, "stripe.charge") is None, "within grace: the last known state"
        assert ks.status()["posture"] == "degraded"
        seen = agent.reloads
        until("several heartbeats to re-read the empty plane", lambda: agent.reloads >= seen + 3, timeout=10)
        # still the last known state
        assert "fraud pattern" in (await refusal(ks, "wire.send") or "")
        clock.advance(30.1)
        reason = await refusal(ks, "stripe.charge")
        assert reason is not None and "grace window of 30s has passed" in reason and "re-projected" in reason
        assert ks.status()["posture"] == "closed"

        # The CLI (a write through RedisSwitchStore) re-projects the halt and the marker.
        out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "halt", "--scope", "tool:wire.send",
                              "--reason", "fraud pattern again", "--by", "soc@corp", "--store", fresh_redis.url],
                             capture_output=True, text=True, timeout=60, env={**os.environ, **PLANE_ENV})
        assert out.returncode == 0, out.stderr
        until("the agent to recover", lambda: agent.view().usable and agent.data_lost is None, timeout=10)
        assert ks.status()["posture"] == "ok"
        assert await refusal(ks, "stripe.charge") is None
        assert "fraud pattern again" in (await refusal(ks, "wire.send") or "")
        wal.barrier_sync()
    finally:
        wal.close()
    types = [item.type for _, item in iter_file_records(tmp_path / "agent.wal")]
    assert types[:4] == ["KILL_SWITCH_ENGAGED", "KILL_SWITCH_DEGRADED", "KILL_SWITCH_FAILED_CLOSED",
                         "KILL_SWITCH_RESTORED"]


async def test_flushall_with_grace_zero_refuses_at_once(fresh_redis: RedisServer, stores):
    clock = ManualClock()
    agent = store(stores, fresh_redis.url, grace=0, clock=clock)
    ks = KillSwitch(agent, clock=clock)
    store(stores, fresh_redis.url).engage(Lever.new("Halt", "tool:wire.send", reason="r", by="b", now=clock.time()))
    await ks.check(req("x"))
    until("the halt to reach the agent", lambda: agent.view().levers, timeout=10)
    fresh_redis.flush()
    until("the agent to notice the data loss", lambda: agent.data_lost, timeout=10)
    reason = await refusal(ks, "stripe.charge")
    assert reason is not None and "grace window of 0s has passed" in reason


async def test_a_fresh_redis_without_marker_means_no_levers(fresh_redis: RedisServer, stores):
    agent = store(stores, fresh_redis.url)
    ks = KillSwitch(agent)
    assert await refusal(ks, "wire.send") is None
    assert agent.writers_seen == frozenset() and agent.data_lost is None
    assert ks.status()["posture"] == "ok"
    seen = agent.reloads
    fresh_redis.flush()  # nothing was ever marked: still a fresh installation
    until("two heartbeats to re-read the empty plane", lambda: agent.reloads >= seen + 2, timeout=10)
    assert await refusal(ks, "wire.send") is None and agent.data_lost is None


async def test_a_restart_without_persistence_after_a_lift_is_data_loss_too(fresh_redis: RedisServer, stores):
    # The marker outlives its levers: an empty plane after a lift is authoritative, an
    # empty plane after the marker vanished is not.
    clock = ManualClock()
    agent = store(stores, fresh_redis.url, grace=30, clock=clock)
    ks = KillSwitch(agent, clock=clock)
    writer = store(stores, fresh_redis.url)
    lever = Lever.new("Halt", "global", reason="r", by="b", now=clock.time())
    writer.engage(lever)
    writer.lift(lever.id)
    assert await refusal(ks, "x") is None
    assert agent.writers_seen == {"store"}
    fresh_redis.restart()
    until("the agent to notice the data loss", lambda: agent.connected and agent.data_lost, timeout=10)
    assert await refusal(ks, "x") is None, "within grace: the last known state (no levers)"
    clock.advance(31)
    assert await refusal(ks, "x") is not None
