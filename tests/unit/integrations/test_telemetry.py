"""OpenTelemetry with the real SDK and its in-memory exporter: the span tree of a saga, its
attributes and status, exceptions recorded, the step's span current inside a sync tool on
the executor thread, trace ids on log records (logs and traces join both ways), the
traceparent in SAGA_STARTED and the recovery daemon's span linked to it."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga import (
    Compensation,
    GateBlocked,
    RecoveryDaemon,
    configure_logging,
    observe,
    saga_scope,
    setup_telemetry,
)
from agent_saga.telemetry import teardown_telemetry
from agent_saga.wal.file import FileWAL
from engine_support import BlockGate, read
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from recovery_support import CALLS, FUTURE, desc, status

tool_log = logging.getLogger("agent_saga.test.tool")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    setup_telemetry(tracer_provider=provider)
    exporter.provider = provider  # type: ignore[attr-defined]
    try:
        yield exporter
    finally:
        teardown_telemetry()
        assert observe.current is None
        provider.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    out = {s.name: s for s in exporter.get_finished_spans()}
    assert len(out) == len(exporter.get_finished_spans()), "span names repeat in this test"
    return out


async def test_a_rolled_back_saga_is_one_span_tree_with_errors_recorded(spans, tmp_path: Path):
    wal = FileWAL(tmp_path / "s.wal")
    stream = io.StringIO()
    handler = configure_logging(logging.INFO, json=True, stream=stream)
    seen: dict[str, object] = {}
    undone: list[str] = []

    def reserve() -> str:  # sync: runs on the tool executor's thread
        current = trace.get_current_span()
        seen["span_id"] = current.get_span_context().span_id
        seen["thread"] = threading.get_ident()
        tool_log.info("reserving")
        return "r-1"

    async def fail() -> None:
        raise ValueError("card declined")

    try:
        with pytest.raises(ValueError, match="card declined"):
            async with saga_scope(wal, name="checkout") as saga:
                await saga.execute("inventory.reserve", "COMPENSABLE", reserve,
                                   lambda r: Compensation(fn=lambda: undone.append(r)))
                await saga.execute("cache.warm", "REVERSIBLE", lambda: "w",
                                   lambda r: Compensation(fn=lambda: undone.append(r)))
                await saga.execute("stripe.charge", "COMPENSABLE", fail,
                                   lambda r: Compensation(fn=lambda: undone.append("never")))
    finally:
        logging.getLogger("agent_saga").removeHandler(handler)
        wal.close()
    assert undone == ["w", "r-1"]

    s = by_name(spans)
    assert set(s) == {
        "saga.execute", "saga.step.inventory.reserve", "saga.step.cache.warm", "saga.step.stripe.charge",
        "saga.rollback.cache.warm", "saga.rollback.inventory.reserve",
    }
    root = s["saga.execute"]
    assert root.parent is None
    assert root.attributes["saga.status"] == "ROLLED_BACK"
    assert root.attributes["saga.name"] == "checkout"
    assert root.status.status_code is StatusCode.ERROR
    assert [e.name for e in root.events] == ["exception"]
    assert root.events[0].attributes["exception.type"] == "ValueError"
    saga_id = root.attributes["saga.id"]
    for name, span in s.items():
        assert span.context.trace_id == root.context.trace_id, name
        assert span.attributes["saga.id"] == saga_id, name
        if name != "saga.execute":
            assert span.parent is not None and span.parent.span_id == root.context.span_id, name

    reserve_span = s["saga.step.inventory.reserve"]
    assert reserve_span.attributes["saga.step.outcome"] == "committed"
    assert reserve_span.attributes["saga.step.semantics"] == "COMPENSABLE"
    assert reserve_span.status.status_code is StatusCode.UNSET
    charge = s["saga.step.stripe.charge"]
    assert charge.attributes["saga.step.outcome"] == "failed"
    assert charge.status.status_code is StatusCode.ERROR
    assert charge.events[0].attributes["exception.message"] == "card declined"
    assert s["saga.rollback.inventory.reserve"].attributes["saga.rollback.outcome"] == "COMPENSATED"
    assert s["saga.rollback.inventory.reserve"].status.status_code is StatusCode.UNSET
    # rollback is LIFO: the later step's undo span starts first
    assert s["saga.rollback.cache.warm"].start_time <= s["saga.rollback.inventory.reserve"].start_time

    # the sync tool ran on another thread, inside its step's span
    assert seen["thread"] != threading.get_ident()
    assert seen["span_id"] == reserve_span.context.span_id

    # logs -> traces: the tool's log line names the trace and the step span;
    # traces -> logs: the span's saga.id is the log line's saga_id
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    tool_line = next(line for line in lines if line["message"] == "reserving")
    assert tool_line["trace_id"] == f"{root.context.trace_id:032x}"
    assert tool_line["span_id"] == f"{reserve_span.context.span_id:016x}"
    assert tool_line["saga_id"] == saga_id
    assert tool_line["step_id"] == reserve_span.attributes["saga.step.id"]


async def test_a_completed_saga_and_a_refused_step(spans, tmp_path: Path):
    wal = FileWAL(tmp_path / "s.wal")
    try:
        async with saga_scope(wal, name="ok") as saga:
            assert await saga.execute("db.read", "REVERSIBLE", lambda: 1) == 1
        with pytest.raises(GateBlocked):
            async with saga_scope(wal, gate=BlockGate("wire.send"), name="blocked") as saga:
                await saga.execute("wire.send", "REVERSIBLE", lambda: 2)
        started = [r for r in read(wal) if r.type == "SAGA_STARTED"]
    finally:
        wal.close()
    finished = spans.get_finished_spans()
    roots = [sp for sp in finished if sp.name == "saga.execute"]
    ok, blocked = sorted(roots, key=lambda sp: sp.attributes["saga.name"] != "ok")
    assert ok.attributes["saga.status"] == "COMPLETED"
    assert ok.status.status_code is StatusCode.UNSET
    assert blocked.attributes["saga.status"] == "ROLLED_BACK"  # nothing ran, nothing to undo
    refused = next(sp for sp in finished if sp.name == "saga.step.wire.send")
    assert refused.attributes["saga.step.outcome"] == "refused"
    assert refused.attributes["saga.refused_by"] == "soc@corp"  # the refusing control (BlockGate decides as soc@corp)
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.parent is not None and refused.parent.span_id == blocked.context.span_id
    # SAGA_STARTED carries the saga span's W3C traceparent (for a recovery daemon)
    assert [r.payload["traceparent"].rsplit("-", 1)[0] for r in started] == [
        f"00-{sp.context.trace_id:032x}-{sp.context.span_id:016x}" for sp in (ok, blocked)
    ]


async def test_the_recovery_daemon_span_links_to_the_crashed_sagas_trace(spans, tmp_path: Path):
    origin = spans.provider.get_tracer("test").start_span("the agent's request")
    origin.end()
    traceparent = f"00-{origin.context.trace_id:032x}-{origin.context.span_id:016x}-01"
    # a saga left open by a crashed agent that had telemetry on (SAGA_STARTED names its trace)
    wal = FileWAL(tmp_path / "fresh.wal")
    try:
        wal.append("SAGA_STARTED", "crashed-2", None, {"name": None, "tags": [], "traceparent": traceparent})
        wal.append("SAGA_LEASE", "crashed-2", None, {"lease_seconds": 0.05})
        wal.append("STEP_INTENT", "crashed-2", "crashed-2/0", {"tool": "pay.charge", "semantics": "COMPENSABLE",
                                                              "policy_args": None})
        wal.append("STEP_COMMITTED", "crashed-2", "crashed-2/0", {"compensation": desc("ch_2")})
        wal.barrier_sync()
    finally:
        wal.close()
    CALLS.clear()
    async with RecoveryDaemon(tmp_path / "fresh.wal", clock=FUTURE, imports=["recovery_support"]) as daemon:
        report = await daemon.sweep()
    assert [r.status for r in report.results] == ["ROLLED_BACK"]
    assert status(tmp_path / "fresh.wal", "crashed-2") == "ROLLED_BACK"
    assert [kw for _, kw in CALLS] == [{"charge_id": "ch_2"}]
    recover = next(sp for sp in spans.get_finished_spans() if sp.name == "saga.recover")
    assert recover.attributes["saga.id"] == "crashed-2"
    assert recover.attributes["saga.recovery.state"] == "ROLLED_BACK"
    assert [link.context.span_id for link in recover.links] == [origin.context.span_id]
    assert recover.links[0].context.trace_id == origin.context.trace_id


async def test_the_text_log_format_names_the_trace_once_telemetry_is_on(tmp_path: Path):
    stream = io.StringIO()
    handler = configure_logging(logging.INFO, stream=stream)  # installed before telemetry
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    wal = FileWAL(tmp_path / "t.wal")
    try:
        tool_log.info("before")
        setup_telemetry(tracer_provider=provider)  # switches the installed handler's format
        async with saga_scope(wal, name="txt") as saga:
            await saga.execute("db.read", "REVERSIBLE", lambda: tool_log.info("inside"))
        teardown_telemetry()
        tool_log.info("after")
    finally:
        teardown_telemetry()
        logging.getLogger("agent_saga").removeHandler(handler)
        wal.close()
        provider.shutdown()
    step = next(sp for sp in exporter.get_finished_spans() if sp.name == "saga.step.db.read")
    lines = {line.rsplit("] ", 1)[1]: line for line in stream.getvalue().splitlines() if "] " in line}
    assert "trace=" not in lines["before"] and "trace=" not in lines["after"]
    assert f"trace={step.context.trace_id:032x}]" in lines["inside"]


def test_the_default_tracer_is_a_no_op_tracer_until_telemetry_is_set_up() -> None:
    """Off by default: code opening its own spans gets a NoOpTracer (no opentelemetry
    call); setup_telemetry swaps in the real tracer and teardown puts the no-op back."""
    from agent_saga import NoOpTracer
    from agent_saga.telemetry import current_tracer

    tracer = current_tracer()
    assert isinstance(tracer, NoOpTracer)
    with tracer.start_as_current_span("mine") as span:
        span.set_attribute("k", "v")
        assert not span.is_recording()
    assert not trace.get_current_span().get_span_context().is_valid  # nothing was opened
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    setup_telemetry(tracer_provider=provider)
    try:
        real = current_tracer()
        assert not isinstance(real, NoOpTracer)
        with real.start_as_current_span("mine"):
            pass
        assert [s.name for s in exporter.get_finished_spans()] == ["mine"]
    finally:
        teardown_telemetry()
        provider.shutdown()
    assert isinstance(current_tracer(), NoOpTracer)
