"""The CLI on the settings an agent pod has (AGENT_SAGA_REDIS_URL) reads the same Redis,
and says which store it read."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from agent_saga.controls import RedisApprovalStore
from agent_saga.controls.approvals import ApprovalRequest, action_digest
from fixtures.cli import cli_module
from fixtures.redis_server import PLANE_ENV, RedisServer
from fixtures.redis_server import PLANE_PREFIX as P

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def cli(url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    env.update({"AGENT_SAGA_REDIS_URL": url, "AGENT_SAGA_NAMESPACE": "payments",
                "PYTHONPATH": str(ROOT / "runtime"), **PLANE_ENV})
    return cli_module(*args, env=env, cwd=cwd)


def test_approvals_list_on_the_pods_settings_shows_the_request_pending_in_redis(
        fresh_redis: RedisServer, tmp_path: Path) -> None:
    store = RedisApprovalStore(fresh_redis.url, prefix=P)
    now = time.time()
    store.create(ApprovalRequest("af83c011" + "0" * 24, "saga-1", "saga-1/0", "wire.send", "rule:irreversible",
                                 "Action cannot be undone", action_digest("wire.send", {"amount": 80000}, "v1"),
                                 "v1", now, now + 600, {"amount": "80000"}, namespace="payments",
                                 agent="payments-agent", arguments={"amount": 80000}))
    store.close()
    out = cli(fresh_redis.url, tmp_path, "approvals", "list")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    scheme = fresh_redis.url.split("://")[0]  # redis, or redis+cluster
    assert first.startswith(f"store: {scheme}://") and first.endswith("(from $AGENT_SAGA_REDIS_URL)"), first
    assert "[PENDING] wire.send -- Action cannot be undone" in out.stdout and "amount: 80000" in out.stdout
    listed = cli(fresh_redis.url, tmp_path, "approvals", "list", "--json")
    assert [r["requestId"] for r in json.loads(listed.stdout)] == ["af83c011" + "0" * 24]
    assert "(from $AGENT_SAGA_REDIS_URL)" in listed.stderr


def test_status_and_halt_on_the_pods_settings_use_the_policy_plane(fresh_redis: RedisServer, tmp_path: Path) -> None:
    before = cli(fresh_redis.url, tmp_path, "status")
    assert before.returncode == 0, before.stdout + before.stderr
    assert "store: none configured" not in before.stdout
    assert "(from $AGENT_SAGA_REDIS_URL)" in before.stdout and "no lever engaged" in before.stdout
    halt = cli(fresh_redis.url, tmp_path, "halt", "--scope", "tool:wire.send", "--reason", "fraud", "--by", "soc@corp")
    assert halt.returncode == 0, halt.stderr
    assert "(from $AGENT_SAGA_REDIS_URL)" in halt.stdout
    after = cli(fresh_redis.url, tmp_path, "status", "--json")
    doc = json.loads(after.stdout)
    assert doc["kill_switch"]["source"] == "$AGENT_SAGA_REDIS_URL"
    assert [lv["scope"] for lv in doc["kill_switch"]["levers"]] == ["tool:wire.send"]
    assert doc["limits"]["source"] == "$AGENT_SAGA_REDIS_URL"
