"""RedisPolicySource on a real Redis: live reload, deletion reverts to the code, the last
policy holds for the grace window when the plane is lost, then everything is refused;
Observe mode records the tool surface. Documents are written the way the operator writes
them (its Projector and document builder)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from agent_saga.clocks import ManualClock
from agent_saga.controls import PreFlightGate
from agent_saga.controls.policy import RedisPolicySource
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from agent_saga_operator.documents import Identity, saga_policy_doc
from agent_saga_operator.models import SagaPolicySpec
from agent_saga_operator.projection import Projector
from agent_saga_operator.testing import poll
from fixtures.redis_server import KEY_PREFIX, RedisServer
from fixtures.redis_server import PLANE_PREFIX as P
from fixtures.steps import req as step_request

pytestmark = pytest.mark.integration
R = ActionSemantics.REVERSIBLE
POLICY = {"tools": {"search_docs": {"semantics": "REVERSIBLE"}}}


def project(url: str, name: str, spec: dict[str, Any] | None, *, generation: int = 1, ns: str = "payments") -> None:
    """Put (or, with ``spec`` None, delete) a SagaPolicy document as the operator does."""
    async def go() -> None:
        p = Projector(url, prefix=KEY_PREFIX)
        try:
            if spec is None:
                await p.delete("SagaPolicy", f"{ns}/{name}")
            else:
                who = Identity(ns, name, f"uid-{name}", generation, datetime(2026, 7, 1, tzinfo=UTC))
                await p.put("SagaPolicy", who.id, saga_policy_doc(SagaPolicySpec.model_validate(spec), who))
        finally:
            await p.aclose()

    asyncio.run(go())


def req(tool: str, **args: Any) -> StepRequest:
    return step_request(tool, R, saga="s", **args)


@pytest.fixture
def source(fresh_redis: RedisServer):
    made: list[RedisPolicySource] = []

    def make(**kw: Any) -> RedisPolicySource:
        kw.setdefault("grace", 30)
        s = RedisPolicySource(fresh_redis.url, agent=kw.pop("agent", "payments-agent"), namespaces=["payments"],
                              heartbeat=0.1, prefix=P, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def ids(src: RedisPolicySource) -> list[tuple[str, int]]:
    return [(p.id, p.generation) for p in src.view().policies.policies]


def test_an_applied_policy_is_in_force_an_edit_reloads_it_and_a_delete_reverts_to_the_code(
        fresh_redis: RedisServer, source) -> None:
    src = source()
    assert src.view().usable and not src.view().policies  # nothing projected: the code's declarations
    gate = PreFlightGate(policy=src, default_rules=())
    project(fresh_redis.url, "p", POLICY)
    poll(lambda: ids(src) == [("payments/p", 1)] or None, timeout=10, what="the policy loaded")
    d = asyncio.run(gate.decide(req("wire.send")))
    assert d.verdict == "BLOCK" and d.decided_by == "policy:payments/p"
    project(fresh_redis.url, "p", {"tools": {**POLICY["tools"], "wire.send": {"semantics": "REVERSIBLE"}}},
            generation=2)
    poll(lambda: ids(src) == [("payments/p", 2)] or None, timeout=10, what="the edit loaded")
    assert asyncio.run(gate.decide(req("wire.send"))).verdict == "ALLOW"
    project(fresh_redis.url, "p", None)
    poll(lambda: ids(src) == [] or None, timeout=10, what="the deletion seen")
    assert asyncio.run(gate.decide(req("undeclared.tool"))).verdict == "ALLOW"


def test_a_policy_whose_applies_to_does_not_match_the_agent_does_not_govern_it(fresh_redis: RedisServer,
                                                                               source) -> None:
    project(fresh_redis.url, "billing-only", {**POLICY, "appliesTo": {"agents": ["billing-*"]}})
    project(fresh_redis.url, "other-ns", POLICY, ns="billing")
    src = source()
    assert src.view().usable and ids(src) == []


def test_an_unreadable_document_is_skipped_and_reported(fresh_redis: RedisServer, source) -> None:
    project(fresh_redis.url, "p", POLICY)
    r = fresh_redis.client()
    doc = json.loads(r.get(f"{P}:sagapolicy:payments/p"))
    doc["policy"]["mode"] = "Audit"
    r.set(f"{P}:sagapolicy:payments/p", json.dumps(doc))
    src = source()
    assert ids(src) == [] and src.problems and "policy.mode" in src.problems[0]


def test_the_plane_lost_the_last_policy_holds_for_the_grace_window_then_every_call_is_refused(
        fresh_redis: RedisServer, source) -> None:
    clock = ManualClock()
    project(fresh_redis.url, "p", POLICY)
    src = source(grace=30, clock=clock)
    assert ids(src) == [("payments/p", 1)]
    gate = PreFlightGate(policy=src, default_rules=())
    fresh_redis.kill()
    poll(lambda: src.view().degraded or None, timeout=10, what="the loss noticed")
    held = asyncio.run(gate.decide(req("wire.send")))
    assert held.verdict == "BLOCK" and held.decided_by == "policy:payments/p"  # still the policy, not the code
    assert asyncio.run(gate.decide(req("search_docs"))).verdict == "ALLOW"
    clock.advance(31)
    closed = asyncio.run(gate.decide(req("search_docs")))
    assert closed.verdict == "BLOCK" and closed.decided_by == "policy-source"
    assert "grace window of 30s has passed" in closed.reason
    fresh_redis.start()
    poll(lambda: src.view().usable or None, timeout=15, what="usable again once the plane answers")


def test_a_data_loss_is_not_read_as_no_policy(fresh_redis: RedisServer, source) -> None:
    clock = ManualClock()
    project(fresh_redis.url, "p", POLICY)
    r = fresh_redis.client()
    r.hset(f"{P}:synced", "operator", json.dumps({"v": 1, "writer": "operator", "rev": 1, "ts": 0}))
    src = source(grace=10, clock=clock)
    assert ids(src) == [("payments/p", 1)]
    r.flushall()
    poll(lambda: src.view().degraded or None, timeout=10, what="the data loss noticed")
    assert ids(src) == [("payments/p", 1)]  # the empty index is not "no policy"
    clock.advance(11)
    assert not src.view().usable and "lost its data" in str(src.view().problem)


def test_never_read_the_gate_refuses_every_call() -> None:
    src = RedisPolicySource("redis://127.0.0.1:1/0", agent="a", namespaces=["payments"], grace=30)
    try:
        d = asyncio.run(PreFlightGate(policy=src).decide(req("search_docs")))
    finally:
        src.close()
    assert d.verdict == "BLOCK" and d.decided_by == "policy-source" and "has not been read yet" in d.reason


def test_observe_mode_records_the_tool_surface_in_the_policy_plane(fresh_redis: RedisServer, source) -> None:
    project(fresh_redis.url, "observe", {"mode": "Observe"})
    src = source()
    gate = PreFlightGate(policy=src, default_rules=())
    for _ in range(3):
        assert asyncio.run(gate.decide(req("wire.send", amount=5, to="acct_9"))).verdict == "ALLOW"
    r = fresh_redis.client()

    def recorded() -> dict[str, Any] | None:
        raw = r.hget(f"{P}:surface:payments/payments-agent", "wire.send")
        doc = json.loads(raw) if raw else None
        return doc if doc and doc["calls"] == 3 else None
    doc = poll(recorded, timeout=10, what="the surface recorded")
    assert doc["semantics"] == "REVERSIBLE" and doc["policyArgs"] == ["amount", "to"]
    assert "acct_9" not in json.dumps(doc)  # names, never values
    assert r.sismember(f"{P}:surface:index", "payments/payments-agent")
    assert time.time() >= doc["lastSeen"] >= doc["firstSeen"]
