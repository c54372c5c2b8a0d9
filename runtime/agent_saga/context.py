"""Correlation ids for logs: the current saga and step, carried in ``contextvars``.

The engine sets ``saga_id`` for the body of a ``saga_scope`` and ``step_id`` for the
duration of one ``execute``; ``SagaContextFilter`` stamps both on every log record that
passes a handler it is attached to. Context variables follow tasks and the tool executor's
threads, so concurrent sagas never bleed ids into each other's records.

Invariants:
- Library code logs through ``logging.getLogger("agent_saga.<module>")`` and never
  configures the root logger. ``configure_logging`` is opt-in, attaches one handler to the
  ``"agent_saga"`` logger only, and replaces the handler it attached before (idempotent).
- A record with no saga in context gets ``saga_id = step_id = None`` (printed as ``-``).
- Once ``setup_telemetry()`` registered a trace source, records also get ``trace_id`` and
  ``span_id`` of the current OpenTelemetry span (``-`` outside one): the JSON form
  carries them, and the text form adds ``trace=<id>`` after the step.
"""

from __future__ import annotations

import json as _json
import logging
import sys
from collections.abc import Callable
from contextvars import ContextVar
from typing import IO, Any

__all__ = [
    "JsonFormatter",
    "SagaContextFilter",
    "configure_logging",
    "current_saga_id",
    "current_step_id",
]

saga_id_var: ContextVar[str | None] = ContextVar("agent_saga_saga_id", default=None)
step_id_var: ContextVar[str | None] = ContextVar("agent_saga_step_id", default=None)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [saga=%(saga_id)s step=%(step_id)s] %(message)s"
TRACED_TEXT_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s [saga=%(saga_id)s step=%(step_id)s trace=%(trace_id)s] %(message)s"
)

#: Where trace ids come from: ``None`` until ``setup_telemetry()`` (agent_saga.telemetry).
_trace_source: Callable[[], tuple[str, str] | None] | None = None


def set_trace_source(source: Callable[[], tuple[str, str] | None] | None) -> None:
    """Stamp ``(trace_id, span_id)`` from ``source`` on records (``None``: stop); the
    handler ``configure_logging`` installed switches to the matching text format."""
    global _trace_source
    _trace_source = source
    if _installed is not None and _installed.formatter is not None and not isinstance(
        _installed.formatter, JsonFormatter
    ):
        _installed.setFormatter(logging.Formatter(TRACED_TEXT_FORMAT if source else TEXT_FORMAT))

LOGGER_NAME = "agent_saga"


def current_saga_id() -> str | None:
    """The id of the saga whose scope the caller is running in, or ``None``."""
    return saga_id_var.get()


def current_step_id() -> str | None:
    """The id of the step the caller is running in (forward or compensation), or ``None``."""
    return step_id_var.get()


class SagaContextFilter(logging.Filter):
    """Stamp ``saga_id`` and ``step_id`` from context on each record; never drops one.

    Attach it to a handler (handler filters see records from child loggers too). Ids
    already set on a record (``extra={"saga_id": ...}``) are kept.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Set ``record.saga_id`` / ``record.step_id`` (``"-"`` outside a saga); keep the record."""
        if getattr(record, "saga_id", None) is None:
            record.saga_id = saga_id_var.get() or "-"
        if getattr(record, "step_id", None) is None:
            record.step_id = step_id_var.get() or "-"
        source = _trace_source
        if source is not None and getattr(record, "trace_id", None) is None:
            try:
                ids = source()
            except Exception:  # noqa: BLE001 - a log line never fails for its trace id
                ids = None
            record.trace_id, record.span_id = ids if ids else ("-", "-")
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, saga_id, step_id (+ trace_id,
    span_id with telemetry on, + exc)."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as one line of JSON (never raises on odd ``args``: ``str()``)."""
        doc: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "saga_id": _none(getattr(record, "saga_id", None)),
            "step_id": _none(getattr(record, "step_id", None)),
        }
        trace_id = _none(getattr(record, "trace_id", None))
        if trace_id is not None:
            doc["trace_id"] = trace_id
            doc["span_id"] = _none(getattr(record, "span_id", None))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return _json.dumps(doc, ensure_ascii=False, default=str)


def _none(v: object) -> object:
    return None if v in (None, "-") else v


_installed: logging.Handler | None = None


def configure_logging(
    level: int | str = logging.INFO,
    json: bool = False,
    *,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Send agent-saga's logs to ``stream`` (default stderr) with saga/step ids stamped.

    Opt-in, for applications that have no logging setup of their own. Touches only the
    ``"agent_saga"`` logger (its level and one handler); calling it again replaces the
    handler it installed before. ``json=True`` writes one JSON object per line.
    Returns the handler. Raises ``ValueError`` for an unknown level name.
    """
    global _installed
    logger = logging.getLogger(LOGGER_NAME)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(SagaContextFilter())
    text = TRACED_TEXT_FORMAT if _trace_source is not None else TEXT_FORMAT
    handler.setFormatter(JsonFormatter() if json else logging.Formatter(text))
    if _installed is not None:
        logger.removeHandler(_installed)
    logger.addHandler(handler)
    logger.setLevel(level)
    _installed = handler
    return handler
