"""The OpenTelemetry observer behind ``setup_telemetry`` (imports opentelemetry: load lazily).

Each ``*_started`` starts a span, makes it current (``context.attach``) and returns
``(span, token)``; the matching ``*_ended`` sets the outcome, records the error, ends the
span and detaches. The engine calls both on the same task, so the attach/detach pair runs
in one context.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .observe import Observer

_PROPAGATOR = TraceContextTextMapPropagator()
_BAD_ROLLBACK = frozenset({"FAILED", "ESCALATED", "NOT_UNDOABLE", "INTERRUPTED"})

Handle = tuple[Span, object]


class SpanObserver(Observer):
    """Sagas, steps and rollbacks as spans (see ``agent_saga.telemetry``)."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def _start(self, name: str, attributes: dict[str, Any], links: list[Link] | None = None,
               kind: SpanKind = SpanKind.INTERNAL) -> Handle:
        span = self.tracer.start_span(name, attributes=attributes, links=links, kind=kind)
        return span, context.attach(trace.set_span_in_context(span))

    @staticmethod
    def _end(handle: Handle | None, error: BaseException | None, failed: bool) -> None:
        if handle is None:
            return
        span, token = handle
        try:
            if error is not None:
                span.record_exception(error)
            if failed:
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}" if error else None))
            span.end()
        finally:
            context.detach(token)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- saga

    def saga_started(self, saga_id: str, name: str | None) -> Handle:
        attrs: dict[str, Any] = {"saga.id": saga_id}
        if name:
            attrs["saga.name"] = name
        return self._start("saga.execute", attrs)

    def traceparent(self) -> str | None:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier.get("traceparent")

    def saga_ended(self, handle: Handle | None, status: str, error: BaseException | None) -> None:
        if handle is not None:
            handle[0].set_attribute("saga.status", status)
        self._end(handle, error, status != "COMPLETED")

    # ---------------------------------------------------------------- steps

    def step_started(self, saga_id: str, step_id: str, tool: str, semantics: str) -> Handle:
        return self._start(f"saga.step.{tool}", {
            "saga.id": saga_id, "saga.step.id": step_id, "saga.step.tool": tool,
            "saga.step.semantics": semantics,
        })

    def step_ended(self, handle: Handle | None, outcome: str, error: BaseException | None) -> None:
        if handle is not None:
            handle[0].set_attribute("saga.step.outcome", outcome)
        self._end(handle, error, outcome != "committed")

    def step_refused(
        self, saga_id: str, step_id: str, tool: str, semantics: str, control: str, error: BaseException
    ) -> None:
        handle = self._start(f"saga.step.{tool}", {
            "saga.id": saga_id, "saga.step.id": step_id, "saga.step.tool": tool,
            "saga.step.semantics": semantics, "saga.step.outcome": "refused",
            "saga.refused_by": control, "saga.decided_by": str(getattr(error, "decided_by", "") or ""),
        })
        self._end(handle, error, True)

    # ---------------------------------------------------------------- rollback

    def rollback_step_started(self, saga_id: str, step_id: str, tool: str, semantics: str) -> Handle:
        return self._start(f"saga.rollback.{tool}", {
            "saga.id": saga_id, "saga.step.id": step_id, "saga.step.tool": tool,
            "saga.step.semantics": semantics,
        })

    def rollback_step_ended(self, handle: Handle | None, outcome: str, error: str | None) -> None:
        if handle is None:
            return
        span = handle[0]
        span.set_attribute("saga.rollback.outcome", outcome)
        bad = outcome in _BAD_ROLLBACK
        if bad:
            span.set_status(Status(StatusCode.ERROR, error or outcome))
        self._end(handle, None, False)

    # ---------------------------------------------------------------- recovery

    def recovery_started(self, saga_id: str, traceparent: str | None) -> Handle:
        links: list[Link] = []
        if traceparent:
            origin = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()
            if origin.is_valid:
                links.append(Link(origin, {"saga.link": "the saga's own trace"}))
        return self._start("saga.recover", {"saga.id": saga_id}, links)

    def recovery_ended(self, handle: Handle | None, state: str, error: str | None) -> None:
        if handle is None:
            return
        handle[0].set_attribute("saga.recovery.state", state)
        if state in ("FAILED", "ROLLBACK_PARTIAL"):
            handle[0].set_status(Status(StatusCode.ERROR, error or state))
        self._end(handle, None, False)
