"""RedisLimitSource and the synced marker, stepped through on a real Redis: the test writes
the policy plane's keys (documents, index, rev, marker) directly and drives the source's
one atomic read (``LUA_READ``) itself, so every data-loss rule is checked against the real
script. The operator-driven version is in tests/integration/test_limits_redis_marker.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from agent_saga.controls import (
    BudgetLimit,
    InProcessLimitStore,
    PreFlightGate,
    RateLimit,
    RedisLimitSource,
)
from agent_saga.controls.limits._source import _about_limits
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from fixtures.redis_server import PLANE_PREFIX as P
from fixtures.redis_server import client_for


class Plane:
    """Writes the keys the operator's projection writes, on a real Redis."""

    def __init__(self, url: str) -> None:

        self.client = client_for(url)
        self.client.flushall()

    def put(self, id_: str, lim: BudgetLimit | RateLimit) -> None:
        rev = self.client.incr(f"{P}:rev")
        self.client.set(f"{P}:budgetlimit:{id_}", json.dumps({"rev": rev, "v": 1, "limit": lim.spec().to_doc()}))
        self.client.sadd(f"{P}:budgetlimit:index", id_)

    def put_raw(self, id_: str, raw: str) -> None:
        self.client.set(f"{P}:budgetlimit:{id_}", raw)
        self.client.sadd(f"{P}:budgetlimit:index", id_)

    def mark(self, writer: str = "operator") -> None:
        self.client.incr(f"{P}:rev")
        self.client.hset(f"{P}:synced", writer, "{}")

    def flushall(self) -> None:
        self.client.flushall()


@pytest.fixture
def plane(fresh_redis: Any) -> Iterator[Plane]:
    plane = Plane(fresh_redis.url)
    yield plane
    plane.client.close()


SPEND = BudgetLimit("payments.daily-spend", arg="amount", max_total=1000, window=86_400)
VELOCITY = RateLimit("payments.velocity", max_calls=3, window=60)


def source(plane: Plane, **kw: Any) -> RedisLimitSource:
    src = RedisLimitSource("redis://unused:6379/0", prefix=P, **kw)  # no watcher: the test drives the reads
    src._load(plane.client)
    return src


def limits_of(src: RedisLimitSource) -> list[str]:
    return [lim.name for lim in src._snapshot.limits]


def test_flushall_keeps_the_last_known_limits_until_the_operator_marks_the_plane_again(plane, caplog):
    plane.put("payments/daily-spend", SPEND)
    plane.put("payments/velocity", VELOCITY)
    plane.mark()
    src = source(plane)
    assert limits_of(src) == ["payments.daily-spend", "payments.velocity"]
    assert src.writers_seen == {"operator"}
    version = src._snapshot.version

    caplog.set_level(logging.WARNING, "agent_saga.controls")
    plane.flushall()
    src._load(plane.client)
    src._load(plane.client)  # a second read while lost: no second warning
    assert limits_of(src) == ["payments.daily-spend", "payments.velocity"], "empty is not 'no limits'"
    assert src._snapshot.version == version
    assert src.status()["data_lost"] is True
    assert "synced marker" in (src.status()["data_lost_reason"] or "")
    lost = [r for r in caplog.records if "lost its data" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING

    # The operator's resync re-projects one document: a partial state, still not adopted.
    plane.put("payments/velocity", VELOCITY)
    src._load(plane.client)
    assert limits_of(src) == ["payments.daily-spend", "payments.velocity"]
    assert src.status()["data_lost"] is True

    # Every resource re-projected (here, one was deleted meanwhile), then the marker: normal.
    plane.mark()
    src._load(plane.client)
    assert limits_of(src) == ["payments.velocity"]
    assert src.status()["data_lost"] is False and src.data_lost is None
    back = [r for r in caplog.records if "marker is back" in r.getMessage()]
    assert len(back) == 1 and back[0].levelno == logging.WARNING
    src._load(plane.client)
    assert len([r for r in caplog.records if "marker is back" in r.getMessage()]) == 1


def test_a_source_that_never_saw_a_marker_takes_an_empty_plane_as_no_limits(plane):
    plane.put("payments/daily-spend", SPEND)  # documents without a marker: adopted as found
    src = source(plane)
    assert limits_of(src) == ["payments.daily-spend"]
    plane.flushall()
    src._load(plane.client)
    assert limits_of(src) == [], "never seen a marker: a fresh installation, no limits"
    assert src.status()["data_lost"] is False


def test_the_operator_field_vouches_for_limits_without_the_store_field(plane):
    plane.put("payments/daily-spend", SPEND)
    plane.mark("operator")
    plane.mark("store")  # a CLI kill-switch write
    src = source(plane)
    assert src.writers_seen == {"operator", "store"}
    plane.flushall()
    plane.mark("store")  # a CLI write alone does not vouch for the operator's limits
    src._load(plane.client)
    assert src.status()["data_lost"] is True
    assert limits_of(src) == ["payments.daily-spend"]
    plane.flushall()
    plane.mark("operator")  # the operator re-projected everything (there is no limit left)
    src._load(plane.client)
    assert src.status()["data_lost"] is False
    assert limits_of(src) == []


def test_namespaces_are_filtered_in_the_read(plane):
    plane.put("payments/daily-spend", SPEND)
    plane.put("other/velocity", RateLimit("other.velocity", max_calls=1, window=60))
    plane.mark()
    assert limits_of(source(plane, namespaces=["payments"])) == ["payments.daily-spend"]
    assert limits_of(source(plane, namespaces=[])) == []
    assert len(limits_of(source(plane))) == 2


async def test_gate_and_status_show_the_data_loss_and_keep_enforcing(plane):
    plane.put("payments/daily-spend", SPEND)
    plane.mark()
    src = source(plane)
    src._thread = object()  # type: ignore[assignment]  # no watcher: the test drives the reads
    gate = PreFlightGate(limits=src, default_rules=(), checks=(), store=InProcessLimitStore())
    assert gate.status()["limit_source_status"]["data_lost"] is False
    plane.flushall()
    src._load(plane.client)
    st = gate.status()
    assert st["limit_source_status"]["data_lost"] is True
    assert [d["name"] for d in st["limits"]] == ["payments.daily-spend"]
    decision = await gate.decide(StepRequest("s", "s/0", "stripe.charge", ActionSemantics.COMPENSABLE,
                                             {"amount": 5000}))
    assert not decision.allowed and "payments.daily-spend" in decision.reason


def test_the_marker_notification_triggers_a_reload():
    assert _about_limits(b'{"rev":9,"v":1,"kind":"PolicyPlane","id":"operator","op":"synced"}')
    assert _about_limits(b'{"rev":9,"v":1,"kind":"BudgetLimit","id":"a/b","op":"put"}')
    assert not _about_limits(b'{"rev":9,"v":1,"kind":"KillSwitch","id":"a/b","op":"put"}')


@pytest.mark.parametrize("raw", ["[1]", '"x"', "{not json"])
def test_an_unreadable_document_is_skipped_not_fatal(plane, raw):
    plane.put_raw("payments/bad", raw)
    plane.put("payments/daily-spend", SPEND)
    src = source(plane)
    assert limits_of(src) == ["payments.daily-spend"]
    assert any("payments/bad" in p for p in src.status()["problems"])
