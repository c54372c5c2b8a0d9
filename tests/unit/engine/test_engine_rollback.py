"""Rollback: LIFO order, clean vs partial reporting, what is re-raised, cancellation."""

from __future__ import annotations

import asyncio

import pytest
from agent_saga.compensation import Compensation, compensator, unregister_compensator
from agent_saga.errors import HandlerNotRegistered, RollbackIncomplete
from agent_saga.rollback import RollbackOutcome
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import (
    AllowGate,
    Boom,
    of_type,
    payload,
    read,
    types,
    wal_fixture,  # noqa: F401 - provides the `wal` fixture
)

C = ActionSemantics.COMPENSABLE
R = ActionSemantics.REVERSIBLE


def undo_into(log: list[str], label: str):
    def undo(**_: object) -> None:
        log.append(label)

    return undo


async def test_rollback_is_lifo_and_reraises_the_original_exception(wal):
    undone: list[str] = []
    original = Boom("the agent hallucinated a region")
    with pytest.raises(Boom) as info:
        async with saga_scope(wal, name="onboard") as saga:
            for label in ("instance", "namespace", "ticket"):
                await saga.execute(
                    f"make.{label}", C, forward=lambda label=label: {"id": label},
                    compensate=lambda r: Compensation(fn=undo_into(undone, r["id"]), kwargs={}),
                )
            raise original
    assert info.value is original
    assert undone == ["ticket", "namespace", "instance"]
    report = saga.rollback_report
    assert report is not None and report.clean
    assert [s.outcome for s in report.steps] == [RollbackOutcome.COMPENSATED] * 3
    assert [s.step_id for s in report.steps] == [f"{saga.saga_id}/{i}" for i in (2, 1, 0)]
    assert any("rolled back cleanly" in n for n in info.value.__notes__)
    assert saga.status == "ROLLED_BACK"
    kinds = types(wal, saga.saga_id)
    assert kinds[0] == "SAGA_STARTED" and kinds[-1] == "SAGA_ROLLED_BACK"
    started = [r.step for r in of_type(wal, saga.saga_id, "COMPENSATION_STARTED")]
    assert started == [f"{saga.saga_id}/{i}" for i in (2, 1, 0)]
    assert len(of_type(wal, saga.saga_id, "COMPENSATION_DONE")) == 3


async def test_a_failing_compensation_makes_it_partial_and_the_rest_still_run(wal):
    undone: list[str] = []

    def refund_fails(**_: object) -> None:
        raise ConnectionError("stripe is down")

    original = Boom("step 3 failed")
    with pytest.raises(RollbackIncomplete) as info:
        async with saga_scope(wal) as saga:
            await saga.execute("a", C, lambda: 1, lambda r: Compensation(fn=undo_into(undone, "a")))
            await saga.execute("charge", C, lambda: 2, lambda r: Compensation(fn=refund_fails))
            await saga.execute("c", C, lambda: 3, lambda r: Compensation(fn=undo_into(undone, "c")))
            raise original
    exc = info.value
    assert exc.__cause__ is original
    assert undone == ["c", "a"]  # the failure in the middle did not stop the rollback
    report = exc.report
    assert report is saga.rollback_report and not report.clean
    outcomes = {s.tool: s for s in report.steps}
    assert outcomes["charge"].outcome is RollbackOutcome.FAILED
    assert "stripe is down" in (outcomes["charge"].error or "")
    assert outcomes["a"].outcome is outcomes["c"].outcome is RollbackOutcome.COMPENSATED
    assert saga.status == "ROLLBACK_PARTIAL"
    failed = of_type(wal, saga.saga_id, "COMPENSATION_FAILED")
    assert [payload(r)["error_type"] for r in failed] == ["ConnectionError"]
    terminal = read(wal, saga.saga_id)[-1]
    assert terminal.type == "SAGA_ROLLBACK_PARTIAL"
    assert payload(terminal)["clean"] is False
    assert payload(terminal)["counts"] == {"COMPENSATED": 2, "FAILED": 1}


async def test_a_handler_not_registered_escalates_and_is_never_clean(wal):
    with pytest.raises(RollbackIncomplete) as info:
        async with saga_scope(wal) as saga:
            await saga.execute(
                "stripe.charge", C, lambda: {"id": "ch_1"},
                lambda r: Compensation(handler="nobody.imported.this", kwargs={"charge": r["id"]}),
            )
            raise Boom()
    (step,) = info.value.report.steps
    assert step.outcome is RollbackOutcome.ESCALATED
    assert HandlerNotRegistered.__name__ in (step.error or "")
    (esc,) = of_type(wal, saga.saga_id, "ESCALATED")
    assert "nobody.imported.this" in payload(esc)["reason"]
    assert not of_type(wal, saga.saga_id, "COMPENSATION_STARTED")


async def test_irreversible_steps_are_listed_not_undoable(wal):
    with pytest.raises(RollbackIncomplete) as info:
        async with saga_scope(wal, gate=AllowGate()) as saga:
            await saga.execute("a", C, lambda: 1, lambda r: Compensation(fn=lambda: None))
            await saga.execute("twilio.sms", ActionSemantics.IRREVERSIBLE, lambda: "sent")
            raise Boom()
    report = info.value.report
    assert [(s.tool, s.outcome) for s in report.steps] == [
        ("twilio.sms", RollbackOutcome.NOT_UNDOABLE),
        ("a", RollbackOutcome.COMPENSATED),
    ]
    assert not report.clean
    assert [s.tool for s in report.not_restored] == ["twilio.sms"]
    (skipped,) = of_type(wal, saga.saga_id, "COMPENSATION_SKIPPED")
    assert payload(skipped)["outcome"] == "NOT_UNDOABLE"


async def test_reads_are_nothing_to_undo_and_keep_the_rollback_clean(wal):
    with pytest.raises(Boom):
        async with saga_scope(wal) as saga:
            await saga.execute("search", R, lambda: ["doc"])
            await saga.execute("scratch", R, lambda: "/tmp/x", lambda r: None)
            raise Boom()
    report = saga.rollback_report
    assert report is not None and report.clean
    assert {s.outcome for s in report.steps} == {RollbackOutcome.NOTHING_TO_UNDO}
    assert len(of_type(wal, saga.saga_id, "COMPENSATION_SKIPPED")) == 2


async def test_an_exception_before_any_step_still_closes_the_saga(wal):
    with pytest.raises(Boom):
        async with saga_scope(wal) as saga:
            raise Boom()
    assert saga.rollback_report is not None and saga.rollback_report.steps == ()
    assert types(wal, saga.saga_id) == ["SAGA_STARTED", "SAGA_ROLLED_BACK"]


async def test_normal_exit_completes_durably(wal):
    async with saga_scope(wal, name="ok", tags=("eu", "team:pay")) as saga:
        await saga.execute("a", C, lambda: 1, lambda r: Compensation(fn=lambda: None))
    assert saga.status == "COMPLETED" and saga.rollback_report is None
    assert wal.stats().durable_seq >= read(wal)[-1].seq
    recs = read(wal, saga.saga_id)
    assert recs[-1].type == "SAGA_COMPLETED"
    assert payload(recs[0]) == {"name": "ok", "tags": ["eu", "team:pay"]}
    with pytest.raises(Exception, match="accepts no more steps"):
        await saga.execute("late", C, lambda: 1, lambda r: Compensation(fn=lambda: None))


async def test_cancellation_mid_saga_rolls_back(wal):
    undone: list[str] = []
    started = asyncio.Event()
    saga_box = []

    async def agent() -> None:
        async with saga_scope(wal) as saga:
            saga_box.append(saga)
            await saga.execute("a", C, lambda: 1, lambda r: Compensation(fn=undo_into(undone, "a")))

            async def slow() -> int:
                started.set()
                await asyncio.sleep(3600)
                return 2

            await saga.execute("b", C, slow, lambda r: Compensation(fn=undo_into(undone, f"b:{r}")))

    task = asyncio.create_task(agent())
    await started.wait()
    task.cancel()
    with pytest.raises((asyncio.CancelledError, RollbackIncomplete)) as info:
        await task
    saga = saga_box[0]
    # "b" was interrupted mid-call: its outcome is unknown, compensate(None) derives an inverse.
    assert undone == ["b:None", "a"]
    assert isinstance(info.value, asyncio.CancelledError)
    report = saga.rollback_report
    assert report is not None and report.clean
    assert of_type(wal, saga.saga_id, "STEP_UNKNOWN")


async def test_rollback_survives_a_second_cancellation(wal):
    gate_open = asyncio.Event()
    in_compensation = asyncio.Event()
    done: list[str] = []

    async def slow_undo() -> None:
        in_compensation.set()
        await gate_open.wait()
        done.append("undone")

    async def agent() -> None:
        async with saga_scope(wal) as saga:
            await saga.execute("a", C, lambda: 1, lambda r: Compensation(fn=slow_undo))
            raise Boom()

    task = asyncio.create_task(agent())
    await in_compensation.wait()
    task.cancel()  # arrives while the rollback is running: it must finish first
    await asyncio.sleep(0)
    gate_open.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == ["undone"]


async def test_keyboard_interrupt_rolls_back(wal):
    undone: list[str] = []

    async def agent() -> None:
        async with saga_scope(wal) as saga:
            await saga.execute("a", C, lambda: 1, lambda r: Compensation(fn=undo_into(undone, "a")))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await agent()
    assert undone == ["a"]


async def test_steps_running_in_sibling_tasks_are_awaited_then_undone(wal):
    undone: list[str] = []
    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        return "slow"

    async def fails() -> None:
        await asyncio.sleep(0)
        release.set()
        raise Boom()

    with pytest.raises(Boom):
        async with saga_scope(wal) as saga:
            await asyncio.gather(
                saga.execute("slow", C, slow, lambda r: Compensation(fn=undo_into(undone, r))),
                saga.execute("fails", C, fails, lambda r: Compensation(fn=lambda: None)),
            )
    assert undone == ["slow"]


async def test_registered_async_handler_runs_with_the_compensation_idempotency_key(wal):
    seen: list[dict] = []

    @compensator("test.rollback.refund")
    async def refund(*, charge: str, idempotency_key: str) -> None:
        seen.append({"charge": charge, "key": idempotency_key})

    try:
        with pytest.raises(Boom):
            async with saga_scope(wal) as saga:
                await saga.execute(
                    "stripe.charge", C, lambda: {"id": "ch_9"},
                    lambda r: {"handler": "test.rollback.refund", "kwargs": {"charge": r["id"]}},
                )
                raise Boom()
    finally:
        unregister_compensator("test.rollback.refund")
    from agent_saga.idempotency import idempotency_key

    assert seen == [{"charge": "ch_9", "key": idempotency_key(saga.saga_id, f"{saga.saga_id}/0", "compensate")}]
    (started,) = of_type(wal, saga.saga_id, "COMPENSATION_STARTED")
    assert payload(started)["idempotency_key"] == seen[0]["key"]
    assert payload(started)["compensation"]["handler"] == "test.rollback.refund"


async def test_cancelled_while_waiting_for_sibling_steps_at_exit_rolls_back(wal):
    undone: list[str] = []
    in_step = asyncio.Event()
    box = []

    async def slow() -> str:
        in_step.set()
        await asyncio.sleep(3600)
        return "never"

    async def agent() -> None:
        async with saga_scope(wal) as saga:
            box.append(saga)
            await saga.execute("a", C, lambda: "a", lambda r: Compensation(fn=undo_into(undone, r)))
            # A step left running in another task when the body ends.
            box.append(asyncio.ensure_future(
                saga.execute("b", C, slow, lambda r: Compensation(fn=undo_into(undone, f"b:{r}")))
            ))
            await in_step.wait()

    task = asyncio.create_task(agent())
    while len(box) < 2 or not in_step.is_set():
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)  # the scope is now waiting for "b" to settle
    task.cancel()
    box[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    saga = box[0]
    assert saga.status == "ROLLED_BACK"
    assert undone == ["b:None", "a"]
