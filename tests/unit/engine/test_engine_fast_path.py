"""A REVERSIBLE step with an async forward and no gate, timeout, retry or fallback: its
failure paths record and undo as every step's do.
A flat kwargs snapshot (str keys, plain scalars) is one C copy after the same checks."""

from __future__ import annotations

import asyncio

import pytest
from agent_saga.compensation import Compensation
from agent_saga.errors import (
    CompensationError,
    ConfigurationError,
    NotSerializable,
    RollbackIncomplete,
    SecretDetected,
)
from agent_saga.payloads import _copy, snapshot_mapping
from agent_saga.rollback import RollbackOutcome
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import (
    Boom,
    of_type,
    payload,
    types,
    wal_fixture,  # noqa: F401 - provides the `wal` fixture
)

R = ActionSemantics.REVERSIBLE


async def test_an_async_forward_that_raises_is_failed_and_the_earlier_steps_are_undone(wal):
    undone: list[str] = []
    original = Boom("cache unavailable")

    async def put() -> dict[str, str]:
        return {"id": "k1"}

    async def broken() -> None:
        raise original

    with pytest.raises(Boom) as info:
        async with saga_scope(wal) as saga:
            await saga.execute("cache.put", R, put, lambda r: Compensation(fn=lambda: undone.append(r["id"])))
            await saga.execute("cache.put", R, broken, lambda r: Compensation(fn=lambda: undone.append("never")))
    assert info.value is original
    assert undone == ["k1"]  # the step that completed is undone; the failed one did not happen
    (failed,) = of_type(wal, saga.saga_id, "STEP_FAILED")
    assert failed.step == f"{saga.saga_id}/1"
    assert payload(failed)["error_type"] == "Boom"
    (step,) = saga.rollback_report.steps
    assert step.step_id == f"{saga.saga_id}/0" and step.outcome is RollbackOutcome.COMPENSATED
    assert types(wal, saga.saga_id)[-1] == "SAGA_ROLLED_BACK"


async def test_a_cancelled_async_forward_is_unknown_and_compensated_from_none(wal):
    started = asyncio.Event()
    seen: list[object] = []

    async def hangs() -> None:
        started.set()
        await asyncio.Event().wait()

    def undo(r: object) -> Compensation:
        seen.append(r)
        return Compensation(fn=lambda: seen.append("undone"))

    async def agent() -> None:
        async with saga_scope(wal) as saga:
            holder.append(saga)
            await saga.execute("cache.put", R, hangs, undo)

    holder: list = []
    task = asyncio.create_task(agent())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (saga,) = holder
    (unknown,) = of_type(wal, saga.saga_id, "STEP_UNKNOWN")
    assert payload(unknown)["error_type"] == "CancelledError"
    assert not of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert seen == [None, "undone"]  # it may have happened: undone from compensate(None)
    (step,) = saga.rollback_report.steps
    assert step.outcome is RollbackOutcome.COMPENSATED


async def test_a_broken_factory_on_the_fast_path_commits_the_error_and_escalates(wal):
    async def put() -> dict[str, str]:
        return {"id": "k1"}

    with pytest.raises(RollbackIncomplete) as info:
        async with saga_scope(wal) as saga:
            await saga.execute("cache.put", R, put, lambda r: "not a compensation")
    assert isinstance(info.value.__cause__, CompensationError)
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert payload(committed)["compensation"] is None
    assert payload(committed)["compensation_error"]["error_type"] == "CompensationError"
    (step,) = saga.rollback_report.steps
    assert step.outcome is RollbackOutcome.ESCALATED  # the effect happened with no inverse


def test_a_handler_name_is_checked_every_time_even_after_valid_ones():
    for _ in range(3):
        assert Compensation(handler="stripe.refund").handler == "stripe.refund"
    for bad in ("stripe refund", "", "-x", "a" * 129):
        with pytest.raises(ConfigurationError, match="is not valid"):
            Compensation(handler=bad)

    class Name(str):
        pass

    assert Compensation(handler=Name("stripe.refund")).handler == "stripe.refund"
    with pytest.raises(ConfigurationError, match="is not valid"):
        Compensation(handler=Name("stripe refund"))


# ---------------------------------------------------------------- the flat kwargs snapshot


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"id": "ch_1", "amount": 4200, "rate": 0.5, "live": True, "note": None, "empty": ""},
        {"id": "ch_1", "at": {"nested": 1}},  # nested: the general copy
        {"ids": ["a", "b"]},
    ],
    ids=["empty", "flat", "nested", "list"],
)
def test_a_snapshot_is_a_plain_copy_equal_to_the_general_one(kwargs):
    out = snapshot_mapping(kwargs, "kwargs")
    assert out == _copy(kwargs, "kwargs", None, 0) and list(out) == list(kwargs)
    assert out is not kwargs
    kwargs["later"] = "changed"
    assert "later" not in out  # a later change by the caller never reaches the record


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"id": "ch_1", "password": "hunter2hunter2"}, SecretDetected, "kwargs['password']"),
        ({"id": "ch_1", "x": "sk_live_abcdefghijkl1234"}, SecretDetected, "kwargs['x']"),
        ({"id": "ch_1", "amount": float("nan")}, NotSerializable, "kwargs['amount']"),
        ({"id": "ch_1", 7: "x"}, NotSerializable, "kwargs[7]"),
        ({"id": object()}, NotSerializable, "kwargs['id']"),
    ],
    ids=["secret-key", "secret-shape", "nan", "int-key", "object"],
)
def test_a_flat_snapshot_refuses_what_the_general_one_refuses_naming_the_path(kwargs, error, names):
    with pytest.raises(error) as info:
        snapshot_mapping(kwargs, "kwargs")
    assert names in str(info.value)
    assert "hunter2" not in str(info.value) and "sk_live_abc" not in str(info.value)
