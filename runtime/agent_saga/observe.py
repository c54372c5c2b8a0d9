"""The observer hook: the one place the engine tells telemetry what happened.

The engine, the saga scope, the rollback and the WAL fence call ``observer()`` and, when
it returns an ``Observer``, one of its methods. Nothing is installed by default, so with
telemetry off each call site costs one global read and one ``is None`` test.
``agent_saga.telemetry`` (OpenTelemetry spans) and ``agent_saga.metrics`` (Prometheus)
are the observers shipped; both can be installed at once (``add_observer``).

Events, in the order a saga meets them (``handle`` is whatever the ``*_started`` method
returned, handed back to the matching ``*_ended``):

    saga_started(saga_id, name)                 -> handle   (the body runs inside it)
    step_started(saga_id, step_id, tool, sem)   -> handle   (the forward call runs inside it)
    step_ended(handle, outcome, error)          outcome: committed | failed | unknown
    step_refused(saga_id, step_id, tool, sem, control, error)
    rollback_step_started(saga_id, step_id, tool, sem) -> handle
    rollback_step_ended(handle, outcome, error) outcome: a RollbackOutcome value
    rollback_ended(saga_id, clean)
    saga_ended(handle, status, error)           status: COMPLETED | ROLLED_BACK | FAILED | QUARANTINED
    fence_waited(seconds)                       a durability fence that had to wait
    wal_failed(wal, how)                        a WAL writer failed-stop: how is stalled (a
                                                fence or append passed its bound) or failed
                                                (a write raised); called under its lock
    plane_unreachable(kind)                     a policy-plane reader (kind: KillSwitch,
                                                BudgetLimit, ...) failed to read Redis; once
                                                per attempt while it stays unreachable
    traceparent()                               written in SAGA_STARTED when not None
    recovery_started(saga_id, traceparent)      -> handle   (a daemon resolving a saga)
    recovery_ended(handle, state, error)

Invariants:
- An observer never breaks a saga: every call is made through ``safely`` (an exception
  is logged once per observer method, then ignored).
- Observers run on the caller's task and context: a handle that attaches a tracing
  context (OpenTelemetry) is attached and detached in the same context, so the step's
  span is current inside the forward call, on the tool executor's threads too (they copy
  the caller's context).
- This module imports only the standard library; it knows nothing of OpenTelemetry or
  Prometheus.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["Observer", "add_observer", "current", "observer", "remove_observer", "safely"]

log = logging.getLogger("agent_saga.observe")

STEP_COMMITTED = "committed"
STEP_FAILED = "failed"
STEP_UNKNOWN = "unknown"


class Observer:
    """The hook interface, every method a no-op: subclass and override what you need."""

    def saga_started(self, saga_id: str, name: str | None) -> Any:
        """A saga scope was entered; the return value is handed to ``saga_ended``."""
        return None

    def saga_ended(self, handle: Any, status: str, error: BaseException | None) -> None:
        """The saga left its scope: COMPLETED, ROLLED_BACK, FAILED (partial) or QUARANTINED."""

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` of the current trace, written in SAGA_STARTED so that a
        recovery daemon can link its work to the saga's trace; ``None`` for none."""
        return None

    def recovery_started(self, saga_id: str, traceparent: str | None) -> Any:
        """A recovery daemon took over ``saga_id`` (``traceparent`` from its SAGA_STARTED)."""
        return None

    def recovery_ended(self, handle: Any, state: str, error: str | None) -> None:
        """The daemon's work on the saga ended (``state``: a ``SagaResult`` state)."""

    def step_started(self, saga_id: str, step_id: str, tool: str, semantics: str) -> Any:
        """A step passed its gate and is about to run; the value goes to ``step_ended``."""
        return None

    def step_ended(self, handle: Any, outcome: str, error: BaseException | None) -> None:
        """The step ended: ``committed``, ``failed`` or ``unknown``."""

    def step_refused(
        self, saga_id: str, step_id: str, tool: str, semantics: str, control: str, error: BaseException
    ) -> None:
        """A gate refused the step (``control``: ``GateBlocked.control``, the refusing stage)."""

    def rollback_step_started(self, saga_id: str, step_id: str, tool: str, semantics: str) -> Any:
        """A step is about to be undone; the value goes to ``rollback_step_ended``."""
        return None

    def rollback_step_ended(self, handle: Any, outcome: str, error: str | None) -> None:
        """The step's undo ended with ``outcome`` (a ``RollbackOutcome`` value)."""

    def rollback_ended(self, saga_id: str, clean: bool) -> None:
        """A rollback finished, clean or partial."""

    def fence_waited(self, seconds: float) -> None:
        """A durability fence (``barrier``) waited ``seconds`` for the log."""

    def wal_failed(self, wal: str, how: str) -> None:
        """The WAL writer ``wal`` failed-stop (``how``: ``stalled`` or ``failed``): it refuses
        every record from now on. Called under the writer's lock: return quickly."""

    def plane_unreachable(self, kind: str) -> None:
        """A policy-plane reader of ``kind`` could not read Redis (each attempt; it retries
        and its control does what it does on a lost plane, docs/policy-plane.md)."""


class _Fanout(Observer):
    """Several observers as one; a handle is the tuple of theirs."""

    def __init__(self, members: tuple[Observer, ...]) -> None:
        self.members = members

    def saga_started(self, saga_id: str, name: str | None) -> Any:
        return tuple(safely(o.saga_started, saga_id, name) for o in self.members)

    def saga_ended(self, handle: Any, status: str, error: BaseException | None) -> None:
        for o, h in zip(self.members, handle, strict=True):
            safely(o.saga_ended, h, status, error)

    def traceparent(self) -> str | None:
        for o in self.members:
            tp = safely(o.traceparent)
            if tp:
                return str(tp)
        return None

    def recovery_started(self, saga_id: str, traceparent: str | None) -> Any:
        return tuple(safely(o.recovery_started, saga_id, traceparent) for o in self.members)

    def recovery_ended(self, handle: Any, state: str, error: str | None) -> None:
        for o, h in zip(self.members, handle, strict=True):
            safely(o.recovery_ended, h, state, error)

    def step_started(self, saga_id: str, step_id: str, tool: str, semantics: str) -> Any:
        return tuple(safely(o.step_started, saga_id, step_id, tool, semantics) for o in self.members)

    def step_ended(self, handle: Any, outcome: str, error: BaseException | None) -> None:
        for o, h in zip(self.members, handle, strict=True):
            safely(o.step_ended, h, outcome, error)

    def step_refused(
        self, saga_id: str, step_id: str, tool: str, semantics: str, control: str, error: BaseException
    ) -> None:
        for o in self.members:
            safely(o.step_refused, saga_id, step_id, tool, semantics, control, error)

    def rollback_step_started(self, saga_id: str, step_id: str, tool: str, semantics: str) -> Any:
        return tuple(safely(o.rollback_step_started, saga_id, step_id, tool, semantics) for o in self.members)

    def rollback_step_ended(self, handle: Any, outcome: str, error: str | None) -> None:
        for o, h in zip(self.members, handle, strict=True):
            safely(o.rollback_step_ended, h, outcome, error)

    def rollback_ended(self, saga_id: str, clean: bool) -> None:
        for o in self.members:
            safely(o.rollback_ended, saga_id, clean)

    def fence_waited(self, seconds: float) -> None:
        for o in self.members:
            safely(o.fence_waited, seconds)

    def wal_failed(self, wal: str, how: str) -> None:
        for o in self.members:
            safely(o.wal_failed, wal, how)

    def plane_unreachable(self, kind: str) -> None:
        for o in self.members:
            safely(o.plane_unreachable, kind)


_members: tuple[Observer, ...] = ()
_failed: set[str] = set()

#: The installed observer (several combined into one), or ``None``: telemetry off. Call
#: sites read this attribute (``observe.current``) rather than call ``observer()``.
current: Observer | None = None


def observer() -> Observer | None:
    """The installed observer (several are combined into one), or ``None``: telemetry off."""
    return current


def add_observer(obs: Observer) -> Observer:
    """Install ``obs`` next to any already installed (idempotent); returns it."""
    global _members
    if not isinstance(obs, Observer):
        raise TypeError(f"an observer must subclass agent_saga.observe.Observer, got {obs!r}")
    if obs not in _members:
        _members = (*_members, obs)
        _publish()
    return obs


def remove_observer(obs: Observer) -> None:
    """Uninstall ``obs`` (idempotent)."""
    global _members
    _members = tuple(o for o in _members if o is not obs)
    _publish()


def _publish() -> None:
    global current
    current = None if not _members else _members[0] if len(_members) == 1 else _Fanout(_members)


def safely(method: Any, *args: Any) -> Any:
    """Call an observer method; an exception is logged (once per method) and ignored."""
    try:
        return method(*args)
    except Exception as exc:  # noqa: BLE001 - telemetry never breaks a saga
        name = getattr(method, "__qualname__", repr(method))
        if name not in _failed:
            _failed.add(name)
            log.warning("telemetry observer %s failed (ignored, logged once): %s: %s",
                        name, type(exc).__name__, exc)
        return None
