"""RedisLimitSource against a real Redis that loses its data (FLUSHALL): the limit
definitions the operator projected stay in force until it re-projects them and sets its
synced marker again (docs/limits.md, "Data loss"). Documents and marker are written with
the operator's own projection code."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime

from agent_saga.controls import PreFlightGate, RedisLimitSource, RedisLimitStore
from agent_saga.gates import StepRequest
from agent_saga_operator.documents import Identity, budget_limit_doc
from agent_saga_operator.models import BudgetLimitSpec
from agent_saga_operator.projection import Projector
from fixtures.polling import until
from fixtures.redis_server import KEY_PREFIX, RedisServer
from fixtures.redis_server import PLANE_PREFIX as P
from fixtures.steps import req as step_request

WHO = Identity("payments", "daily-spend", "uid-1", 1, datetime(2026, 7, 1, 12, 0, tzinfo=UTC))
NAME = "payments.daily-spend"


def spec(max_total: float) -> BudgetLimitSpec:
    return BudgetLimitSpec.model_validate(
        {"kind": "Budget", "arg": "amount", "maxTotal": max_total, "window": "24h", "tools": ["stripe.*"]})


async def project(url: str, max_total: float, *, mark: bool = True) -> None:
    """What the operator does: put the document; after a full projection, the marker."""
    projector = Projector(url, prefix=KEY_PREFIX)
    try:
        nonce = secrets.token_hex(8)
        await projector.begin_sync(nonce)
        await projector.put("BudgetLimit", WHO.id, budget_limit_doc(spec(max_total), WHO))
        if mark:
            assert await projector.mark_synced(nonce, now=time.time()) >= 0
    finally:
        await projector.aclose()


def req(amount: float, step: str) -> StepRequest:
    return step_request(saga="saga-1", step=step, amount=amount)


def max_totals(source: RedisLimitSource) -> list[float]:
    return [s.max_total for s in source.snapshot().specs]


async def test_flushall_keeps_the_projected_limit_until_the_operator_re_projects_it(fresh_redis: RedisServer):
    url = fresh_redis.url
    await project(url, 1000)
    source = RedisLimitSource(url, namespaces=["payments"], heartbeat=0.2, prefix=P)
    store = RedisLimitStore(url)
    gate = PreFlightGate(limits=source, store=store, default_rules=(), checks=())
    try:
        assert not (await gate.decide(req(5000, "s0"))).allowed
        assert (await gate.decide(req(100, "s1"))).allowed
        assert source.writers_seen == {"operator"}

        fresh_redis.flush()  # FLUSHALL: documents, marker and spend windows are gone
        until("the source to notice the data loss", lambda: source.status()["data_lost"], timeout=10)
        assert max_totals(source) == [1000], "the empty index is not read as 'no limits'"
        refused = await gate.decide(req(5000, "s2"))
        assert not refused.allowed and NAME in refused.reason
        status = gate.status()
        assert status["limit_source_status"]["data_lost"] is True
        assert [d["name"] for d in status["limits"]] == [NAME]

        # A document re-projected without the marker is a partial state: not adopted.
        seen = source.reloads
        await project(url, 2000, mark=False)
        until("several heartbeats to re-read the plane", lambda: source.reloads >= seen + 3, timeout=10)
        assert source.status()["data_lost"] is True
        assert max_totals(source) == [1000]

        # The operator's full projection sets the marker again: normal reloads resume.
        await project(url, 2000)
        until("the marker to be seen again", lambda: not source.status()["data_lost"], timeout=10)
        until("the re-projected definition", lambda: max_totals(source) == [2000], timeout=10)
        assert (await gate.decide(req(1500, "s3"))).allowed
        assert not (await gate.decide(req(5000, "s4"))).allowed
        assert gate.status()["limit_source_status"]["data_lost"] is False
    finally:
        source.close()
        await store.aclose()


async def test_a_source_that_never_saw_the_marker_reads_an_empty_plane_as_no_limits(fresh_redis: RedisServer):
    url = fresh_redis.url
    await project(url, 1000, mark=False)  # no marker yet (the operator is still projecting)
    source = RedisLimitSource(url, namespaces=["payments"], heartbeat=0.2, prefix=P)
    try:
        source.start()
        assert max_totals(source) == [1000]
        fresh_redis.flush()
        until("the empty plane to be adopted", lambda: max_totals(source) == [], timeout=10)
        assert source.status()["data_lost"] is False, "never seen a marker: a fresh installation"
    finally:
        source.close()
