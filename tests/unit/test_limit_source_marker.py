"""RedisLimitSource and the synced marker, without a server: a fake client answers the one
atomic read (``LUA_READ``: rev, marker fields, ids, documents) so the data-loss rules can
be stepped through. The real-server version (FLUSHALL, the operator's projection) is in
tests/integration/test_limits_redis_marker.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from agent_saga.controls import (
    BudgetLimit,
    InProcessLimitStore,
    PreFlightGate,
    RateLimit,
    RedisLimitSource,
)
from agent_saga.controls.limit_source import _about_limits
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics

P = "agentsaga:v1"


class FakeRedis:
    """Just what ``RedisLimitSource._read`` uses: ``register_script(LUA_READ)(...)``."""

    def __init__(self) -> None:
        self.docs: dict[str, str] = {}
        self.marker: dict[str, str] = {}
        self.rev = 0
        self.reads = 0

    def register_script(self, script: str) -> Any:
        assert script == RedisLimitSource.LUA_READ

        def run(*, keys: list[str], args: list[str], client: Any) -> list[Any]:
            assert keys == [f"{P}:budgetlimit:index", f"{P}:rev", f"{P}:synced"]
            assert args[0] == f"{P}:budgetlimit:"
            self.reads += 1
            wanted = set(args[2:]) if args[1] == "1" else None
            ids = [i for i in self.docs if wanted is None or i.partition("/")[0] in wanted]
            return [str(self.rev).encode() if self.rev else None, [f.encode() for f in self.marker],
                    [i.encode() for i in ids], [self.docs[i].encode() for i in ids]]

        return run

    def put(self, id_: str, lim: BudgetLimit | RateLimit) -> None:
        self.rev += 1
        self.docs[id_] = json.dumps({"rev": self.rev, "v": 1, "limit": lim.spec().to_doc()})

    def mark(self, writer: str = "operator") -> None:
        self.rev += 1
        self.marker[writer] = "{}"

    def flushall(self) -> None:
        self.docs.clear()
        self.marker.clear()
        self.rev = 0


SPEND = BudgetLimit("payments.daily-spend", arg="amount", max_total=1000, window=86_400)
VELOCITY = RateLimit("payments.velocity", max_calls=3, window=60)


def source(fake: FakeRedis, **kw: Any) -> RedisLimitSource:
    src = RedisLimitSource("redis://unused:6379/0", **kw)
    src._load(fake)
    return src


def limits_of(src: RedisLimitSource) -> list[str]:
    return [lim.name for lim in src._snapshot.limits]


def test_flushall_keeps_the_last_known_limits_until_the_operator_marks_the_plane_again(caplog):
    fake = FakeRedis()
    fake.put("payments/daily-spend", SPEND)
    fake.put("payments/velocity", VELOCITY)
    fake.mark()
    src = source(fake)
    assert limits_of(src) == ["payments.daily-spend", "payments.velocity"]
    assert src.writers_seen == {"operator"}
    version = src._snapshot.version

    caplog.set_level(logging.WARNING, "agent_saga.controls")
    fake.flushall()
    src._load(fake)
    src._load(fake)  # a second read while lost: no second warning
    assert limits_of(src) == ["payments.daily-spend", "payments.velocity"], "empty is not 'no limits'"
    assert src._snapshot.version == version
    assert src.status()["data_lost"] is True
    assert "synced marker" in (src.status()["data_lost_reason"] or "")
    lost = [r for r in caplog.records if "lost its data" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING

    # The operator's resync re-projects one document: a partial state, still not adopted.
    fake.put("payments/velocity", VELOCITY)
    src._load(fake)
    assert limits_of(src) == ["payments.daily-spend", "payments.velocity"]
    assert src.status()["data_lost"] is True

    # Every resource re-projected (here, one was deleted meanwhile), then the marker: normal.
    fake.mark()
    src._load(fake)
    assert limits_of(src) == ["payments.velocity"]
    assert src.status()["data_lost"] is False and src.data_lost is None
    back = [r for r in caplog.records if "marker is back" in r.getMessage()]
    assert len(back) == 1 and back[0].levelno == logging.WARNING
    src._load(fake)
    assert len([r for r in caplog.records if "marker is back" in r.getMessage()]) == 1


def test_a_source_that_never_saw_a_marker_takes_an_empty_plane_as_no_limits():
    fake = FakeRedis()
    fake.put("payments/daily-spend", SPEND)  # documents without a marker: adopted as found
    src = source(fake)
    assert limits_of(src) == ["payments.daily-spend"]
    fake.flushall()
    src._load(fake)
    assert limits_of(src) == [], "never seen a marker: a fresh installation, no limits"
    assert src.status()["data_lost"] is False


def test_the_operator_field_vouches_for_limits_without_the_store_field():
    fake = FakeRedis()
    fake.put("payments/daily-spend", SPEND)
    fake.mark("operator")
    fake.mark("store")  # a CLI kill-switch write
    src = source(fake)
    assert src.writers_seen == {"operator", "store"}
    fake.flushall()
    fake.mark("store")  # a CLI write alone does not vouch for the operator's limits
    src._load(fake)
    assert src.status()["data_lost"] is True
    assert limits_of(src) == ["payments.daily-spend"]
    fake.docs.clear()
    fake.marker.clear()
    fake.mark("operator")  # the operator re-projected everything (there is no limit left)
    src._load(fake)
    assert src.status()["data_lost"] is False
    assert limits_of(src) == []


def test_namespaces_are_filtered_in_the_read():
    fake = FakeRedis()
    fake.put("payments/daily-spend", SPEND)
    fake.put("other/velocity", RateLimit("other.velocity", max_calls=1, window=60))
    fake.mark()
    assert limits_of(source(fake, namespaces=["payments"])) == ["payments.daily-spend"]
    assert limits_of(source(fake, namespaces=[])) == []
    assert len(limits_of(source(fake))) == 2


async def test_gate_and_status_show_the_data_loss_and_keep_enforcing():
    fake = FakeRedis()
    fake.put("payments/daily-spend", SPEND)
    fake.mark()
    src = source(fake)
    src._thread = object()  # type: ignore[assignment]  # no watcher: the test drives the reads
    gate = PreFlightGate(limits=src, default_rules=(), checks=(), store=InProcessLimitStore())
    assert gate.status()["limit_source_status"]["data_lost"] is False
    fake.flushall()
    src._load(fake)
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
def test_an_unreadable_document_is_skipped_not_fatal(raw):
    fake = FakeRedis()
    fake.docs["payments/bad"] = raw
    fake.put("payments/daily-spend", SPEND)
    src = source(fake)
    assert limits_of(src) == ["payments.daily-spend"]
    assert any("payments/bad" in p for p in src.status()["problems"])
