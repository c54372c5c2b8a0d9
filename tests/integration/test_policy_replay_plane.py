"""`agent-saga policy replay` with the policy in force read from the policy plane
(`--from-plane NS/NAME`, a document the operator's projector wrote into a real Redis) and
the log read from a RedisWAL (`--wal-url`), as `agent-saga verify` reads it."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agent_saga import ActionSemantics, ApprovalOutcome, PreFlightGate, saga_scope
from agent_saga.cli import main
from agent_saga.controls.policy import PolicyInForce, StaticPolicySource, parse_policy
from agent_saga.errors import GateBlocked
from agent_saga.wal.redis import RedisWAL
from agent_saga_operator.documents import Identity, saga_policy_doc
from agent_saga_operator.models.sagapolicy import SagaPolicySpec
from agent_saga_operator.projection import Projector
from fixtures.redis_server import KEY_PREFIX, RedisServer, tagged

pytestmark = pytest.mark.integration

POLICY: dict[str, Any] = {"undeclaredTools": "Refuse", "tools": {
    "search": {"semantics": "REVERSIBLE"}, "export": {"semantics": "IRREVERSIBLE"}},
    "rules": [{"name": "eu", "tagged": "eu", "verdict": "Block"}]}


class Approver:
    async def request_approval(self, request: Any, verdict: Any) -> ApprovalOutcome:
        return ApprovalOutcome(True, "risk@corp")


def project(url: str, spec: dict[str, Any]) -> None:
    async def go() -> None:
        p = Projector(url, prefix=KEY_PREFIX)
        try:
            who = Identity("payments", "p", "uid-p", 1, datetime(2026, 7, 1, tzinfo=UTC))
            await p.put("SagaPolicy", who.id, saga_policy_doc(SagaPolicySpec.model_validate(spec), who))
        finally:
            await p.aclose()

    asyncio.run(go())


async def record(url: str, key: str) -> None:
    gate = PreFlightGate(policy=StaticPolicySource([PolicyInForce("payments/p", parse_policy(POLICY))]),
                         approval_provider=Approver(), checks=())
    wal = RedisWAL(url, key=key, writer="w1")
    for tool, tags in (("search", ()), ("search", ("eu",)), ("export", ()), ("crm", ())):
        try:
            async with saga_scope(wal, gate, name="s", tags=tags) as saga:
                await saga.execute(tool, ActionSemantics.REVERSIBLE, lambda: {"ok": True}, policy_args={"n": 1})
        except GateBlocked:
            pass
    await wal.barrier()
    wal.close()


def test_the_policy_in_force_is_read_from_the_plane_and_the_log_from_a_redis_wal(
        fresh_redis: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project(fresh_redis.url, POLICY)
    key = tagged(f"t-{uuid.uuid4().hex[:8]}:wal")
    asyncio.run(record(fresh_redis.url, key))
    url = f"{fresh_redis.url}?key={key}"
    same = tmp_path / "same.json"
    same.write_text(json.dumps(POLICY))
    plane = ["--from-plane", "payments/p", "--store", fresh_redis.url, "--key-prefix", KEY_PREFIX]
    assert main(["policy", "replay", str(same), *plane, "--wal-url", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calls"] == 4 and doc["current"] == ["payments/p"]
    assert doc["verdicts"]["current"] == {"ALLOW": 1, "REQUIRE_APPROVAL": 1, "BLOCK": 2}
    lifted = tmp_path / "lifted.json"
    lifted.write_text(json.dumps({**POLICY, "rules": []}))
    assert main(["policy", "replay", str(lifted), *plane, "--wal-url", url, "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["by_tool"]["search"]["changes"] == {"BLOCK -> ALLOW": 1}
    assert main(["policy", "replay", str(same), "--from-plane", "payments/gone", "--store", fresh_redis.url,
                 "--key-prefix", KEY_PREFIX, "--wal-url", url]) == 2
    assert "no SagaPolicy payments/gone" in capsys.readouterr().err
