"""RedisRouteSource on a real Redis: the ModelRoute that applies to the agent decides, an
edit decides the next call, several matching routes name the one in force, an unreadable
document is skipped and reported, a deletion leaves the router refusing. Documents are
written the way the operator writes them (its Projector and document builder)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from agent_saga.heartbeat import AppliedRef
from agent_saga.routing import Message, ModelRequest, RedisRouteSource, Router, RoutingUnavailable
from agent_saga_operator.documents import Identity, model_route_doc
from agent_saga_operator.models import ModelRouteSpec
from agent_saga_operator.projection import Projector
from agent_saga_operator.testing import poll
from fixtures.redis_server import KEY_PREFIX, RedisServer, client_for
from fixtures.redis_server import PLANE_PREFIX as P

pytestmark = pytest.mark.integration


def spec(*hosts: str, applies_to: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"hosts": [{"name": h, "endpoint": f"http://127.0.0.1:9/{h}", "model": h,
                                      "capabilities": {"contextTokens": 4096}} for h in hosts], **extra}
    if applies_to:
        doc["appliesTo"] = {"agents": applies_to}
    return doc


def project(url: str, name: str, body: dict[str, Any] | None, *, generation: int = 1) -> None:
    async def go() -> None:
        p = Projector(url, prefix=KEY_PREFIX)
        try:
            if body is None:
                await p.delete("ModelRoute", f"payments/{name}")
            else:
                who = Identity("payments", name, f"uid-{name}", generation, datetime(2026, 7, 1, tzinfo=UTC))
                await p.put("ModelRoute", who.id, model_route_doc(ModelRouteSpec.model_validate(body), who))
        finally:
            await p.aclose()

    asyncio.run(go())


def route_id(src: RedisRouteSource) -> str | None:
    try:
        return src.route().id
    except RoutingUnavailable:
        return None


def test_the_route_that_applies_decides_and_follows_every_edit(fresh_redis: RedisServer) -> None:
    url = fresh_redis.url
    project(url, "billing", spec("b1", applies_to=["billing-*"]))
    project(url, "payments", spec("p1", "p2", preference=["p2", "p1"]))
    r = client_for(url)
    r.set(f"{P}:modelroute:payments/broken", "{not json")
    r.sadd(f"{P}:modelroute:index", "payments/broken")
    src = RedisRouteSource(url, agent="payments-agent", namespaces=["payments"], heartbeat=0.1, prefix=P)
    try:
        route = src.route()
        assert (route.id, [h.name for h in route.hosts]) == ("payments/payments", ["p2", "p1"])
        assert src.applied() == (AppliedRef("payments/payments", "uid-payments", 1),)
        assert [p.split(":")[0] for p in src.problems] == ["payments/broken"]

        project(url, "payments", spec("p1", "p2", preference=["p1"]), generation=2)
        poll(lambda: src.route().generation == 2, timeout=10, what="generation 2")
        assert [h.name for h in src.route().hosts] == ["p1", "p2"]

        project(url, "another", spec("x1"))  # applies too, and sorts first: it decides, and says so
        poll(lambda: route_id(src) == "payments/another", timeout=10, what="the first matching route by name")
        assert "payments/payments also applies to agent payments-agent; payments/another is in force" in src.problems[-1]

        for name in ("another", "payments"):
            project(url, name, None)
        poll(lambda: route_id(src) is None, timeout=10, what="no route")
        with pytest.raises(RoutingUnavailable, match="no ModelRoute in payments applies to agent payments-agent"):
            Router(src, wal=None).complete(ModelRequest((Message("user", "x"),)))
        assert src.applied() == ()
    finally:
        src.close()
        r.close()


def test_the_last_route_keeps_deciding_while_the_plane_is_lost(fresh_redis: RedisServer) -> None:
    project(fresh_redis.url, "payments", spec("p1"))
    src = RedisRouteSource(fresh_redis.url, agent="payments-agent", namespaces=["payments"], heartbeat=0.1, prefix=P)
    try:
        assert src.route().id == "payments/payments"
        fresh_redis.stop()
        poll(lambda: not src.connected, timeout=10, what="the plane lost")
        assert src.route().id == "payments/payments" and src.status()["last_error"]
    finally:
        src.close()


def test_an_unread_plane_refuses_every_call(fresh_redis: RedisServer) -> None:
    fresh_redis.stop()
    src = RedisRouteSource(fresh_redis.url, agent="payments-agent", heartbeat=0.1, prefix=P)
    try:
        with pytest.raises(RoutingUnavailable, match="no route for agent payments-agent: RedisRouteSource.* is unreachable"):
            Router(src, wal=None).complete(ModelRequest((Message("user", "x"),)))
    finally:
        src.close()

