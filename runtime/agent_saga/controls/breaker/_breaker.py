"""The circuit breaker: stop calling a dependency that keeps failing, then probe it.

    set_breaker(CircuitBreaker(BreakerPolicy(
        failure_threshold=5,   # consecutive failures, or...
        failure_rate=0.5,      # ...50% of calls failing,
        min_volume=10,         #    once there is enough volume to mean anything
        window=60,
        cool_down=30,          # then one trial call
    ), wal=wal))

Each circuit (one per tool by default; ``key=by_service`` shares one per ``stripe.*``)
is CLOSED (calls pass), OPEN (calls are refused until ``cool_down`` has passed) or
HALF_OPEN (exactly one trial call passes; its success closes the circuit, its failure
opens it again for another ``cool_down``).

Three behaviours where the obvious answer is wrong (docs/breaker.md):
- A refusal is not a failure. Only a tool that ran and raised (or timed out: its outcome
  is unknown because the dependency did not answer) counts. Refusals by any control,
  misuse, a compensation that could not be derived after the tool returned, and a WAL
  failure do not.
- It never blocks a rollback: compensations do not pass through the gate, so they are
  never refused by it, and their failures never reach it.
- It fails open. The state is per process: nothing can make it unreachable, and if its
  own bookkeeping breaks the gate logs it and the call goes ahead (a breaker that
  refuses work because it is broken is an outage it invented).

Invariants:
- Consulted after the kill switch and before the limits, so a call to a dependency known
  to be down spends no budget on its way to being refused.
- With a ``wal``, every trip (BREAKER_OPENED, with why), trial call (BREAKER_PROBE) and
  recovery (BREAKER_CLOSED) is appended under the log's reserved saga ``wal``.
- A trial call that never reports back (its process refused it later, or it was
  cancelled) frees the trial slot after ``cool_down``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ...chain import RESERVED_SAGA
from ...clocks import SYSTEM_CLOCK, ControlClock
from ...errors import ConfigurationError, WALError
from ...gates import StepRequest
from ...records import ExtensionType
from ...wal.base import BaseWAL
from .._checks import PreCheck
from ._model import BreakerPolicy, State, by_tool_name, counts_as_failure

__all__ = ["BREAKER_SAGA", "CLOSED", "OPENED", "PROBE", "CircuitBreaker"]

log = logging.getLogger("agent_saga.controls")

#: The saga the records of this control are written under: the log's reserved saga, which
#: recovery never tries to resolve and compaction never removes (the records are the
#: audit trail of the control itself, not of any one saga).
BREAKER_SAGA = RESERVED_SAGA
OPENED = ExtensionType.BREAKER_OPENED.value
PROBE = ExtensionType.BREAKER_PROBE.value
CLOSED = ExtensionType.BREAKER_CLOSED.value


@dataclass(slots=True)
class _Circuit:
    key: str
    state: State = "closed"
    consecutive: int = 0
    #: the calls that ended in the window, oldest first: a success as its time alone (a
    #: number the garbage collector never tracks: one is kept per call for ``window``
    #: seconds), a failure as ``(time, True)``
    events: deque[float | tuple[float, bool]] = field(default_factory=deque)
    failures: int = 0  # failed events in ``events``
    opened_at: float = 0.0
    why: str = ""
    last_error: str = ""
    probe: str | None = None  # the step id of the trial call in flight
    probe_at: float = 0.0
    trips: int = 0


class CircuitBreaker(PreCheck):
    """The circuit breaker (a ``PreCheck`` of stage ``breaker``); see the module doc.

    ``policy``: a ``BreakerPolicy``. ``wal``: where trips, probes and recoveries are
    recorded. ``key``: tool name -> circuit name (``by_tool_name``, ``by_service``).
    ``tools``: only tools for which this returns True are guarded (default: all).
    ``clock``: the time seam. ``name`` appears as ``decided_by`` in verdicts.
    """

    def __init__(
        self,
        policy: BreakerPolicy | None = None,
        *,
        wal: BaseWAL | None = None,
        key: Callable[[str], str] = by_tool_name,
        tools: Callable[[str], bool] | None = None,
        clock: ControlClock | None = None,
        name: str = "breaker",
    ) -> None:
        policy = policy if policy is not None else BreakerPolicy()
        if not isinstance(policy, BreakerPolicy):
            raise ConfigurationError(f"policy must be a BreakerPolicy(...), got {policy!r}")
        if wal is not None and not isinstance(wal, BaseWAL):
            raise ConfigurationError(f"wal must be a BaseWAL, got {wal!r}")
        if not callable(key):
            raise ConfigurationError(f"key must map a tool name to a circuit name, got {key!r}")
        self.policy = policy
        self._wal = wal
        self._key = key
        self._tools = tools
        self._clock = clock or SYSTEM_CLOCK
        self._name = name
        self._lock = threading.Lock()
        self._circuits: dict[str, _Circuit] = {}

    @property
    def name(self) -> str:
        """The breaker's name: ``decided_by`` in the verdicts it refuses."""
        return self._name

    @property
    def stage(self) -> Literal["breaker"]:
        """``breaker``: the gate consults it after the kill switch."""
        return "breaker"

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.policy!r})"

    # ------------------------------------------------------------------ the check
    async def check(self, request: StepRequest) -> str | None:
        """Refuse ``request`` while its circuit is open (or its trial call is in flight).
        Fails open: if the breaker's own bookkeeping fails, the call goes ahead."""
        return self.allow(request)

    def allow(self, request: StepRequest) -> str | None:
        """The check without the gate (synchronous): why ``request`` may not run now, or
        ``None`` (a trial call is admitted once the cool-down has passed). Fails open."""
        if not self._circuits:
            return None
        try:
            return self._check(request)
        except Exception as exc:  # noqa: BLE001 - an availability control must not invent an outage
            log.error("circuit breaker %s failed (%s: %s); the call goes ahead", self._name, type(exc).__name__, exc)
            return None

    def _check(self, request: StepRequest) -> str | None:
        c = self._circuits.get(self._key(request.tool))
        if c is None or c.state == "closed":
            return None
        if self._tools is not None and not self._tools(request.tool):
            return None
        now = self._clock.monotonic()
        cool = self.policy.cool_down
        with self._lock:
            if c.state == "open" and now - c.opened_at < cool:
                return (f"circuit breaker open for {c.key}: {c.why} (last error: {c.last_error}); opened "
                        f"{now - c.opened_at:.0f}s ago, one trial call is allowed in {cool - (now - c.opened_at):.0f}s. "
                        f"Only calls that ran and failed count, never refusals; nothing was executed")
            if c.probe is not None and now - c.probe_at < cool:
                return (f"circuit breaker for {c.key} is half-open: a trial call ({c.probe}) is in flight and "
                        f"the dependency is not yet known to be back; nothing was executed")
            c.state, c.probe, c.probe_at = "half_open", request.step_id, now
        self._append(PROBE, {"circuit": c.key, "saga": request.saga_id, "step": request.step_id,
                             "tool": request.tool, "open_for": round(now - c.opened_at, 3)})
        return None

    def on_refused(self, request: StepRequest) -> None:
        """A later stage refused a call this breaker let pass: free its trial slot."""
        c = self._circuits.get(self._key(request.tool))
        if c is not None and c.probe == request.step_id:
            with self._lock:
                if c.probe == request.step_id:
                    c.probe = None

    def on_outcome(self, request: StepRequest, ok: bool, error: BaseException | None) -> None:
        """How a step this breaker let pass ended (called by the engine through the gate)."""
        if ok and self._tools is None:
            c = self._circuits.get(self._key(request.tool))
            if c is not None and c.state == "closed" and not c.failures:
                # the usual case: a success through a closed circuit with no failure in
                # the window is counted (the volume a failure rate needs) and decides nothing
                now = self._clock.monotonic()
                with self._lock:
                    if c.state == "closed" and not c.failures:
                        c.events.append(now)
                        self._expire(c, now - self.policy.window)
                        c.consecutive = 0
                        return
        if self._tools is not None and not self._tools(request.tool):
            return
        failed = counts_as_failure(None if ok else error)
        key = self._key(request.tool)
        if failed is None:
            self.on_refused(request)
            return
        c = self._circuits.get(key)
        if c is None:  # successes count too: a failure rate needs the volume
            with self._lock:
                c = self._circuits.setdefault(key, _Circuit(key))
        now = self._clock.monotonic()
        err = "" if error is None else f"{type(error).__name__}: {error}"[:300]
        records: list[tuple[str, dict[str, Any]]] = []
        with self._lock:
            if c.probe == request.step_id:
                c.probe = None
                if failed:
                    self._open(c, now, f"the trial call {request.step_id} failed", err, records)
                else:
                    c.state, c.consecutive = "closed", 0
                    c.events.clear()
                    c.failures = 0
                    records.append((CLOSED, {"circuit": c.key, "step": request.step_id, "saga": request.saga_id,
                                             "after": round(now - c.opened_at, 3), "trips": c.trips}))
            else:
                self._count(c, now, failed, err, records)
        for type_, payload in records:
            self._append(type_, payload)

    def _count(self, c: _Circuit, now: float, failed: bool, err: str,
               records: list[tuple[str, dict[str, Any]]]) -> None:
        p = self.policy
        if failed:
            c.events.append((now, True))
            c.failures += 1
        else:
            c.events.append(now)
        self._expire(c, now - p.window)
        if failed:
            c.consecutive += 1
            c.last_error = err
        else:
            c.consecutive = 0
        if c.state != "closed":
            return  # a call that started before the circuit opened: counted, decides nothing
        volume = len(c.events)
        if c.consecutive >= p.failure_threshold:
            self._open(c, now, f"{c.consecutive} consecutive failures (threshold {p.failure_threshold})",
                       err, records, reason="threshold")
        elif volume >= p.min_volume and c.failures / volume >= p.failure_rate:
            self._open(c, now, f"{c.failures} of the last {volume} calls failed in {p.window:g}s "
                               f"(rate {c.failures / volume:.0%} >= {p.failure_rate:.0%})",
                       err, records, reason="rate")

    @staticmethod
    def _expire(c: _Circuit, horizon: float) -> None:
        """Forget the calls of ``c`` that ended at ``horizon`` or before."""
        events = c.events
        while events:
            e = events[0]
            if e.__class__ is tuple:
                if e[0] > horizon:
                    return
                c.failures -= 1
            elif e > horizon:  # type: ignore[operator]
                return
            events.popleft()

    def _open(self, c: _Circuit, now: float, why: str, err: str,
              records: list[tuple[str, dict[str, Any]]], reason: str = "probe_failed") -> None:
        c.state, c.opened_at, c.why, c.probe = "open", now, why, None
        if err:
            c.last_error = err
        c.trips += 1
        records.append((OPENED, {"circuit": c.key, "reason": reason, "why": why, "last_error": c.last_error,
                                 "calls": len(c.events), "failures": c.failures, "consecutive": c.consecutive,
                                 "cool_down": self.policy.cool_down, "policy": self.policy.to_doc()}))
        log.warning("circuit breaker opened for %s: %s", c.key, why)

    def _append(self, type_: str, payload: dict[str, Any]) -> None:
        if self._wal is None:
            return
        try:
            self._wal.append(type_, BREAKER_SAGA, None, payload)
        except WALError as exc:
            log.error("circuit breaker could not record %s in the WAL (%s)", type_, exc)

    # ------------------------------------------------------------------ introspection
    def state(self, tool: str) -> State:
        """The state of ``tool``'s circuit (``closed`` if it never failed)."""
        c = self._circuits.get(self._key(tool))
        return "closed" if c is None else c.state

    def status(self) -> dict[str, Any]:
        """Every circuit: state, counts in the window, why it opened."""
        now = self._clock.monotonic()
        with self._lock:
            return {
                "policy": self.policy.to_doc(),
                "circuits": [
                    {"circuit": c.key, "state": c.state, "consecutive": c.consecutive,
                     "calls": len(c.events), "failures": c.failures, "trips": c.trips,
                     "why": c.why or None, "open_for": round(now - c.opened_at, 3) if c.state != "closed" else None}
                    for c in sorted(self._circuits.values(), key=lambda c: c.key)
                ],
            }

    def reset(self, tool: str | None = None) -> None:
        """Forget the state of ``tool``'s circuit (every circuit if ``None``)."""
        with self._lock:
            if tool is None:
                self._circuits.clear()
            else:
                self._circuits.pop(self._key(tool), None)
