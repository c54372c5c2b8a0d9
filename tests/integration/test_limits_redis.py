"""RedisLimitStore against a real redis-server: the same semantics as in-process, atomic,
on the server's clock, failing closed when the server is gone and resuming when it is back."""

from __future__ import annotations

import asyncio
import time

import pytest
from agent_saga.cli import main
from agent_saga.controls import (
    BudgetLimit,
    InProcessLimitStore,
    PreFlightGate,
    RateLimit,
    RedisLimitStore,
    by_arg,
    by_tool,
    rule,
)
from agent_saga.controls.limits import Charge, LimitStoreUnavailable
from agent_saga.errors import ConfigurationError
from agent_saga.gates import StepRequest
from fixtures.redis_server import RedisServer
from fixtures.reply_proxy import ReplyDroppingProxy
from fixtures.steps import req as step_request

DAY = 86_400


def req(amount: object = 100, tool: str = "stripe.charge", **args) -> StepRequest:
    return step_request(tool, **{"amount": amount, **args})


async def used(store: RedisLimitStore, name: str, key: str = "*") -> float:
    for u in await store.usage():
        if u.name == name and u.key == key:
            return u.used
    return 0.0


@pytest.fixture
async def store(fresh_redis: RedisServer):
    s = RedisLimitStore(fresh_redis.url)
    yield s
    await s.aclose()


async def test_redis_budget_all_or_nothing_and_a_refusal_hands_the_budget_back(store):
    gate = PreFlightGate(
        rules=[rule("no-wires", lambda r: r.tool == "wire.send", "BLOCK")],
        limits=[
            BudgetLimit("daily-spend", arg="amount", max_total=1000, window=DAY),
            BudgetLimit("per-customer", arg="amount", max_total=500, window=DAY, scope=by_arg("customer_id")),
            RateLimit("velocity", max_calls=3, window=60, scope=by_tool),
        ],
        store=store,
    )
    assert (await gate.decide(req(400, customer_id="c1"))).allowed
    d = await gate.decide(req(200, customer_id="c1"))
    assert d.verdict == "BLOCK" and d.decided_by == "limit:per-customer"
    assert "400 of 500 used" in d.reason
    assert await used(store, "daily-spend") == 400, "refused by the second limit: the first was not debited"
    assert await used(store, "velocity", "tool=stripe.charge") == 1
    d = await gate.decide(req(300, tool="wire.send", customer_id="c2"))
    assert d.verdict == "BLOCK" and d.decided_by == "rule:no-wires"
    assert await used(store, "daily-spend") == 400 and await used(store, "per-customer", "customer_id=c2") == 0
    assert (await gate.decide(req(600, customer_id="c3"))).verdict == "BLOCK"  # 400 + 600 > 500 per customer
    assert (await gate.decide(req(500, customer_id="c3"))).allowed
    assert await used(store, "daily-spend") == 900


async def test_redis_and_in_process_stores_agree_to_the_last_bit_on_fractional_amounts(store):
    amounts = [0.1, 0.2, 0.19999999999999998, 1e-17, 0.05, 12.34, 0.66, 7, 0.01, 0.01, 0.01]
    verdicts: dict[str, list[bool]] = {}
    totals: dict[str, float] = {}
    for name, s in (("redis", store), ("in-process", InProcessLimitStore())):
        gate = PreFlightGate(limits=[BudgetLimit("cents", arg="amount", max_total=13.3, window=DAY)], store=s)
        verdicts[name] = [(await gate.decide(req(a))).allowed for a in amounts]
        totals[name] = (await gate.usage())[0].used
    assert verdicts["redis"] == verdicts["in-process"]
    assert totals["redis"] == totals["in-process"], "the running totals are exact doubles on both sides"
    assert False in verdicts["redis"] and True in verdicts["redis"]


async def test_redis_window_slides_on_the_server_clock(store):
    gate = PreFlightGate(limits=[RateLimit("burst", max_calls=2, window=0.5)], store=store)
    assert (await gate.decide(req())).allowed and (await gate.decide(req())).allowed
    assert not (await gate.decide(req())).allowed
    deadline = time.monotonic() + 10
    while not (await gate.decide(req())).allowed:
        assert time.monotonic() < deadline, "the window never slid"
        await asyncio.sleep(0.05)
    # expired entries were handed back to the totals: one debit in the window now
    assert await used(store, "burst") == 1


async def test_redis_repeat_after_a_lost_reply_is_not_debited_twice(store):
    charges = [Charge("a", "*", 5, 100, 60), Charge("b", "k", 1, 10, 30, kind="rate")]
    assert (await store.debit(charges, "d-1")).ok
    spec = store._charges_arg(charges, frozenset())
    again = await store._call("debit", "debit", store._keys, ("d-1", "1", spec, *store._part_args))
    assert again == 2
    await store.declare([BudgetLimit("a", arg="amount", max_total=100, window=60).spec()])
    assert await used(store, "a") == 5
    await store.refund(charges, "d-1")
    await store.refund(charges, "d-1")
    assert await store.usage([BudgetLimit("a", arg="x", max_total=100, window=60).spec()]) == []


async def test_redis_scripts_are_reloaded_after_the_server_forgets_them(store, fresh_redis):
    gate = PreFlightGate(limits=[RateLimit("velocity", 10, 60)], store=store)
    assert (await gate.decide(req())).allowed
    r = fresh_redis.client()
    try:
        r.script_flush()
    finally:
        r.close()
    assert (await gate.decide(req())).allowed
    assert await used(store, "velocity") == 2


async def test_redis_stopped_every_charge_is_blocked_naming_the_store_and_restarted_charging_resumes(
    redis_server_factory,
):
    server = redis_server_factory(appendonly=True)  # the spend must survive the restart
    store = RedisLimitStore(server.url, socket_timeout=2, connect_timeout=1)
    gate = PreFlightGate(limits=[BudgetLimit("daily-spend", arg="amount", max_total=1000, window=DAY)], store=store)
    try:
        for _ in range(3):
            assert (await gate.decide(req(100))).allowed
        server.stop()
        for _ in range(5):
            d = await gate.decide(req(100))
            assert d.verdict == "BLOCK" and not d.allowed and d.decided_by == "limit-store"
            assert f"RedisLimitStore({server.url}) is unreachable" in d.reason
            assert "fail closed" in d.reason and d.detail["debited"] is False
        server.start()
        d = await gate.decide(req(100))
        assert d.allowed, d.reason
        assert await used(store, "daily-spend") == 400, "nothing was debited for the refused calls"
    finally:
        await store.aclose()


async def test_status_shows_each_limits_use_in_its_window(store, fresh_redis, capsys):
    gate = PreFlightGate(
        limits=[
            BudgetLimit("daily-spend", arg="amount", max_total=50_000, window=DAY),
            BudgetLimit("per-customer", arg="amount", max_total=1_000, window=DAY, scope=by_arg("customer_id")),
            RateLimit("velocity", max_calls=20, window=60, scope=by_tool),
            BudgetLimit("wire-ceiling", arg="amount", max_total=250_000, window=DAY, escalate_to_human=True,
                        tools=["wire.*"]),
        ],
        store=store,
    )
    for amount, customer in ((900, "cus_1"), (800, "cus_2"), (4200, "cus_1")):
        await gate.decide(req(amount, customer_id=customer))
    await store.aclose()
    assert await asyncio.to_thread(main, ["status", "--redis-url", fresh_redis.url]) == 0
    out = capsys.readouterr().out
    assert f"store: RedisLimitStore({fresh_redis.url})" in out
    assert "daily-spend: budget, sum of amount <= 50,000 per 1d, scope global" in out
    lines = out.splitlines()
    spend = next(line for line in lines if line.strip().startswith("*"))
    assert "1,700 / 50,000" in spend and "3.4%" in spend and "2 debits" in spend
    cus_1 = next(line for line in lines if "customer_id=cus_1" in line)
    assert "900 / 1,000" in cus_1 and "90.0%" in cus_1, "the 4,200 charge was refused by per-customer"
    cus_2 = next(line for line in lines if "customer_id=cus_2" in line)
    assert "800 / 1,000" in cus_2
    assert "velocity: rate, calls <= 20 per 1min, scope tool" in out
    assert "wire-ceiling" in out and "escalates to a human" in out and "(no use in the window)" in out


@pytest.mark.single_redis("a proxy in front of one server: a cluster client follows MOVED to the nodes' own addresses, past the proxy")
async def test_a_debit_whose_reply_is_lost_is_repeated_up_to_retries_and_counted_once(fresh_redis: RedisServer):
    charges = [Charge("spend", "*", 5, 100, 60)]
    spec = [BudgetLimit("spend", arg="amount", max_total=100, window=60).spec()]
    with ReplyDroppingProxy(fresh_redis.port) as proxy:
        twice = RedisLimitStore(proxy.url, namespace="twice", retries=2)
        once = RedisLimitStore(proxy.url, namespace="once")  # the default: one repeat on a single server
        try:
            assert (await twice.debit(charges, "warm")).ok and (await once.debit(charges, "warm")).ok
            proxy.arm(2)  # the replies of the next two script calls (EVALSHA) are lost
            assert (await twice.debit(charges, "d-1")).ok, "two lost replies, two repeats: the third answers"
            assert proxy.dropped == 2
            await twice.declare(spec)
            assert await used(twice, "spend") == 10, "the debit ran on every attempt and was counted once"
            proxy.arm(2)
            with pytest.raises(LimitStoreUnavailable, match=r"RedisLimitStore\(redis://127.0.0.1:\d+/0\) is unreachable"):
                await once.debit(charges, "d-1")
            assert proxy.dropped == 2
            await once.declare(spec)
            assert await used(once, "spend") == 10, "refused, yet what landed is counted once (fail closed)"
        finally:
            await twice.aclose()
            await once.aclose()


def test_a_negative_retries_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigurationError, match="retries must be >= 0"):
        RedisLimitStore("redis://127.0.0.1:1/0", retries=-1)
