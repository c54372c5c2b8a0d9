"""Agent heartbeats on a real Redis: written, notified on change only, dropped when the
process stops beating (SIGKILL), removed on a clean exit, and read by the operator."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from agent_saga.heartbeat import AppliedRef, AppliedState, Heartbeat, HeartbeatWriter, heartbeat_key
from agent_saga_operator.acks import Tracked, read_fleet, tally
from agent_saga_operator.testing import poll
from fixtures.redis_server import PLANE_PREFIX as P
from fixtures.redis_server import RedisServer, client_for, index_entries

pytestmark = pytest.mark.integration
P = f"{P}"
ROOT = Path(__file__).resolve().parents[2]


def fleet(url: str, now: float | None = None):
    async def read():
        client = client_for(url, asynchronous=True)
        try:
            return await read_fleet(client, P, now=now)
        finally:
            await client.aclose()

    return asyncio.run(read())


def test_a_heartbeat_says_what_the_process_applied(fresh_redis: RedisServer) -> None:
    state = AppliedState(rev="7", posture="ok", killswitches=(AppliedRef("payments/halt", "u1", 3),),
                         policies=None, limits=(), routes=(AppliedRef("payments/default", "u2", 4),))
    w = HeartbeatWriter(fresh_redis.url, prefix=P, namespace="payments", agent="payments-agent", state=lambda: state,
                        pod="p-1", interval=5)
    w.start()
    try:
        raw = fresh_redis.client().get(heartbeat_key(P, w.id))
        doc = json.loads(raw)
        assert doc["agent"] == "payments-agent" and doc["pod"] == "p-1" and doc["pid"] == os.getpid()
        assert doc["killswitches"] == [{"id": "payments/halt", "uid": "u1", "generation": 3}]
        assert doc["policies"] is None and doc["limits"] == [] and doc["rev"] == "7" and doc["ttl"] == 15
        assert doc["routes"] == [{"id": "payments/default", "uid": "u2", "generation": 4}]
        (hb,) = fleet(fresh_redis.url).beats
        assert hb == Heartbeat.from_doc(doc)
        assert tally(fleet(fresh_redis.url), Tracked("KillSwitch", "payments", "halt", "u1", 3)).acknowledged == 1
        assert tally(fleet(fresh_redis.url), Tracked("ModelRoute", "payments", "default", "u2", 4)).acknowledged == 1
    finally:
        w.close()


def test_a_change_of_what_was_applied_is_notified_and_a_refresh_is_not(fresh_redis: RedisServer) -> None:
    applied: list[AppliedRef] = []
    w = HeartbeatWriter(fresh_redis.url, prefix=P, namespace="payments", agent="a", state=lambda: AppliedState(
        killswitches=tuple(applied)), pod="p-1", interval=60)
    sub = fresh_redis.client().pubsub()
    sub.subscribe(f"{P}:agents:events")
    assert sub.get_message(timeout=2)["type"] == "subscribe"
    try:
        assert w.beat() is True  # the first beat is a change
        assert json.loads(sub.get_message(timeout=2)["data"]) == {"v": 1, "kind": "AgentHeartbeat", "id": w.id,
                                                                   "op": "put"}
        assert w.beat() is False
        applied.append(AppliedRef("payments/halt", "u1", 1))
        assert w.beat() is True
        msgs = [sub.get_message(timeout=1) for _ in range(2)]
        assert [json.loads(m["data"])["op"] for m in msgs if m] == ["put"]  # one, for the change
    finally:
        w.close()
        sub.close()


def test_a_clean_exit_removes_the_heartbeat(fresh_redis: RedisServer) -> None:
    w = HeartbeatWriter(fresh_redis.url, prefix=P, namespace="payments", agent="a", state=AppliedState, pod="p-1", interval=5)
    w.start()
    assert len(fleet(fresh_redis.url).beats) == 1
    w.close()
    assert fleet(fresh_redis.url).beats == ()
    assert index_entries(fresh_redis.client()) == 0


def test_a_heartbeat_past_its_ttl_does_not_count_even_before_redis_expires_it(fresh_redis: RedisServer) -> None:
    w = HeartbeatWriter(fresh_redis.url, prefix=P, namespace="payments", agent="a", state=AppliedState, pod="p-1", interval=5)
    w.start()
    try:
        assert len(fleet(fresh_redis.url).beats) == 1
        assert fleet(fresh_redis.url, now=time.time() + 16).beats == ()
        assert index_entries(fresh_redis.client()) == 0  # cleaned up
    finally:
        w.close()


def test_a_killed_agent_drops_out_within_its_ttl(fresh_redis: RedisServer) -> None:
    code = textwrap.dedent(f"""
        import sys, time
        from agent_saga.heartbeat import AppliedState, HeartbeatWriter
        w = HeartbeatWriter({fresh_redis.url!r}, prefix={P!r}, namespace="payments", agent="doomed", state=AppliedState,
                            pod="p-9", interval=0.2, ttl=2.0)  # a loaded machine may pause it 0.6 s
        w.start()
        print("beating", flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "runtime")}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "beating"
        # Counted while it beats. Polled: on a loaded machine the beating thread can miss
        # a 2 s window, and the next beat counts it again.
        poll(lambda: [b.agent for b in fleet(fresh_redis.url).beats] == ["doomed"] or None, timeout=10,
             what="the live agent's heartbeat to count")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        (last,) = fleet(fresh_redis.url).beats or (None,)
        if last is not None:  # not expired yet: it stops counting exactly at ts + ttl
            assert last.ttl == pytest.approx(2.0)
            assert fleet(fresh_redis.url, now=last.ts + last.ttl).beats == ()
        poll(lambda: fleet(fresh_redis.url).beats == () or None, timeout=10,
             what="the killed agent's heartbeat to stop counting")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def test_heartbeats_resume_after_a_redis_restart(fresh_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """A heartbeat is a report, not a record: a beat that fails is retried on a new
    connection at the next tick, so a Redis restart (which empties it here) hides the
    process only until Redis is back."""
    w = HeartbeatWriter(fresh_redis.url, prefix=P, namespace="payments", agent="survivor", state=AppliedState,
                        pod="p-2", interval=0.1, ttl=5.0)
    w.start()
    try:
        fresh_redis.stop()
        poll(lambda: w.last_error, timeout=10, what="a beat to fail while Redis is down")
        fresh_redis.start()  # empty (no persistence): only a new beat puts the heartbeat back
        after = w.beats
        poll(lambda: (w.beats > after and [b.pod for b in fleet(fresh_redis.url).beats] == ["p-2"]) or None,
             timeout=10, what="the heartbeat to be written again after the restart")
        assert w.last_error is None
        assert "heartbeats are written again" in caplog.text
    finally:
        w.close()


def test_an_unreachable_policy_plane_fails_the_first_beat_naming_the_store() -> None:
    w = HeartbeatWriter("redis://127.0.0.1:1/0", namespace="payments", agent="a", state=AppliedState, pod="p")
    with pytest.raises(ConnectionError, match=r"HeartbeatWriter\(redis://127.0.0.1:1/0, payments/p\.\d+\) could not"):
        w.start()
