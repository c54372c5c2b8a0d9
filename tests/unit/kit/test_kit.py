"""AgentKit: safe_tool inside and outside a transaction, guarantees(), status()."""

from __future__ import annotations

import pytest
from agent_saga import (
    AgentKit,
    ConfigurationError,
    GateBlocked,
    RollbackIncomplete,
    SecretDetected,
    compensator,
)
from agent_saga.compensation import unregister_compensator
from agent_saga.gates import GateDecision, StepRequest
from engine_support import read, types, wal_fixture  # noqa: F401

refunds: list[str] = []


@pytest.fixture(autouse=True)
def _refund_handler():
    refunds.clear()

    @compensator("kit.refund")
    def refund(id: str, idempotency_key: str) -> None:
        refunds.append(id)

    yield
    unregister_compensator("kit.refund")


async def stripe_charge(amount: int, customer_id: str = "c1") -> dict:
    return {"id": f"ch_{amount}", "amount": amount}


def sync_charge(amount: int) -> dict:
    return {"id": f"ch_{amount}"}


def make(kit: AgentKit):
    return kit.safe_tool(stripe_charge, semantics="COMPENSABLE",
                         compensate=lambda r: {"handler": "kit.refund", "kwargs": {"id": r["id"]}})


async def test_safe_tool_outside_a_transaction_is_the_untouched_function(wal) -> None:
    kit = AgentKit(name="shop", wal=wal)
    charge = make(kit)
    assert charge.__name__ == "stripe_charge"
    assert await charge(amount=5) == {"id": "ch_5", "amount": 5}
    sync = kit.safe_tool(sync_charge, semantics="REVERSIBLE")
    assert await sync(7) == {"id": "ch_7"}  # awaited like every wrapped tool (tests/unit/kit/test_kit_shape.py)
    assert read(wal) == []  # nothing logged outside a transaction


async def test_transaction_rolls_back_by_registered_handler_name(wal) -> None:
    kit = AgentKit(name="shop", wal=wal)
    charge = make(kit)
    with pytest.raises(RuntimeError, match="ship failed"):
        async with kit.transaction() as saga:
            await charge(amount=4200)
            await charge(amount=100)
            raise RuntimeError("ship failed")
    assert refunds == ["ch_100", "ch_4200"]  # LIFO, resolved from the registry in-process
    assert saga.rollback_report is not None and saga.rollback_report.clean
    t = types(wal, saga.saga_id)
    assert t[0] == "SAGA_STARTED" and t[-1] == "SAGA_ROLLED_BACK"
    intent = next(r for r in read(wal, saga.saga_id) if r.type == "STEP_INTENT")
    assert intent.payload["tool"] == "test_kit.stripe_charge"
    assert intent.payload["policy_args"] == {"amount": 4200}  # the gate sees the call's arguments


async def test_sync_tool_inside_a_transaction_is_awaitable(wal) -> None:
    kit = AgentKit(name="shop", wal=wal)
    sync = kit.safe_tool(sync_charge, semantics="REVERSIBLE", name="cache.put")
    async with kit.transaction() as saga:
        assert await sync(3) == {"id": "ch_3"}
    assert types(wal, saga.saga_id)[-1] == "SAGA_COMPLETED"


async def test_kit_gate_sees_every_call(wal) -> None:
    seen: list[StepRequest] = []

    class CapGate:
        async def decide(self, request: StepRequest) -> GateDecision:
            seen.append(request)
            if request.policy_args and request.policy_args.get("amount", 0) > 1000:
                return GateDecision.block("over 1000", decided_by="cap")
            return GateDecision.allow(decided_by="cap")

    kit = AgentKit(name="shop", wal=wal, gate=CapGate(), tags=("eu",))
    charge = make(kit)
    with pytest.raises(GateBlocked):
        async with kit.transaction():
            await charge(amount=10)
            await charge(amount=5000)
    assert [r.policy_args["amount"] for r in seen] == [10, 5000]
    assert seen[0].tags == ("eu",)
    assert refunds == ["ch_10"]  # the refused call never ran; the first was undone


async def test_partial_rollback_surfaces_through_the_kit(wal) -> None:
    kit = AgentKit(name="shop", wal=wal)
    charge = kit.safe_tool(stripe_charge, semantics="COMPENSABLE",
                           compensate=lambda r: {"handler": "kit.not_registered", "kwargs": {"id": r["id"]}})
    with pytest.raises(RollbackIncomplete) as ei:
        async with kit.transaction():
            await charge(amount=1)
            raise RuntimeError("boom")
    assert not ei.value.report.clean


async def test_nested_transactions_are_refused(wal) -> None:
    kit = AgentKit(name="shop", wal=wal)
    async with kit.transaction():
        with pytest.raises(ConfigurationError, match="nested"):
            async with kit.transaction():
                pass


def test_declarations_are_checked_when_wrapping() -> None:
    kit = AgentKit(name="shop")
    with pytest.raises(ConfigurationError, match="COMPENSABLE needs compensate"):
        kit.safe_tool(stripe_charge, semantics="COMPENSABLE")
    with pytest.raises(ConfigurationError, match="IRREVERSIBLE takes no compensate"):
        kit.safe_tool(stripe_charge, semantics="IRREVERSIBLE", compensate=lambda r: None)
    with pytest.raises(ConfigurationError):
        kit.safe_tool(stripe_charge, semantics="MAYBE")


async def test_a_secret_argument_is_refused_before_the_call(wal) -> None:
    calls: list[str] = []

    async def call_api(api_key: str) -> None:
        calls.append(api_key)

    kit = AgentKit(name="shop", wal=wal)
    tool = kit.safe_tool(call_api, semantics="REVERSIBLE")
    with pytest.raises(SecretDetected):
        async with kit.transaction():
            await tool(api_key="sk_live_" + "a" * 24)
    assert calls == []
    wal.barrier_sync()
    with open(wal.path) as f:
        assert "sk_live_" not in f.read()  # the secret never reached the log


async def test_guarantees_manifest_is_versioned_and_states_what_is_not_claimed(wal) -> None:
    kit = AgentKit(name="shop", wal=wal)
    make(kit)
    g = kit.guarantees()
    assert g["version"] == "agent-saga.guarantees/v1"
    ids = {e["id"]: e["active"] for e in g["enforced"]}
    assert ids["wal.hash_chain"] and ids["rollback.partial_reported"]
    assert ids["wal.intent_durable_before_effect"] is True
    assert g["tools"] == {"test_kit.stripe_charge": "COMPENSABLE"}
    assert any("REVERSIBLE" in s for s in g["not_claimed"])


async def test_guarantees_reflect_a_non_durable_wal(tmp_path) -> None:
    from agent_saga import FileWAL

    w = FileWAL(tmp_path / "scratch.wal", sync=False)
    try:
        g = AgentKit(name="x", wal=w).guarantees()
    finally:
        w.close()
    # a scratch log does not claim durability it does not have
    assert {e["id"]: e["active"] for e in g["enforced"]}["wal.intent_durable_before_effect"] is False
    assert g["wal"]["durability"].startswith("none")


async def test_status_fails_closed_when_a_signal_cannot_be_read(wal) -> None:
    kit = AgentKit(name="shop", wal=wal)
    assert kit.status()["ok"] is True

    class BrokenGate:
        async def decide(self, request: StepRequest) -> GateDecision:
            return GateDecision.allow()

        def status(self) -> dict:
            raise ConnectionError("limit store unreachable")

    kit = AgentKit(name="shop", wal=wal, gate=BrokenGate())
    st = kit.status()
    assert st["ok"] is False and "unreachable" in st["signals"]["gate"]["error"]


async def test_status_reports_a_failed_wal(tmp_path) -> None:
    from agent_saga import FileWAL, WALError

    w = FileWAL("/dev/full")
    kit = AgentKit(name="x", wal=w)
    w.append("X", "s-1")
    with pytest.raises(WALError):
        await w.barrier()
    st = kit.status()
    assert st["ok"] is False and st["signals"]["wal"]["failed"]
    with pytest.raises(WALError):
        w.close()


async def test_status_reports_the_kill_switch_posture(wal, tmp_path) -> None:
    from agent_saga import FileSwitchStore, KillSwitch, PreFlightGate

    switch = KillSwitch(FileSwitchStore(tmp_path / "switch.json"))
    kit = AgentKit(name="shop", wal=wal, gate=PreFlightGate(checks=[switch]))
    st = kit.status()
    assert st["ok"] is True and st["signals"]["check:kill-switch"]["detail"]["levers"] == []
    switch.halt("tool:wire.send", reason="fraud pattern", by="soc@corp")
    st = kit.status()
    levers = st["signals"]["check:kill-switch"]["detail"]["levers"]
    assert len(levers) == 1 and "wire.send" in str(levers[0])


async def test_status_fails_closed_when_a_check_cannot_be_read(wal) -> None:
    from agent_saga import PreFlightGate

    class Broken:  # shaped like a PreCheck
        name = "kill-switch"
        stage = "kill_switch"

        async def check(self, request):
            return None

        def status(self) -> dict:
            raise ConnectionError("switch store unreachable")

    kit = AgentKit(name="shop", wal=wal, gate=PreFlightGate(checks=[Broken()]))
    st = kit.status()
    assert st["ok"] is False and "unreachable" in st["signals"]["check:kill-switch"]["error"]
