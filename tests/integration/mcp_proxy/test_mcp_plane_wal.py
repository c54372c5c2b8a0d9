"""`agent-saga mcp --policy-from-plane` in a pod: with AGENT_SAGA_WAL_STREAM set, the saga
log is the policy plane's stream (what recoveryd sweeps), never a file in the working
directory (a sidecar's root filesystem is read-only: a file there stopped the proxy)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import mcp_support as ms
import pytest
import redis
from agent_saga_operator.documents import Identity, saga_policy_doc
from agent_saga_operator.models import SagaPolicySpec
from agent_saga_operator.projection import Projector
from fixtures.redis_server import KEY_PREFIX, PLANE_ENV, RedisServer, tagged
from mcp import ClientSession, StdioServerParameters, stdio_client

pytestmark = pytest.mark.integration
STREAM = tagged("agent-saga:wal")
SPEC = {"mode": "Enforce", "appliesTo": {"agents": ["effector-agent"]},
        "tools": {"search_docs": {"semantics": "REVERSIBLE"}}}


async def project(url: str) -> None:
    """The SagaPolicy payments/effector-agent, as the operator projects it."""
    p = Projector(url, prefix=KEY_PREFIX)
    try:
        who = Identity("payments", "effector-agent", "uid-effector", 1, datetime(2026, 7, 1, tzinfo=UTC))
        await p.put("SagaPolicy", who.id, saga_policy_doc(SagaPolicySpec.model_validate(SPEC), who))
    finally:
        await p.aclose()


async def test_the_proxy_logs_to_the_plane_stream_not_a_file(fresh_redis: RedisServer, tmp_path: Path) -> None:
    await project(fresh_redis.url)
    env = ms.proxy_env(tmp_path, AGENT_SAGA_REDIS_URL=fresh_redis.url, AGENT_SAGA_NAMESPACE="payments",
                       AGENT_SAGA_AGENT="effector-agent", AGENT_SAGA_WAL_STREAM=STREAM, **PLANE_ENV)
    server = StdioServerParameters(command=sys.executable, args=[
        "-m", "agent_saga.cli", "mcp", "--policy-from-plane", "payments/effector-agent", "--name", "docs",
        "--", sys.executable, str(ms.SERVER)], env=env, cwd=str(tmp_path))
    with open(tmp_path / "proxy.log", "w") as errlog:
        async with stdio_client(server, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            found = await s.call_tool("search_docs", {"query": "refunds"})
            assert not found.is_error, found
    assert not (tmp_path / "agent-saga.wal").exists(), (tmp_path / "proxy.log").read_text()
    client = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    try:
        # RedisWAL keeps records under the stream's key and keys it derives from it.
        text = " ".join(str(v) for k in client.scan_iter(f"{STREAM}*") if client.type(k) == "stream"
                        for _, fields in client.xrange(k) for v in fields.values())
    finally:
        client.close()
    assert "search_docs" in text, (tmp_path / "proxy.log").read_text()
