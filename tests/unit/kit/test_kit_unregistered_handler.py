"""The README's 30-second AgentKit example, as written, names a handler ("refund") it never
registers: the rollback is partial (fail closed: nothing guesses an undo), and the error,
the report and the WAL say which handler is missing and show the line that fixes it."""

from __future__ import annotations

import pytest
from agent_saga import AgentKit, HandlerNotRegistered, RollbackIncomplete, compensator
from agent_saga.compensation import unregister_compensator
from engine_support import read, wal_fixture  # noqa: F401

FIX = "@compensator('refund')"


def stripe_charge(amount: int) -> dict:
    return {"id": f"ch_{amount}"}


async def ship_order(*_: object) -> None:
    raise RuntimeError("the warehouse is closed")


async def test_the_partial_rollback_names_the_handler_and_the_line_that_registers_it(wal) -> None:
    kit = AgentKit(name="my-agent", wal=wal)

    charge = kit.safe_tool(stripe_charge, semantics="COMPENSABLE",
                           compensate=lambda r: {"handler": "refund", "kwargs": {"id": r["id"]}})

    with pytest.raises(RollbackIncomplete) as err:
        async with kit.transaction():        # a saga boundary
            await charge(amount=4200)        # gated, logged, refunded on any failure
            await ship_order(...)            # if this throws, the charge is rolled back
    message = str(err.value)
    assert "compensation handler 'refund' is not registered" in message
    assert FIX in message and "def refund(*, id, idempotency_key=None)" in message
    (entry,) = err.value.report.not_restored
    assert FIX in (entry.error or "")
    (escalated,) = [r for r in read(wal) if r.type == "ESCALATED"]
    assert FIX in escalated.payload["reason"]  # the WAL says it too, for whoever reads it later

    # The line it shows is the fix: with it, the same code rolls back cleanly.
    refunded: list[str] = []

    @compensator("refund")
    def refund(*, id: str, idempotency_key: str | None = None) -> None:
        refunded.append(id)

    try:
        with pytest.raises(RuntimeError, match="warehouse"):
            async with kit.transaction() as saga:
                await charge(amount=4200)
                await ship_order(...)
    finally:
        unregister_compensator("refund")
    assert refunded == ["ch_4200"] and saga.rollback_report is not None and saga.rollback_report.clean


def test_the_hint_names_a_python_function_whatever_the_handler_is_called() -> None:
    assert "def refund_charge(*, idempotency_key=None)" in str(HandlerNotRegistered("stripe.refund-charge"))
    assert "def undo_class(*, charge, idempotency_key=None)" in str(HandlerNotRegistered("x.class", ("charge",)))
    assert HandlerNotRegistered("stripe.refund").fix == "@compensator('stripe.refund')"
