"""The circuit breaker through the real gate and engine: it trips on consecutive failures
and on a failure rate, lets one trial call through after the cool-down, counts only
tools that ran and failed (never refusals), never blocks a rollback, and records trips,
probes and recoveries in the WAL."""

from __future__ import annotations

import asyncio

import pytest
from agent_saga.compensation import Compensation
from agent_saga.controls import (
    BreakerPolicy,
    BudgetLimit,
    CircuitBreaker,
    InProcessLimitStore,
    ManualClock,
    PreFlightGate,
    by_service,
    get_breaker,
    set_breaker,
)
from agent_saga.errors import ConfigurationError, GateBlocked, StepOutcomeUnknown
from agent_saga.gates import StepRequest
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import read, wal_fixture  # noqa: F401

C = ActionSemantics.COMPENSABLE
R = ActionSemantics.REVERSIBLE


def undo(log: list[str] | None = None, name: str = "x"):
    return lambda r: Compensation(fn=lambda: (log.append(name) if log is not None else None), handler="test.noop")


class Down(Exception):
    pass


def fail() -> None:
    raise Down("503 from stripe")


async def call(wal, gate, tool: str = "stripe.charge", fn=lambda: "ok", **kw):
    """One saga with one step; returns 'ok', 'failed' or 'refused:<stage>'."""
    try:
        async with saga_scope(wal, gate) as saga:
            await saga.execute(tool, C, fn, undo(), **kw)
        return "ok"
    except GateBlocked as exc:
        return f"refused:{exc.decided_by}"
    except (Down, StepOutcomeUnknown):
        return "failed"


def setup(wal, clock: ManualClock | None = None, **policy):
    clock = clock or ManualClock()
    breaker = CircuitBreaker(BreakerPolicy(**policy), wal=wal, clock=clock)
    return breaker, PreFlightGate(default_rules=(), checks=[breaker]), clock


def breaker_records(wal) -> list[tuple[str, str]]:
    return [(r.type, r.payload.get("reason", "")) for r in read(wal, "wal") if r.type.startswith("BREAKER")]


async def test_it_trips_on_consecutive_failures_and_refuses_before_the_tool_runs(wal):
    breaker, gate, _ = setup(wal, failure_threshold=3, min_volume=100)
    assert [await call(wal, gate, fn=fail) for _ in range(3)] == ["failed"] * 3
    ran: list[int] = []
    assert await call(wal, gate, fn=lambda: ran.append(1)) == "refused:breaker"
    assert ran == [] and breaker.state("stripe.charge") == "open"
    assert await call(wal, gate, tool="github.create_pr") == "ok", "other dependencies are not affected"
    assert breaker_records(wal) == [("BREAKER_OPENED", "threshold")]


async def test_a_success_resets_the_consecutive_count(wal):
    breaker, gate, _ = setup(wal, failure_threshold=3, min_volume=100)
    for fn in (fail, fail, lambda: 1, fail, fail):
        await call(wal, gate, fn=fn)
    assert breaker.state("stripe.charge") == "closed"


async def test_it_trips_on_the_failure_rate_once_there_is_volume(wal):
    breaker, gate, clock = setup(wal, failure_threshold=100, failure_rate=0.5, min_volume=6, window=60)
    for fn in (lambda: 1, fail, lambda: 1, fail, lambda: 1):
        await call(wal, gate, fn=fn)
    assert breaker.state("stripe.charge") == "closed", "2 of 5 is under 50%, and under min_volume anyway"
    await call(wal, gate, fn=fail)  # 3 of 6 = 50%
    assert breaker.state("stripe.charge") == "open"
    assert breaker_records(wal) == [("BREAKER_OPENED", "rate")]


async def test_old_calls_leave_the_window(wal):
    breaker, gate, clock = setup(wal, failure_threshold=100, failure_rate=0.5, min_volume=4, window=60)
    for _ in range(3):
        await call(wal, gate, fn=fail)
    clock.advance(61)
    for fn in (lambda: 1, lambda: 1, lambda: 1, fail):
        await call(wal, gate, fn=fn)
    assert breaker.state("stripe.charge") == "closed", "1 of 4 in the window"


async def test_successes_through_a_healthy_circuit_count_toward_the_rate_and_leave_the_window(wal):
    breaker, gate, clock = setup(wal, failure_threshold=100, failure_rate=0.5, min_volume=4, window=60)
    for _ in range(3):  # no failure in the window: each success is counted on the short path
        assert await call(wal, gate) == "ok"
    for _ in range(2):
        await call(wal, gate, fn=fail)
    assert breaker.state("stripe.charge") == "closed", "2 of 5 is under 50%: the 3 successes are the volume"
    assert breaker.status()["circuits"][0]["calls"] == 5
    clock.advance(61)
    for _ in range(3):
        assert await call(wal, gate) == "ok"
    clock.advance(61)  # the successes leave the window as the failures did
    for _ in range(4):
        await call(wal, gate, fn=fail)
    assert breaker.state("stripe.charge") == "open"
    assert breaker_records(wal) == [("BREAKER_OPENED", "rate")]


async def test_after_the_cool_down_one_trial_call_passes_and_its_success_closes_it(wal):
    breaker, gate, clock = setup(wal, failure_threshold=2, cool_down=30)
    await call(wal, gate, fn=fail)
    await call(wal, gate, fn=fail)
    clock.advance(29)
    assert await call(wal, gate) == "refused:breaker"
    clock.advance(1)

    trial_started = asyncio.Event()
    release = asyncio.Event()

    async def slow_ok() -> str:
        trial_started.set()
        await release.wait()
        return "ok"

    trial = asyncio.create_task(call(wal, gate, fn=slow_ok))
    await trial_started.wait()
    assert await call(wal, gate) == "refused:breaker", "only one trial call at a time"
    release.set()
    assert await trial == "ok"
    assert breaker.state("stripe.charge") == "closed"
    assert await call(wal, gate) == "ok"
    kinds = [t for t, _ in breaker_records(wal)]
    assert kinds == ["BREAKER_OPENED", "BREAKER_PROBE", "BREAKER_CLOSED"]


async def test_a_failed_trial_call_opens_it_again_for_another_cool_down(wal):
    breaker, gate, clock = setup(wal, failure_threshold=1, cool_down=30)
    await call(wal, gate, fn=fail)
    clock.advance(30)
    assert await call(wal, gate, fn=fail) == "failed"
    assert breaker.state("stripe.charge") == "open"
    clock.advance(10)
    assert await call(wal, gate) == "refused:breaker"
    clock.advance(20)
    assert await call(wal, gate) == "ok"
    assert [t for t, _ in breaker_records(wal)] == [
        "BREAKER_OPENED", "BREAKER_PROBE", "BREAKER_OPENED", "BREAKER_PROBE", "BREAKER_CLOSED"]
    assert breaker_records(wal)[2] == ("BREAKER_OPENED", "probe_failed")


async def test_refusals_are_not_failures(wal):
    clock = ManualClock()
    breaker = CircuitBreaker(BreakerPolicy(failure_threshold=1), wal=wal, clock=clock)
    gate = PreFlightGate(default_rules=(), checks=[breaker], store=InProcessLimitStore(),
                         limits=[BudgetLimit("daily", arg="amount", max_total=10, window=86_400)])
    for _ in range(5):
        assert await call(wal, gate, policy_args={"amount": 50}) == "refused:limit:daily"
    assert breaker.state("stripe.charge") == "closed"


async def test_a_trial_call_refused_by_a_later_stage_frees_the_trial_slot(wal):
    clock = ManualClock()
    breaker = CircuitBreaker(BreakerPolicy(failure_threshold=1, cool_down=30), wal=wal, clock=clock)
    gate = PreFlightGate(default_rules=(), checks=[breaker], store=InProcessLimitStore(),
                         limits=[BudgetLimit("daily", arg="amount", max_total=10, window=86_400)])
    await call(wal, gate, fn=fail, policy_args={"amount": 1})
    clock.advance(30)
    assert await call(wal, gate, policy_args={"amount": 50}) == "refused:limit:daily"
    assert await call(wal, gate, policy_args={"amount": 1}) == "ok", "the slot was freed, not held forever"
    assert breaker.state("stripe.charge") == "closed"


async def test_a_timeout_counts_and_an_underivable_compensation_does_not(wal):
    breaker, gate, _ = setup(wal, failure_threshold=2)

    async def hang() -> None:
        await asyncio.sleep(10)

    assert await call(wal, gate, fn=hang, timeout=0.01) == "failed"

    def bad_factory(r):
        raise KeyError("no id in the result")

    try:
        async with saga_scope(wal, gate) as saga:
            await saga.execute("stripe.charge", C, lambda: {}, bad_factory)
    except Exception:  # noqa: BLE001 - the tool returned; its inverse could not be built
        pass
    assert breaker.state("stripe.charge") == "closed", "the tool answered: the dependency is fine"
    assert breaker.status()["circuits"][0]["consecutive"] == 0, "a success resets the count"
    assert await call(wal, gate, fn=hang, timeout=0.01) == "failed"
    assert breaker.state("stripe.charge") == "closed"
    assert await call(wal, gate, fn=hang, timeout=0.01) == "failed"
    assert breaker.state("stripe.charge") == "open"


async def test_it_never_blocks_a_rollback_and_compensation_failures_do_not_feed_it(wal):
    breaker = CircuitBreaker(BreakerPolicy(failure_threshold=2), wal=wal, key=by_service, clock=ManualClock())
    gate = PreFlightGate(default_rules=(), checks=[breaker])
    refunds: list[str] = []

    def refund_fails() -> None:
        refunds.append("tried")
        raise Down("refund 503")

    with pytest.raises(Exception):  # noqa: B017,PT011 - a partial rollback: the refund failed
        async with saga_scope(wal, gate) as saga:
            await saga.execute("stripe.charge", C, lambda: "ch_1",
                               lambda r: Compensation(fn=lambda: refunds.append("refund ch_1"), handler="test.noop"))
            await saga.execute("stripe.charge", C, lambda: "ch_2",
                               lambda r: Compensation(fn=refund_fails, handler="test.noop"))
            for _ in range(2):  # meanwhile stripe goes down for everyone
                assert await call(wal, gate, tool="stripe.capture", fn=fail) == "failed"
            assert breaker.state("stripe.charge") == "open"
            raise RuntimeError("the agent gives up")
    assert refunds == ["tried", "refund ch_1"], "both compensations ran although the circuit is open"
    assert breaker.status()["circuits"][0]["failures"] == 2, "the failed refund was not counted"


def test_policy_values_are_validated():
    for bad in ({"failure_threshold": 0}, {"failure_rate": 0}, {"failure_rate": 1.5}, {"min_volume": 0},
                {"window": 0}, {"cool_down": -1}):
        with pytest.raises(ConfigurationError):
            BreakerPolicy(**bad)


async def test_set_breaker_installs_it_for_gates_built_without_checks(wal):
    breaker = CircuitBreaker(BreakerPolicy(failure_threshold=1), clock=ManualClock())
    prev = set_breaker(breaker)
    try:
        assert get_breaker() is breaker
        gate = PreFlightGate(default_rules=())
        await call(wal, gate, fn=fail)
        d = await gate.decide(StepRequest("s", "s/0", "stripe.charge", C, {}, ()))
        assert d.stage == "breaker" and "circuit breaker open for stripe.charge" in d.reason
    finally:
        set_breaker(prev)
