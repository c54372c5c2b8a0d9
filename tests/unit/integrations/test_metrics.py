"""Agent-side Prometheus metrics with a real prometheus-client registry: after a run with a
committed step, a failure, a rollback (one clean, one partial) and a refusal, every series
holds exactly what the engine did; WAL fences that waited are in the histogram."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga import (
    BudgetLimit,
    Compensation,
    GateBlocked,
    InProcessLimitStore,
    PreFlightGate,
    RollbackIncomplete,
    observe,
    saga_scope,
    setup_metrics,
)
from agent_saga.metrics import teardown_metrics
from agent_saga.wal.file import FileWAL
from engine_support import AllowGate, BlockGate
from prometheus_client import CollectorRegistry


@pytest.fixture
def registry():
    reg = CollectorRegistry()
    metrics = setup_metrics(reg)
    assert setup_metrics(reg) is metrics  # idempotent per registry
    try:
        yield reg
    finally:
        teardown_metrics(reg)
        assert observe.current is None


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    got = reg.get_sample_value(name, labels)
    return 0.0 if got is None else got


async def test_steps_refusals_rollbacks_and_fences_are_counted(registry, tmp_path: Path):
    wal = FileWAL(tmp_path / "m.wal")

    def broken_undo() -> None:
        raise RuntimeError("refund API down")

    async def boom() -> None:
        raise ValueError("declined")

    try:
        # 1: two committed steps, then a failing one -> clean rollback
        with pytest.raises(ValueError):
            async with saga_scope(wal, AllowGate(), name="a") as saga:
                await saga.execute("inv.reserve", "COMPENSABLE", lambda: "r", lambda r: Compensation(fn=lambda: None))
                await saga.execute("cache.put", "REVERSIBLE", lambda: "c")
                await saga.execute("pay.charge", "COMPENSABLE", boom, lambda r: Compensation(fn=lambda: None))
        # 2: a committed step whose undo fails -> partial rollback
        with pytest.raises(RollbackIncomplete):
            async with saga_scope(wal, AllowGate(), name="b") as saga:
                await saga.execute("inv.reserve", "COMPENSABLE", lambda: "r", lambda r: Compensation(fn=broken_undo))
                raise KeyError("agent gave up")
        # 3: a refused step (the gate's control is named) -> nothing to undo, clean
        with pytest.raises(GateBlocked):
            async with saga_scope(wal, BlockGate("wire.send"), name="c") as saga:
                await saga.execute("wire.send", "IRREVERSIBLE", lambda: None)
        # 3b: a PreFlightGate's budget limit refuses: the control is the gate's stage
        limited = PreFlightGate(limits=[BudgetLimit("cap", arg="amount", max_total=10, window=3600)],
                                store=InProcessLimitStore())
        with pytest.raises(GateBlocked) as refused:
            async with saga_scope(wal, limited, name="e") as saga:
                await saga.execute("pay.charge", "COMPENSABLE", lambda: "c", lambda r: Compensation(fn=lambda: None),
                                   policy_args={"amount": 50})
        assert refused.value.control == "limits" and refused.value.decided_by == "limit:cap"
        # 4: completes
        async with saga_scope(wal, AllowGate(), name="d") as saga:
            await saga.execute("inv.reserve", "COMPENSABLE", lambda: "r", lambda r: Compensation(fn=lambda: None))
    finally:
        wal.close()

    steps = "agent_saga_steps_total"
    assert value(registry, steps, semantics="COMPENSABLE", outcome="committed") == 3
    assert value(registry, steps, semantics="REVERSIBLE", outcome="committed") == 1
    assert value(registry, steps, semantics="COMPENSABLE", outcome="failed") == 1
    assert value(registry, steps, semantics="IRREVERSIBLE", outcome="refused") == 1
    assert value(registry, steps, semantics="IRREVERSIBLE", outcome="committed") == 0
    assert value(registry, steps, semantics="COMPENSABLE", outcome="refused") == 1
    # a plain gate's refusal is counted under who decided; a PreFlightGate's under its control
    assert value(registry, "agent_saga_refusals_total", control="soc@corp") == 1
    assert value(registry, "agent_saga_refusals_total", control="limits") == 1
    assert value(registry, "agent_saga_rollbacks_total", result="clean") == 3
    assert value(registry, "agent_saga_rollbacks_total", result="partial") == 1
    # every COMPENSABLE intent, commit and rollback record waited on a real fsync
    fences = value(registry, "agent_saga_wal_fence_seconds_count")
    assert fences >= 6
    assert value(registry, "agent_saga_wal_fence_seconds_sum") > 0
    assert value(registry, "agent_saga_wal_fence_seconds_bucket", le="+Inf") == fences


async def test_a_failing_observer_never_breaks_a_saga(tmp_path: Path, caplog):
    class Broken(observe.Observer):
        def step_started(self, saga_id, step_id, tool, semantics):
            raise RuntimeError("exporter down")

    broken = observe.add_observer(Broken())
    wal = FileWAL(tmp_path / "b.wal")
    try:
        async with saga_scope(wal, name="x") as saga:
            assert await saga.execute("db.read", "REVERSIBLE", lambda: 7) == 7
            assert await saga.execute("db.read", "REVERSIBLE", lambda: 8) == 8
        assert saga.status == "COMPLETED"
    finally:
        observe.remove_observer(broken)
        wal.close()
    warned = [r for r in caplog.records if "exporter down" in r.getMessage()]
    assert len(warned) == 1, "logged once per observer method, not per step"


async def test_a_wal_that_stalls_counts_one_fail_stop(registry, tmp_path: Path):
    """The flusher wedged in its fsync (the named fault point ``before_sync``): the fence
    passes its bound, the writer fails-stop, and the fail-stop is counted once, as stalled."""
    import threading

    from agent_saga import WALStalled

    wedged, release = threading.Event(), threading.Event()

    def hook(point: str) -> None:
        if point == "before_sync" and not release.is_set():
            wedged.set()
            release.wait(60)

    wal = FileWAL(tmp_path / "w.wal", stall_timeout=3600, fault_hook=hook)
    try:
        seq = wal.append("X", "s-1")
        with pytest.raises(WALStalled):
            await wal.barrier(seq, timeout=0.2)
        with pytest.raises(WALStalled):
            wal.append("X", "s-2")  # refused at once: counted once, not per refusal
        assert value(registry, "agent_saga_wal_failstops_total", how="stalled") == 1
        assert value(registry, "agent_saga_wal_failstops_total", how="failed") == 0
    finally:
        release.set()
        with pytest.raises(WALStalled):
            wal.close()


def test_a_policy_plane_that_cannot_be_reached_is_counted_by_kind(registry):
    """A kill switch reader pointed at a port nothing listens on: its failed reads are
    counted under its kind while it keeps trying."""
    import socket

    from agent_saga.controls.killswitch import RedisSwitchStore
    from fixtures.polling import until

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = RedisSwitchStore(f"redis://127.0.0.1:{port}/0", grace=30, heartbeat=0.05, connect_timeout=0.2)
    try:
        store.start()
        until("two failed reads counted",
              lambda: value(registry, "agent_saga_policy_plane_errors_total", kind="KillSwitch") >= 2)
    finally:
        store.close()
    assert value(registry, "agent_saga_policy_plane_errors_total", kind="BudgetLimit") == 0
