"""An agent's RedisWAL after Redis restarts: reopened once Redis is back and no record is
in doubt; fail-stop while one is. Real redis-server, stopped and started again; the
agent's controls wired by ``connect_policy_plane``; ``AgentKit.status()`` says which."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agent_saga import AgentKit
from agent_saga.errors import WALError
from agent_saga.heartbeat import Heartbeat
from agent_saga.plane import (
    PlaneConnection,
    PlaneSettings,
    connect_policy_plane,
    disconnect_policy_plane,
)
from agent_saga.wal import get_default_wal
from agent_saga.wal.writers import local_identity, writer_of_identity
from agent_saga_operator.testing import poll
from fixtures.redis_server import PLANE_PREFIX as P
from fixtures.redis_server import WAL_KEY, RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def plane(redis_server_factory: Callable[..., RedisServer], request: pytest.FixtureRequest
          ) -> Iterator[tuple[RedisServer, PlaneConnection]]:
    server = redis_server_factory(appendonly=getattr(request, "param", True))
    conn = connect_policy_plane(settings=PlaneSettings(
        server.url, "payments", "payments-agent", key_prefix=P.removesuffix(":v1"), wal_key=WAL_KEY))
    try:
        yield server, conn
    finally:
        disconnect_policy_plane()


def saga(kit: AgentKit) -> dict[str, Any]:
    send = kit.safe_tool(lambda amount=0: {"id": "tx"}, semantics="REVERSIBLE", name="wire.send")

    async def main() -> dict[str, Any]:
        try:
            async with kit.transaction():
                await send(amount=5)
            return {"ok": True}
        except Exception as e:  # noqa: BLE001 - the answer is the test's subject
            return {"ok": False, "kind": type(e).__name__, "error": str(e)}
    return asyncio.run(main())


def fail_the_wal() -> None:
    wal = get_default_wal()
    with pytest.raises(WALError):
        asyncio.run(wal.barrier(wal.append("STEP_COMMITTED", "s-down")))


@pytest.mark.parametrize("plane", [True, False], ids=["aof", "no-persistence"], indirect=True)
def test_a_failed_redis_wal_is_reopened_once_redis_is_back_and_the_agent_is_ready_again(
        plane: tuple[RedisServer, PlaneConnection], caplog: pytest.LogCaptureFixture) -> None:
    server, conn = plane
    kit = AgentKit("payments-agent", gate=None)
    assert saga(kit) == {"ok": True}
    first = get_default_wal()

    server.stop()
    fail_the_wal()
    status = kit.status()["signals"]["wal"]
    assert status["ok"] is False and status["failed"]
    assert conn.reopen_wal() is False  # Redis is not back: nothing to read back yet
    assert kit.status()["signals"]["wal"]["recovery"].startswith("waiting for Redis")
    assert saga(kit)["kind"] == "WALError"

    server.start()
    with caplog.at_level(logging.WARNING, logger="agent_saga.plane"):
        poll(lambda: kit.status()["signals"]["wal"]["ok"], timeout=30, what="the WAL reopened after Redis is back")
        # The thread that reopened it (the heartbeat's, or this status read) logs it after
        # the swap: the message may come a moment after the new WAL is in place.
        poll(lambda: any("every record's outcome is known" in r.getMessage() for r in caplog.records),
             timeout=30, what="the reopen logged")
    assert get_default_wal() is not first and conn.wal is get_default_wal()
    assert saga(kit) == {"ok": True}
    r = server.client()
    new = get_default_wal()
    assert r.xlen(f"{WAL_KEY}:w:{new.writer}") > 0  # type: ignore[attr-defined]
    # The new writer is the pod's identity's, as the first was: the stream its agent ACL
    # user may append to, and the writer its sagas are bound to (not a service writer).
    identity = local_identity("payments")
    assert writer_of_identity(first.writer, identity) and writer_of_identity(new.writer, identity)  # type: ignore


def test_a_record_in_doubt_keeps_the_wal_failed_and_the_process_closed(
        plane: tuple[RedisServer, PlaneConnection]) -> None:
    server, conn = plane
    assert conn.heartbeat is not None
    r = server.client()
    kit = AgentKit("payments-agent", gate=None)
    assert saga(kit) == {"ok": True}
    wal = get_default_wal()

    def posture() -> str:
        conn.heartbeat.beat()  # type: ignore[union-attr] - what the writer's thread writes at its next tick
        return Heartbeat.from_doc(json.loads(r.get(f"{P}:agent:{conn.heartbeat.id}"))).posture  # type: ignore

    assert posture() == "ok"
    # Another process writes with this writer id: the next batch is fenced, and what the
    # stream's end holds cannot be told apart from this writer's own records.
    stream = f"{WAL_KEY}:w:{wal.writer}"  # type: ignore[attr-defined]
    r.xadd(stream, {"r": "not this writer's record"}, id=f"{int(r.incr(f'{WAL_KEY}:gseq'))}-0")
    fail_the_wal()
    assert posture() == "closed", "a process whose WAL failed refuses every saga: not ok"
    assert conn.reopen_wal() is False
    assert get_default_wal() is wal
    recovery = kit.status()["signals"]["wal"]["recovery"]
    assert recovery.startswith("fail-stop: a record is in doubt") and "another process writes" in recovery
    # Closing it says so too (and leaves nothing for the interpreter's exit to report).
    with pytest.raises(WALError, match="another process writes"):
        wal.close(timeout=5.0)
