"""OpenTelemetry spans for sagas, and trace ids on log records (``setup_telemetry``).

    from agent_saga import setup_telemetry, configure_logging
    setup_telemetry()            # the global TracerProvider, or tracer_provider=...
    configure_logging(json=True) # log records now carry trace_id / span_id

Span tree of one saga (``pip install 'agent-saga[opentelemetry]'``):

    saga.execute                 saga.id, saga.name, saga.status
      saga.step.<tool>           saga.id, saga.step.id, saga.step.tool, saga.step.semantics,
                                 saga.step.outcome (committed | failed | unknown | refused)
      saga.rollback.<tool>       saga.id, saga.step.id, saga.rollback.outcome
    saga.recover                 a recovery daemon resolving a saga: saga.id,
                                 saga.recovery.state; linked to the saga's own trace

``saga.status`` is COMPLETED, ROLLED_BACK, FAILED (a partial rollback, or the saga could
not be recorded) or QUARANTINED. A step that raised, a refused step and a saga that did not
complete record the exception and end with ERROR status; a compensation that failed or was
escalated ends its rollback span with ERROR status.

Invariants:
- Off by default: ``current_tracer()`` is a ``NoOpTracer`` and nothing here runs until
  ``setup_telemetry()``; importing ``agent_saga``
  never imports opentelemetry (this module imports it inside ``setup_telemetry``).
- The saga span is current for the saga's body and the step span for the forward call, on
  the tool executor's threads too (they copy the caller's context): a sync tool's own
  spans nest under its step.
- SAGA_STARTED carries the saga's W3C ``traceparent``; a recovery daemon's ``saga.recover``
  span links to it, so the trace of a crashed saga leads to the work that finished it.
- Log records get ``trace_id`` / ``span_id`` (32 / 16 hex digits, ``-`` outside a span)
  from ``SagaContextFilter``; spans carry ``saga.id``, which every log record has: logs
  and traces join in both directions.
"""

from __future__ import annotations

from typing import Any

from . import context as _context
from . import observe as _observe
from .errors import ConfigurationError

__all__ = ["NoOpTracer", "current_tracer", "setup_telemetry", "teardown_telemetry"]

TRACER_NAME = "agent_saga"

_installed: _observe.Observer | None = None


class _NoOpSpan:
    """A span that records nothing (the part of OpenTelemetry's ``Span`` code calls)."""

    def set_attribute(self, key: str, value: Any) -> None: ...
    def set_attributes(self, attributes: Any) -> None: ...
    def add_event(self, name: str, attributes: Any = None) -> None: ...
    def record_exception(self, exception: BaseException, attributes: Any = None) -> None: ...
    def set_status(self, status: Any, description: str | None = None) -> None: ...
    def end(self, end_time: int | None = None) -> None: ...
    def is_recording(self) -> bool:
        return False

    def __enter__(self) -> _NoOpSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class NoOpTracer:
    """The tracer before ``setup_telemetry()``: the calls of OpenTelemetry's ``Tracer``
    (``start_as_current_span``, ``start_span``), doing nothing and importing nothing.
    ``current_tracer()`` returns it until telemetry is set up, so code that opens its own
    spans needs no ``if`` and no opentelemetry when tracing is off."""

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> _NoOpSpan:
        """A span that records nothing (OpenTelemetry's arguments are accepted)."""
        return _NoOpSpan()

    def start_as_current_span(self, name: str, *args: Any, **kwargs: Any) -> _NoOpSpan:
        """A span that records nothing, usable as ``with tracer.start_as_current_span(...)``."""
        return _NoOpSpan()

    def __repr__(self) -> str:
        return "NoOpTracer()"


_NOOP = NoOpTracer()
_tracer: Any = _NOOP


def current_tracer() -> Any:
    """The tracer agent-saga's spans go to: OpenTelemetry's after ``setup_telemetry()``,
    else a ``NoOpTracer`` (the default)."""
    return _tracer


def setup_telemetry(tracer_provider: Any = None) -> _observe.Observer:
    """Emit OpenTelemetry spans for every saga, step and rollback from now on.

    Args:
        tracer_provider: an ``opentelemetry.sdk.trace.TracerProvider`` (default: the
            global one, ``opentelemetry.trace.get_tracer_provider()``).

    Calling it again replaces the previous setup. Returns the installed observer (pass it
    to ``agent_saga.observe.remove_observer``, or call ``teardown_telemetry()``). Raises
    ``ConfigurationError`` naming the extra to install if opentelemetry is missing.
    """
    global _installed
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ConfigurationError(
            f"setup_telemetry() needs OpenTelemetry ({exc}): pip install 'agent-saga[opentelemetry]'"
        ) from None
    from ._otel import SpanObserver

    global _tracer
    tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
    teardown_telemetry()
    _installed = _observe.add_observer(SpanObserver(tracer))
    _tracer = tracer
    _context.set_trace_source(_trace_ids)
    return _installed


def teardown_telemetry() -> None:
    """Stop emitting spans and trace ids (idempotent)."""
    global _installed, _tracer
    if _installed is not None:
        _observe.remove_observer(_installed)
        _installed = None
        _context.set_trace_source(None)
    _tracer = _NOOP


def _trace_ids() -> tuple[str, str] | None:
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
