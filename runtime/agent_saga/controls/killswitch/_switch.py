"""The kill switch: HALT, DRAIN, QUARANTINE, each with an optional TTL.

    switch = KillSwitch(RedisSwitchStore(url, grace=30), wal=wal)
    gate = PreFlightGate(checks=[switch])          # or set_kill_switch(switch)
    switch.halt("tool:wire.send", reason="fraud pattern", by="soc@corp", ttl=600)

What each lever does (docs/killswitch.md):
- HALT refuses every step it covers (global, ``tool:<glob>``, ``tag:<tag>``) before
  anything is spent: the gate consults the switch before the breaker, the limits, the
  rules and any human.
- DRAIN refuses to START sagas (global or ``tag:<tag>``); a saga already running
  finishes, its remaining steps are not blocked (blocking them would strand it).
- QUARANTINE (``saga:<id>``) refuses that saga's next step with ``SagaQuarantined``;
  the saga then stops WITHOUT rolling back (SAGA_QUARANTINED in the WAL), the recovery
  daemon skips it (``is_quarantined``), and a human decides.
- A TTL lifts a lever on its own, at the same instant for every process.

Invariants:
- The check runs from memory: when nothing changed it costs a clock read and a few
  attribute reads (bench/bench_killswitch.py); the matcher is rebuilt only when the
  store's view changes or a TTL runs out.
- When the store's view is unusable (Redis lost for longer than ``grace``) every step
  is refused, and no saga may start. A lever document nobody can read acts as a global
  HALT: it was meant to stop something.
- With a ``wal``, every change this process sees (engaged, lifted, expired, store lost
  and regained) is appended to the WAL (the log's reserved saga ``wal``), with who, why
  and when; a change made through this object is recorded once, with who lifted it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from ..._identity import process_identity
from ...chain import RESERVED_SAGA
from ...clocks import SYSTEM_CLOCK, ControlClock, format_instant
from ...errors import ConfigurationError, WALError
from ...gates import StepRequest
from ...records import ExtensionType
from ...wal.base import BaseWAL
from .._checks import CheckRefusal, PreCheck
from ._local import FileSwitchStore
from ._model import Lever, LeverAction, compile_glob, parse_scope
from ._store import SwitchStore, SwitchView

__all__ = ["DEGRADED", "ENGAGED", "FAILED_CLOSED", "LIFTED", "RESTORED", "SWITCH_SAGA", "KillSwitch"]

log = logging.getLogger("agent_saga.controls")

#: The saga the records of this control are written under: the log's reserved saga, which
#: recovery never tries to resolve and compaction never removes (the records are the
#: audit trail of the control itself, not of any one saga).
SWITCH_SAGA = RESERVED_SAGA
ENGAGED = ExtensionType.KILL_SWITCH_ENGAGED.value
LIFTED = ExtensionType.KILL_SWITCH_LIFTED.value
FAILED_CLOSED = ExtensionType.KILL_SWITCH_FAILED_CLOSED.value
DEGRADED = ExtensionType.KILL_SWITCH_DEGRADED.value
RESTORED = ExtensionType.KILL_SWITCH_RESTORED.value

_HOST = process_identity().seen_by  # read once, at import


@dataclass(slots=True)
class _Matcher:
    """The levers in force, indexed for the hot path."""

    idle: bool = True
    halt_all: Lever | None = None
    tools: dict[str, Lever] = field(default_factory=dict)
    globs: tuple[tuple[re.Pattern[str], Lever], ...] = ()
    tags: dict[str, Lever] = field(default_factory=dict)
    quarantined: dict[str, Lever] = field(default_factory=dict)
    drain_all: Lever | None = None
    drain_tags: dict[str, Lever] = field(default_factory=dict)
    active: dict[str, Lever] = field(default_factory=dict)
    next_expiry: float = math.inf

    @classmethod
    def build(cls, view: SwitchView, now: float) -> _Matcher:
        m = cls()
        levers = list(view.levers)
        for lever_id, message in view.unreadable:  # a switch nobody can read stops everything
            levers.append(Lever(lever_id, LeverAction.HALT, "global",
                                f"unreadable kill switch document ({message})", "(unknown)"))
        globs: list[tuple[re.Pattern[str], Lever]] = []
        for lv in levers:
            if lv.expired(now):
                continue
            if lv.expires_at is not None:
                m.next_expiry = min(m.next_expiry, lv.expires_at)
            m.active[lv.id] = lv
            kind, value = parse_scope(lv.scope)
            if lv.action is LeverAction.QUARANTINE:
                m.quarantined.setdefault(value, lv)
            elif lv.action is LeverAction.DRAIN:
                if kind == "global":
                    m.drain_all = m.drain_all or lv
                else:
                    m.drain_tags.setdefault(value, lv)
            elif kind == "global":
                m.halt_all = m.halt_all or lv
            elif kind == "tag":
                m.tags.setdefault(value, lv)
            elif "*" in value or "?" in value:
                globs.append((compile_glob(value), lv))
            else:
                m.tools.setdefault(value, lv)
        m.globs = tuple(globs)
        m.idle = not (m.halt_all or m.tools or m.globs or m.tags or m.quarantined)
        return m

    def step_lever(self, request: StepRequest) -> Lever | None:
        q = self.quarantined.get(request.saga_id) if self.quarantined else None
        if q is not None:
            return q
        if self.halt_all is not None:
            return self.halt_all
        tool = request.tool
        hit = self.tools.get(tool)
        if hit is not None:
            return hit
        for pattern, lv in self.globs:
            if pattern.fullmatch(tool):
                return lv
        if self.tags:
            for tag in request.tags:
                hit = self.tags.get(tag)
                if hit is not None:
                    return hit
        return None


class KillSwitch(PreCheck):
    """The kill switch (a ``PreCheck`` of stage ``kill_switch``); see the module doc.

    ``store`` defaults to ``FileSwitchStore()`` (this process only: it says so, loudly).
    ``wal``: where the changes this process sees are recorded. ``clock``: the time seam
    (TTL expiry is wall time). ``name`` appears as ``decided_by`` in verdicts.
    """

    #: A halt engaged while a human was deciding still stops the call (see ``PreFlightGate``).
    recheck_after_approval = True

    def __init__(
        self,
        store: SwitchStore | None = None,
        *,
        wal: BaseWAL | None = None,
        clock: ControlClock | None = None,
        name: str = "kill-switch",
    ) -> None:
        if store is not None and not isinstance(store, SwitchStore):
            raise ConfigurationError(
                f"store must be a kill switch store (FileSwitchStore(), RedisSwitchStore(url, grace=...)), got {store!r}"
            )
        if wal is not None and not isinstance(wal, BaseWAL):
            raise ConfigurationError(f"wal must be a BaseWAL, got {wal!r}")
        self._store: SwitchStore = store if store is not None else FileSwitchStore()
        self._wal = wal
        self._clock = clock or SYSTEM_CLOCK
        self._name = name
        self._lock = threading.Lock()
        self._started = False
        self._seen: SwitchView | None = None
        self._m = _Matcher()
        self._recorded: dict[str, Lever] = {}
        self._posture = "ok"  # ok | degraded | closed
        self._closed: CheckRefusal | None = None

    # ------------------------------------------------------------------ PreCheck
    @property
    def name(self) -> str:
        """The switch's name: ``decided_by`` in the verdicts it refuses."""
        return self._name

    @property
    def stage(self) -> Literal["kill_switch"]:
        """``kill_switch``: the gate consults it first."""
        return "kill_switch"

    @property
    def store(self) -> SwitchStore:
        """Where the levers live."""
        return self._store

    def __repr__(self) -> str:
        return f"KillSwitch({self._store.describe()})"

    async def check(self, request: StepRequest) -> CheckRefusal | None:
        """Refuse ``request`` if a HALT or QUARANTINE covers it, or the store's view is
        unusable; else ``None``. From memory: no I/O once started."""
        if not self._started:
            await asyncio.to_thread(self.start)
        view = self._store.view()  # ``_current`` inlined: this is the hot path
        if view is not self._seen or self._m.next_expiry <= self._clock.time():
            self._adopt(view)
        if self._closed is not None:
            return self._closed
        m = self._m
        if m.idle:
            return None
        lever = m.step_lever(request)
        return None if lever is None else self._refusal(lever, request.saga_id)

    def start(self) -> None:
        """Start the store's watcher and read the levers (idempotent; may block)."""
        if self._started:
            return
        self._store.start()
        self._started = True
        self._adopt(self._store.view())

    def idle(self) -> bool:
        """True if no lever is in force and the store's view is usable: nothing this
        switch would refuse now (it starts the store first if needed; may block)."""
        if not self._started:
            self.start()
        m = self._current()
        return self._closed is None and m.idle and m.drain_all is None and not m.drain_tags

    async def admission(self, saga_id: str, tags: tuple[str, ...]) -> CheckRefusal | None:
        """Why a new saga must not start (a DRAIN covers it, or the view is unusable),
        or ``None``. A running saga is never asked: draining lets it finish."""
        if not self._started:
            await asyncio.to_thread(self.start)
        m = self._current()
        if self._closed is not None:
            return self._closed
        lever = m.drain_all
        if lever is None and m.drain_tags:
            lever = next((m.drain_tags[t] for t in tags if t in m.drain_tags), None)
        if lever is None:
            return None
        return CheckRefusal(
            f"saga {saga_id} not started: kill switch {lever.id} DRAIN {lever.scope} engaged by "
            f"{lever.requested_by} at {_when(lever.engaged_at)} ({lever.reason}){_until(lever)}: no new sagas "
            f"start while it drains (running ones finish); nothing was executed. {_lift_hint(lever)}",
            {"lever": lever.describe(), "action": "DRAIN"},
        )

    def quarantine_of(self, saga_id: str) -> Lever | None:
        """The QUARANTINE lever on ``saga_id`` among the levers last known (even while the
        store is unreachable), or ``None``."""
        return self._current().quarantined.get(saga_id)

    def is_quarantined(self, saga_id: str) -> bool:
        """The recovery daemon's question (``QuarantineSource``): True if ``saga_id`` is
        quarantined, or if the store cannot say (it skips the saga and asks again later)."""
        return self._store.is_quarantined(saga_id)

    def levers(self) -> list[Lever]:
        """The levers in force now (as this process sees them)."""
        return list(self._current().active.values())

    def _current(self) -> _Matcher:
        """The matcher of the store's current view (rebuilt if it changed or a TTL ran out)."""
        view = self._store.view()
        if view is not self._seen or self._m.next_expiry <= self._clock.time():
            self._adopt(view)
        return self._m

    def close(self) -> None:
        """Stop the store's watcher (a closed switch refuses nothing it did not know)."""
        self._store.close()

    def status(self) -> dict[str, Any]:
        """For ``AgentKit.status()``: the store, the posture and the levers in force."""
        levers = self.levers()
        return {
            "store": self._store.describe(),
            "posture": self._posture,
            "problem": self._closed.reason if self._closed is not None else None,
            "levers": [lv.describe() for lv in levers],
        }

    # ------------------------------------------------------------------ pulling levers
    def halt(self, scope: str = "global", *, reason: str, by: str, ttl: float | None = None) -> Lever:
        """Engage a HALT on ``scope`` (``global``, ``tool:<glob>``, ``tag:<tag>``).
        Raises ``ConfigurationError`` (bad scope, no reason or requester) or
        ``SwitchStoreUnavailable``."""
        return self._engage(LeverAction.HALT, scope, reason, by, ttl)

    def drain(self, scope: str = "global", *, reason: str, by: str, ttl: float | None = None) -> Lever:
        """Engage a DRAIN (``global`` or ``tag:<tag>``): no new sagas start."""
        return self._engage(LeverAction.DRAIN, scope, reason, by, ttl)

    def quarantine(self, saga_id: str, *, reason: str, by: str, ttl: float | None = None) -> Lever:
        """Quarantine one saga: its next step is refused and it is never rolled back
        automatically."""
        return self._engage(LeverAction.QUARANTINE, f"saga:{saga_id}", reason, by, ttl)

    def resume(self, scope: str, *, by: str) -> list[Lever]:
        """Lift every lever on exactly ``scope`` (any action); return those lifted."""
        if not isinstance(by, str) or not by.strip():
            raise ConfigurationError("resume needs --by: who lifted the lever lands in the WAL")
        kind, value = parse_scope(scope)
        canonical = "global" if kind == "global" else f"{kind}:{value}"
        lifted = []
        for lv in self._store.levers():
            if lv.scope == canonical:
                gone = self._store.lift(lv.id)
                if gone is None and bool(getattr(self._store, "last_repeats", None)):
                    gone = lv  # a repeat found it gone: the first attempt, whose reply was lost, lifted it
                if gone is not None:
                    lifted.append(gone)
                    self._record_lift(gone, "lifted", by)
        return lifted

    def _engage(self, action: LeverAction, scope: str, reason: str, by: str, ttl: float | None) -> Lever:
        lever = Lever.new(action, scope, reason=reason, by=by, now=self._clock.time(), ttl=ttl)
        self._store.engage(lever)
        log.info("kill switch %s engaged: %s %s (by %s)%s", lever.id, lever.action.value, lever.scope, by,
                 _until(lever))
        self._append(ENGAGED, {"lever": lever.describe(), "source": "api", "seen_by": _HOST,
                               "store": self._store.describe()})
        with self._lock:
            self._recorded[lever.id] = lever
        return lever

    def _record_lift(self, lever: Lever, how: str, by: str | None) -> None:
        with self._lock:
            known = self._recorded.pop(lever.id, None)
        if known is None and by is None:
            return
        payload: dict[str, Any] = {"id": lever.id, "how": how, "lever": lever.describe(), "seen_by": _HOST,
                                   "store": self._store.describe()}
        if by is not None:
            payload["by"] = by
        log.info("kill switch %s %s%s: %s %s no longer refused", lever.id, how, f" by {by}" if by else "",
                 lever.action.value, lever.scope)
        self._append(LIFTED, payload)

    # ------------------------------------------------------------------ view changes
    def _adopt(self, view: SwitchView) -> None:
        now = self._clock.time()
        with self._lock:
            m = _Matcher.build(view, now)
            self._seen, self._m = view, m
            closed = None
            if not view.usable:
                closed = CheckRefusal(
                    f"{view.problem or 'the kill switch store is unusable'}; nothing was executed",
                    {"action": "FAIL_CLOSED", "store": self._store.describe()},
                )
            self._closed = closed
            posture = "closed" if closed else ("degraded" if view.degraded else "ok")
            old_posture, self._posture = self._posture, posture
            engaged = [lv for lid, lv in m.active.items() if self._recorded.get(lid) != lv]
            if view.usable:
                gone = [lv for lid, lv in self._recorded.items() if lid not in m.active]
            else:
                gone = [lv for lid, lv in self._recorded.items() if lid not in m.active and lv.expired(now)]
            for lv in engaged:
                self._recorded[lv.id] = lv
            for lv in gone:
                self._recorded.pop(lv.id, None)
        store = self._store.describe()
        if posture != old_posture:
            if posture == "closed":
                log.error("kill switch %s fails closed: %s", self._name, view.problem)
                self._append(FAILED_CLOSED, {"store": store, "problem": view.problem, "seen_by": _HOST})
            elif posture == "degraded":
                self._append(DEGRADED, {"store": store, "problem": view.degraded, "seen_by": _HOST})
            else:
                self._append(RESTORED, {"store": store, "was": old_posture, "seen_by": _HOST})
        for lv in engaged:
            log.info("kill switch %s engaged: %s %s (by %s)%s", lv.id, lv.action.value, lv.scope, lv.requested_by,
                     _until(lv))
            self._append(ENGAGED, {"lever": lv.describe(), "source": "observed", "seen_by": _HOST, "store": store})
        for lv in gone:
            how = "expired" if lv.expired(now) else "lifted"
            log.info("kill switch %s %s: %s %s no longer refused", lv.id, how, lv.action.value, lv.scope)
            self._append(LIFTED, {"id": lv.id, "how": how, "lever": lv.describe(), "seen_by": _HOST, "store": store})

    def _append(self, type_: str, payload: dict[str, Any]) -> None:
        if self._wal is None:
            return
        try:
            self._wal.append(type_, SWITCH_SAGA, None, payload)
        except (WALError, ConfigurationError) as exc:  # the switch keeps working; the log says what it missed
            log.error("kill switch %s could not record %s in the WAL (%s)", self._name, type_, exc)

    def _refusal(self, lever: Lever, saga_id: str) -> CheckRefusal:
        who = f"by {lever.requested_by} at {_when(lever.engaged_at)} ({lever.reason}){_until(lever)}"
        if lever.action is LeverAction.QUARANTINE:
            return CheckRefusal(
                f"saga {saga_id} is quarantined (kill switch {lever.id}) {who}: it stops here and is NOT "
                f"rolled back; its completed steps stay as they are until a human decides. {_lift_hint(lever)}",
                {"lever": lever.describe(), "action": "QUARANTINE", "quarantined": True},
            )
        return CheckRefusal(
            f"kill switch {lever.id}: HALT {lever.scope} engaged {who}; nothing was executed. {_lift_hint(lever)}",
            {"lever": lever.describe(), "action": "HALT"},
        )


def _when(epoch: float | None) -> str:
    return "an unknown time" if epoch is None else format_instant(epoch)


def _until(lever: Lever) -> str:
    return "" if lever.expires_at is None else f", until {format_instant(lever.expires_at)}"


def _lift_hint(lever: Lever) -> str:
    if lever.id.startswith("cli/"):
        return f"Lift it with: agent-saga resume --scope {lever.scope} --by NAME"
    ns, _, name = lever.id.partition("/")
    return f"Lift it with: kubectl delete killswitch -n {ns} {name}"
