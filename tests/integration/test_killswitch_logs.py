"""What an agent logs about its levers, against a real redis-server reached with a
password: each lever engaged or lifted at INFO, each refusal at INFO naming the control
and the object, and no warning about a secret (the store's address is masked by the
library itself; the password is never in a log line or the WAL)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_saga.controls import KillSwitch, PreFlightGate, RedisSwitchStore
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL
from fixtures.polling import until
from fixtures.redis_server import PLANE_PREFIX as P
from fixtures.redis_server import RedisServer

pytestmark = pytest.mark.integration
PASSWORD = "s3cr3t-Passw0rd-of-the-agent"


@pytest.fixture
def url(redis_server_factory: Callable[..., RedisServer]) -> str:
    server = redis_server_factory()
    server.client().execute_command("ACL", "SETUSER", "agent", "on", f">{PASSWORD}", "~*", "&*", "+@all")
    return f"redis://agent:{PASSWORD}@127.0.0.1:{server.port}/0"


@pytest.fixture
def stores(url: str) -> Iterator[list[RedisSwitchStore]]:
    made = [RedisSwitchStore(url, grace=30, heartbeat=0.1, prefix=P) for _ in range(2)]
    yield made
    for s in made:
        s.close()


async def test_levers_and_refusals_are_logged_at_info_and_the_stores_address_is_no_secret(
        stores: list[RedisSwitchStore], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_saga")
    wal = FileWAL(tmp_path / "agent.wal")
    admin = KillSwitch(stores[0], wal=FileWAL(tmp_path / "admin.wal"))
    agent = KillSwitch(stores[1], wal=wal)
    gate = PreFlightGate(default_rules=(), checks=[agent], limits=(), approval_provider=None, policy=None)
    request = StepRequest("s-1", "s-1/0", "wire.send", ActionSemantics.COMPENSABLE, {}, ())
    assert (await gate.decide(request)).allowed

    lever = admin.halt("tool:wire.send", reason="fraud pattern", by="soc@corp")
    until("the halt to reach the agent", lambda: agent.levers(), timeout=10)
    decision = await gate.decide(request)
    assert not decision.allowed
    admin.resume("tool:wire.send", by="soc@corp")
    until("the lift to reach the agent", lambda: not agent.levers(), timeout=10)
    await agent.check(request)  # the agent adopts the view without the lever

    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    engaged = [m for m in infos if m.startswith(f"kill switch {lever.id} engaged: Halt tool:wire.send")]
    lifted = [m for m in infos if m.startswith(f"kill switch {lever.id} lifted")]
    assert len(engaged) == 2 and len(lifted) == 2, infos  # the admin's process and the agent's
    refused = [m for m in infos if m.startswith("refused wire.send in saga s-1: kill switch")]
    assert refused and lever.id in refused[0], infos
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [], [r.getMessage() for r in warnings]
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)
    wal.close()
    admin_log = (tmp_path / "admin.wal").read_text() + (tmp_path / "agent.wal").read_text()
    assert PASSWORD not in admin_log and "agent:***@127.0.0.1" in admin_log and "[REDACTED]" not in admin_log
