"""Timeouts make a step UNKNOWN; retries and fallback stay inside one step (same key)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from agent_saga.compensation import Compensation
from agent_saga.errors import (
    ConfigurationError,
    GateBlocked,
    RollbackIncomplete,
    StepOutcomeUnknown,
)
from agent_saga.idempotency import idempotency_key
from agent_saga.retry import RetryPolicy
from agent_saga.rollback import RollbackOutcome
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import (
    Boom,
    FakeClock,
    of_type,
    payload,
    wal_fixture,  # noqa: F401 - provides the `wal` fixture
)

C = ActionSemantics.COMPENSABLE
R = ActionSemantics.REVERSIBLE


async def hang() -> dict:
    await asyncio.sleep(3600)
    return {"id": "never"}


async def test_a_timeout_is_unknown_and_compensated_when_derivable_without_a_result(wal):
    undone: list[object] = []

    def refund_by_key(**kw: object) -> None:
        undone.append(kw)

    with pytest.raises(StepOutcomeUnknown) as info:
        async with saga_scope(wal) as saga:
            await saga.execute(
                "stripe.charge", C, hang,
                # With no result, refund by the deterministic key the charge was sent with.
                lambda r: Compensation(fn=refund_by_key, kwargs={"charge": r["id"] if r else None}),
                timeout=0.05,
            )
    exc = info.value
    assert exc.tool == "stripe.charge" and exc.step_id == f"{saga.saga_id}/0"
    assert isinstance(exc.__cause__, TimeoutError)
    (unknown,) = of_type(wal, saga.saga_id, "STEP_UNKNOWN")
    assert payload(unknown)["timeout"] == 0.05
    assert undone == [
        {"charge": None, "idempotency_key": idempotency_key(saga.saga_id, exc.step_id, "compensate")}
    ]
    report = saga.rollback_report
    assert report is not None and report.clean
    assert report.steps[0].outcome is RollbackOutcome.COMPENSATED
    (started,) = of_type(wal, saga.saga_id, "COMPENSATION_STARTED")
    assert payload(started)["outcome_unknown"] is True


async def test_a_timeout_escalates_when_no_inverse_can_be_derived(wal):
    with pytest.raises(RollbackIncomplete) as info:
        async with saga_scope(wal) as saga:
            await saga.execute(
                "stripe.charge", C, hang,
                lambda r: Compensation(handler="stripe.refund", kwargs={"charge": r["id"]}),
                timeout=0.05,
            )
    assert isinstance(info.value.__cause__, StepOutcomeUnknown)
    (step,) = info.value.report.steps
    assert step.outcome is RollbackOutcome.ESCALATED
    assert "outcome unknown" in (step.error or "")
    (esc,) = of_type(wal, saga.saga_id, "ESCALATED")
    assert payload(esc)["outcome_unknown"] is True


async def test_a_sync_forward_that_times_out_is_unknown_and_keeps_running(wal):
    release = threading.Event()
    started = threading.Event()
    finished = threading.Event()

    def slow() -> str:
        started.set()
        release.wait(10)
        finished.set()
        return "late"

    try:
        with pytest.raises(RollbackIncomplete):
            async with saga_scope(wal) as saga:
                # The timeout covers the queue too: long enough that the worker thread has
                # started the call on a loaded machine (a call cancelled before it starts is
                # never run, which is a different case).
                await saga.execute(
                    "db.write", C, slow, lambda r: Compensation(handler="db.undo"), timeout=0.5
                )
        assert started.is_set(), "the tool had not started within its 0.5 s timeout"
    finally:
        release.set()
    assert finished.wait(5)  # the thread was not (cannot be) stopped
    assert of_type(wal, saga.saga_id, "STEP_UNKNOWN")


async def test_a_timeout_is_not_retried(wal):
    calls = 0

    async def once() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(3600)

    with pytest.raises(StepOutcomeUnknown):
        async with saga_scope(wal, clock=FakeClock()) as saga:
            await saga.execute("x", R, once, timeout=0.02, retry=RetryPolicy(max_attempts=5))
    assert calls == 1


async def test_a_timeout_error_raised_by_the_tool_itself_is_a_failure_not_unknown(wal):
    async def tool() -> None:
        raise TimeoutError("the tool's own socket timeout")

    with pytest.raises(TimeoutError):
        async with saga_scope(wal) as saga:
            await saga.execute("x", R, tool, timeout=5)
    assert of_type(wal, saga.saga_id, "STEP_FAILED")
    assert not of_type(wal, saga.saga_id, "STEP_UNKNOWN")


async def test_retries_keep_the_step_id_and_idempotency_key(wal):
    keys: list[str] = []
    clock = FakeClock()

    def flaky(idempotency_key: str) -> dict:
        keys.append(idempotency_key)
        if len(keys) < 3:
            raise ConnectionError(f"attempt {len(keys)} failed")
        return {"id": "ch_1"}

    async with saga_scope(wal, clock=clock) as saga:
        out = await saga.execute(
            "stripe.charge", C, flaky, lambda r: Compensation(handler="stripe.refund", kwargs=r),
            retry=RetryPolicy(max_attempts=3, backoff="exponential", base_delay=0.5),
        )
    assert out == {"id": "ch_1"}
    expected = idempotency_key(saga.saga_id, f"{saga.saga_id}/0", "forward")
    assert keys == [expected] * 3
    assert clock.sleeps == [0.5, 1.0]
    retries = of_type(wal, saga.saga_id, "STEP_RETRY")
    assert [payload(r)["attempt"] for r in retries] == [1, 2]
    assert {r.step for r in retries} == {f"{saga.saga_id}/0"}
    (intent,) = of_type(wal, saga.saga_id, "STEP_INTENT")
    assert payload(intent)["idempotency_key"] == expected
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert payload(committed)["attempts"] == 3


async def test_include_and_exclude_decide_what_is_retried(wal):
    calls: list[str] = []

    def raising(exc: Exception):
        def fn() -> None:
            calls.append(type(exc).__name__)
            raise exc

        return fn

    policy = RetryPolicy(max_attempts=3, base_delay=0, include=(ConnectionError,), exclude=(ConnectionRefusedError,))
    async with saga_scope(wal, clock=FakeClock()) as saga:
        with pytest.raises(ValueError):
            await saga.execute("x", R, raising(ValueError("not included")), retry=policy)
        with pytest.raises(ConnectionRefusedError):
            await saga.execute("y", R, raising(ConnectionRefusedError("excluded")), retry=policy)
        with pytest.raises(ConnectionResetError):
            await saga.execute("z", R, raising(ConnectionResetError("included")), retry=policy)
    assert calls == ["ValueError", "ConnectionRefusedError"] + ["ConnectionResetError"] * 3


async def test_refusals_are_never_retried(wal):
    calls = 0

    def refused() -> None:
        nonlocal calls
        calls += 1
        raise GateBlocked("nested control said no", reason="no")

    async with saga_scope(wal, clock=FakeClock()) as saga:
        with pytest.raises(GateBlocked):
            await saga.execute("x", R, refused, retry=RetryPolicy(max_attempts=4, include=(Exception,)))
    assert calls == 1


async def test_fallback_runs_after_retries_and_its_result_is_the_steps(wal):
    keys: list[str] = []

    def down(idempotency_key: str) -> str:
        keys.append(idempotency_key)
        raise ConnectionError("primary down")

    async def secondary(idempotency_key: str) -> str:
        keys.append(idempotency_key)
        return "via-secondary"

    undone: list[str] = []
    with pytest.raises(Boom):
        async with saga_scope(wal, clock=FakeClock()) as saga:
            out = await saga.execute(
                "sms.send", C, down, lambda r: Compensation(fn=lambda: undone.append(r)),
                retry=RetryPolicy(max_attempts=2, base_delay=0), fallback_action=secondary,
            )
            assert out == "via-secondary"
            raise Boom()
    assert len(set(keys)) == 1 and len(keys) == 3
    assert undone == ["via-secondary"]
    (fb,) = of_type(wal, saga.saga_id, "STEP_FALLBACK")
    assert payload(fb)["attempts"] == 2
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert payload(committed)["fallback"] is True


async def test_fallback_without_retry_policy_and_its_own_failure(wal):
    def down() -> None:
        raise ConnectionError("primary down")

    def also_down() -> None:
        raise RuntimeError("secondary down too")

    async with saga_scope(wal) as saga:
        assert await saga.execute("x", R, down, fallback_action=lambda: "fb") == "fb"
        with pytest.raises(RuntimeError) as info:
            await saga.execute("y", R, down, fallback_action=also_down)
    assert isinstance(info.value.__context__, ConnectionError)


def test_retry_policy_is_validated_and_computes_delays():
    with pytest.raises(ConfigurationError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ConfigurationError):
        RetryPolicy(backoff="fibonacci")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        RetryPolicy(base_delay=-1)
    with pytest.raises(ConfigurationError):
        RetryPolicy(base_delay=5, max_delay=1)
    with pytest.raises(ConfigurationError):
        RetryPolicy(include=("ValueError",))  # type: ignore[arg-type]
    exp = RetryPolicy(base_delay=0.1, max_delay=1.0)
    assert [exp.delay(n) for n in (1, 2, 3, 4, 5)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    lin = RetryPolicy(backoff="linear", base_delay=0.5, max_delay=1.2)
    assert [lin.delay(n) for n in (1, 2, 3)] == [0.5, 1.0, 1.2]
    assert RetryPolicy(include=ValueError).include == (ValueError,)  # type: ignore[arg-type]
    assert not exp.covers(KeyboardInterrupt())


async def test_invalid_step_options_are_refused(wal):
    async with saga_scope(wal) as saga:
        for kw in ({"timeout": 0}, {"timeout": -1}, {"retry": 3}, {"fallback_action": "x"}):
            with pytest.raises(ConfigurationError):
                await saga.execute("x", R, lambda: 1, **kw)  # type: ignore[arg-type]
