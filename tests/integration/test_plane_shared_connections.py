"""One agent's Redis connections: its controls share one client and one pub/sub
connection (``agent_saga._shared``), and still fail closed when Redis goes away.

Each control used to open its own (three readers with a command and a subscriber
connection each, the heartbeat, the approval store): about ten per agent, ~9 KB of
server memory each, so a thousand agents needed ~10,000 connections."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga.gates import StepRequest
from agent_saga.plane import PlaneConnection, open_plane
from agent_saga.semantics import ActionSemantics
from agent_saga.wal import FileWAL
from agent_saga_operator.testing import poll
from fixtures.redis_server import PLANE_ENV, RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.single_redis("counts one server's clients")]

#: The agent's connections: the shared client's pool (at most 2), the pub/sub connection,
#: the approval store's client (other timeouts, so its own pool).
MOST = 4
PROBE = StepRequest("probe", "probe/0", "wire.send", ActionSemantics.REVERSIBLE)


def env(url: str, pod: str) -> dict[str, str]:
    return {"AGENT_SAGA_REDIS_URL": url, "AGENT_SAGA_NAMESPACE": "payments", "AGENT_SAGA_AGENT": "payments-agent",
            "POD_NAME": pod, "AGENT_SAGA_SWITCH_GRACE": "0", **PLANE_ENV}


def clients(server: RedisServer, name: str) -> int:
    """The server's clients, but the one asking (named ``name``)."""
    admin = server.client()
    admin.client_setname(name)
    n = sum(1 for c in admin.client_list() if c.get("name") != name)
    admin.close()
    return n


@pytest.fixture
def agent(fresh_redis: RedisServer, tmp_path: Path) -> Iterator[PlaneConnection]:
    conn = open_plane(env(fresh_redis.url, "pod-1"), wal=FileWAL(str(tmp_path / "agent.wal"), sync=False))
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def baseline(fresh_redis: RedisServer) -> int:
    """The server's clients before the agent connects (other tests' may still be open)."""
    return clients(fresh_redis, "shared-test-admin")


def refused(conn: PlaneConnection) -> bool:
    return asyncio.run(conn.kill_switch.check(PROBE)) is not None


def test_an_agents_controls_share_its_connections(baseline: int, agent: PlaneConnection,
                                                  fresh_redis: RedisServer) -> None:
    # every control at work: a halt notified to the three readers, the heartbeat, the approval store
    agent.kill_switch.halt("tool:wire.send", reason="test", by="ops@corp")
    poll(lambda: refused(agent), timeout=30, what="the halt reaching the kill switch")
    assert agent.heartbeat is not None
    agent.heartbeat.beat()  # raises if it cannot write
    agent.approval_store.list(pending_only=True)
    poll(lambda: agent.policy.reloads >= 2 and agent.limit_source.reloads >= 2, timeout=30,
         what="every reader re-read after the notification")
    n = clients(fresh_redis, "shared-test-admin") - baseline
    assert 0 < n <= MOST, f"one agent holds {n} connections (its controls share them: at most {MOST})"


def test_shared_connections_still_fail_closed_when_redis_goes_away(
        agent: PlaneConnection, fresh_redis: RedisServer) -> None:
    assert not refused(agent)
    fresh_redis.kill()
    try:
        # grace 0: the kill switch refuses once it cannot read, through the shared connections
        poll(lambda: refused(agent) and not agent.switch_store.connected and not agent.policy.connected,
             timeout=30, what="the kill switch refusing and the readers noting the loss, with Redis gone")
    finally:
        fresh_redis.start()
    poll(lambda: not refused(agent), timeout=30, what="the kill switch reading again once Redis is back")
