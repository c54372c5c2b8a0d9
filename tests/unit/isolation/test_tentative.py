"""TentativeResource: PENDING for the saga's life, COMMITTED or ROLLED_BACK at its
boundary, registered in the log as a step naming its rollback handler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_saga import (
    ConfigurationError,
    FileWAL,
    NotSerializable,
    RollbackIncomplete,
    SecretDetected,
    TentativeResource,
    TentativeStatus,
    compensator,
    idempotency_key,
    saga_scope,
)
from agent_saga.compensation import unregister_compensator
from agent_saga.history import fold
from agent_saga.wal.file import iter_file_records

CALLS: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture(autouse=True)
def handlers() -> Any:
    CALLS.clear()

    @compensator("test.tentative.cancel")
    def cancel(order_id: str, idempotency_key: str) -> None:
        CALLS.append(("cancel", {"order_id": order_id, "key": idempotency_key}))

    @compensator("test.tentative.confirm")
    async def confirm(order_id: str, idempotency_key: str) -> None:
        if order_id == "refused":
            raise PermissionError("the order system refused the confirmation")
        CALLS.append(("confirm", {"order_id": order_id, "key": idempotency_key}))

    yield
    unregister_compensator("test.tentative.cancel")
    unregister_compensator("test.tentative.confirm")


@pytest.fixture
def wal_path(tmp_path: Path) -> Path:
    return tmp_path / "t.wal"


def order(oid: str, **kw: Any) -> TentativeResource:
    kw.setdefault("rollback", "test.tentative.cancel")
    kw.setdefault("commit", "test.tentative.confirm")
    return TentativeResource(oid, kwargs={"order_id": oid}, kind="order", **kw)


async def test_pending_for_the_saga_then_committed_at_the_boundary(wal_path: Path) -> None:
    marked: list[str] = []
    res = order("o-1", mark=lambda: marked.append("PENDING"))
    wal = FileWAL(wal_path)
    try:
        async with saga_scope(wal, saga_id="buy-1") as saga:
            await res.register(saga)
            assert res.status is TentativeStatus.PENDING and marked == ["PENDING"]
            assert CALLS == []  # nothing final before the commit point
    finally:
        wal.close()
    assert res.status is TentativeStatus.COMMITTED
    assert CALLS == [("confirm", {"order_id": "o-1", "key": idempotency_key("buy-1", res.step_id or "", "commit")})]
    (state,) = fold(r for _, r in iter_file_records(wal_path)).values()
    (step,) = state.steps.values()
    # the registration is a durable, chained step that names the rollback handler
    assert step.tool == "tentative.order" and step.state == "COMMITTED"
    assert step.compensation["handler"] == "test.tentative.cancel"
    assert step.compensation["kwargs"] == {"order_id": "o-1"}


async def test_rolled_back_by_its_named_handler_when_the_saga_rolls_back(wal_path: Path) -> None:
    res = order("o-2")
    wal = FileWAL(wal_path)
    try:
        with pytest.raises(RuntimeError, match="payment declined"):
            async with saga_scope(wal, saga_id="buy-2") as saga:
                await res.register(saga)
                raise RuntimeError("payment declined")
    finally:
        wal.close()
    assert res.status is TentativeStatus.ROLLED_BACK
    assert CALLS == [("cancel", {"order_id": "o-2", "key": idempotency_key("buy-2", "buy-2/0", "compensate")})]


async def test_a_commit_that_fails_rolls_the_saga_back_committed_resources_included(wal_path: Path) -> None:
    first, second = order("o-3"), order("refused")
    wal = FileWAL(wal_path)
    try:
        with pytest.raises(PermissionError) as e:
            async with saga_scope(wal, saga_id="buy-3") as saga:
                await first.register(saga)
                await second.register(saga)
    finally:
        wal.close()
    assert "committing tentative order 'refused' failed: the saga rolls back instead" in "".join(e.value.__notes__)
    assert first.status is TentativeStatus.ROLLED_BACK and second.status is TentativeStatus.ROLLED_BACK
    assert [c[0] for c in CALLS] == ["confirm", "cancel", "cancel"]


async def test_a_rollback_that_fails_is_escalated_not_reported_rolled_back(wal_path: Path) -> None:
    def broken(order_id: str) -> None:
        raise ConnectionError("order system down")

    res = order("o-4", rollback=broken)
    assert not res.replayable
    wal = FileWAL(wal_path)
    try:
        with pytest.raises(RollbackIncomplete):
            async with saga_scope(wal, saga_id="buy-4") as saga:
                await res.register(saga)
                raise RuntimeError("abort")
    finally:
        wal.close()
    assert res.status is TentativeStatus.ESCALATED
    assert res.error is not None and "order system down" in res.error


async def test_a_mark_that_fails_leaves_it_unregistered_and_nothing_is_rolled_back_for_it(wal_path: Path) -> None:
    def mark() -> None:
        raise OSError("db down")

    res = order("o-5", mark=mark)
    wal = FileWAL(wal_path)
    try:
        async with saga_scope(wal, saga_id="buy-5") as saga:
            with pytest.raises(OSError):
                await res.register(saga)
    finally:
        wal.close()
    assert res.status is TentativeStatus.NEW and CALLS == []
    with pytest.raises(ConfigurationError, match="already COMMITTED"):
        done = order("o-6")
        wal = FileWAL(wal_path)
        try:
            async with saga_scope(wal) as saga:
                await done.register(saga)
        finally:
            wal.close()
        await done.register(saga)


@pytest.mark.parametrize(("kw", "error", "text"), [
    ({"resource_id": "has space"}, ConfigurationError, "resource_id 'has space' is not a valid id"),
    ({"rollback": "bad name!"}, ConfigurationError, "compensation handler name 'bad name!' is not valid"),
    ({"rollback": 42}, ConfigurationError, "rollback= must be a handler name registered with @compensator"),
    ({"commit": 42}, ConfigurationError, "commit= must be a handler name"),
    ({"mark": "x"}, ConfigurationError, "mark= must be callable"),
    ({"kind": "Order"}, ConfigurationError, "kind= must be a lower-case word"),
    ({"kwargs": {"at": object()}}, NotSerializable, "kwargs['at']"),
    ({"kwargs": {"api_key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc"}}, SecretDetected, "kwargs['api_key']"),
])
def test_bad_input_is_refused_naming_the_argument_and_the_fix(kw: dict[str, Any], error: type, text: str) -> None:
    args: dict[str, Any] = {"resource_id": "o-1", "rollback": "test.tentative.cancel", **kw}
    with pytest.raises(error) as e:
        TentativeResource(args.pop("resource_id"), **args)
    assert text in str(e.value)


async def test_register_outside_a_saga_is_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"register\(\) takes the Saga of a saga_scope"):
        await order("o-7").register("saga-1")
