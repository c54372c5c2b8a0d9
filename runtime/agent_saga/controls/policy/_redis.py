"""``RedisPolicySource``: the SagaPolicies the operator projected, cached and watched.

    source = RedisPolicySource(url, agent="payments-agent", namespaces=["payments"], grace=30)
    gate = PreFlightGate(policy=source)

Reads ``P:v1:sagapolicy:<ns>/<name>`` documents (docs/policy-plane.md, "SagaPolicy")
through the policy-plane reader (``agent_saga.controls._policyplane``: subscribe, then
load; change notifications; a re-read every ``heartbeat``; the synced marker), keeps the
policies whose ``appliesTo`` matches ``agent``, and answers the gate from memory.

Invariants:
- Live reload: an edit or a deletion with kubectl is in force at the next notification
  (typically milliseconds) or the next heartbeat (its own thread re-reads then; the
  agent's shared watcher re-reads when ``P:rev`` moved and otherwise renews the grace
  window, ``_proven``); a deleted policy no longer governs —
  the code's declarations are back.
- Fail closed, as the kill switch: until the policies have been read once the view is
  unusable (the gate refuses every call). When the policy plane stops answering, or
  loses its data (the synced marker disappears), the last known policies hold for
  ``grace`` seconds, then the view is unusable until the plane answers (is re-projected).
  An empty index is never read as "no policy" after a data loss.
- A document this version cannot read is skipped and reported (``problems``), never
  guessed at.
- Observe mode: the calls it governs are recorded (tool, declared semantics, policy
  argument names; never values) into ``P:v1:surface:<ns>/<agent>`` from the watcher
  thread, at most once per heartbeat.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection, Sequence
from typing import Any

from ...clocks import SYSTEM_CLOCK, ControlClock, format_instant
from ...errors import ConfigurationError, StoreUnavailable
from ...gates import StepRequest
from .._policyplane import DEFAULT_PREFIX, PolicyPlaneReader
from ._evaluation import PolicySet
from ._files import policies_from_documents
from ._source import PolicyView, SurfaceLog
from ._surface import record_surface

__all__ = ["PolicySourceUnavailable", "RedisPolicySource"]

log = logging.getLogger("agent_saga.controls")


class PolicySourceUnavailable(StoreUnavailable):
    """The policy plane could not be read for SagaPolicies."""


class RedisPolicySource(PolicyPlaneReader):
    """SagaPolicies from the policy plane for one agent (see the module doc).

    ``agent``: this agent's name (what ``appliesTo`` matches). ``namespaces``: the
    Kubernetes namespaces whose policies apply (default: every namespace). ``grace``
    (required, as for the kill switch): seconds the last known policies hold once the
    plane stops answering. Needs ``pip install agent-saga[redis]``.
    """

    NAME = "RedisPolicySource"
    KIND = "SagaPolicy"
    SLUG = "sagapolicy"
    UNAVAILABLE = PolicySourceUnavailable
    AUTHORITY = "operator"
    THREAD_NAME = "agent-saga-policy"
    UNREAD = "the gate refuses every call"
    DATA_LOST_SUFFIX = "; the last known SagaPolicies hold for the grace window, then every call is refused"

    def __init__(
        self,
        url: str,
        *,
        agent: str,
        grace: float,
        namespaces: Collection[str] | None = None,
        prefix: str = DEFAULT_PREFIX,
        heartbeat: float = 0.5,
        socket_timeout: float = 1.0,
        connect_timeout: float = 1.0,
        clock: ControlClock | None = None,
    ) -> None:
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace < math.inf:
            raise ConfigurationError(f"grace must be a number of seconds >= 0 (0: fail closed at once), got {grace!r}")
        if not isinstance(agent, str) or not agent:
            raise ConfigurationError("RedisPolicySource needs the agent's name (what a SagaPolicy's appliesTo matches)")
        self.agent = agent
        self.grace = float(grace)
        self._clock = clock or SYSTEM_CLOCK
        super().__init__(url, namespaces=namespaces, prefix=prefix, heartbeat=heartbeat,
                         socket_timeout=socket_timeout, connect_timeout=connect_timeout)
        self.surface = SurfaceLog()
        self._surface_ns = sorted(self.namespaces)[0] if self.namespaces else None

    def _initial_state(self) -> None:
        self._version = 0
        self._pset = PolicySet((), agent=getattr(self, "agent", "agent"))
        self._view = PolicyView(self._pset, usable=False, problem=f"{self.describe()} has not been read yet")
        self._valid_until = -math.inf
        self._expired: tuple[float, PolicyView, PolicyView] | None = None
        self.problems: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"{self.describe()[:-1]}, agent={self.agent}, grace={self.grace:g})"

    # ------------------------------------------------------------------ hot path
    def view(self) -> PolicyView:
        """The policies in force for the agent now (no I/O; starts the watcher on first use)."""
        if not self.running:
            self.start()
        if self._clock.monotonic() < self._valid_until:
            return self._view
        return self._closed_view()

    def _closed_view(self) -> PolicyView:
        base, until = self._view, self._valid_until
        cached = self._expired
        if cached is not None and cached[0] == until and cached[1] is base:
            return cached[2]
        if until == -math.inf:
            why = f"{base.problem or self.describe() + ' has never been read'}; with no known SagaPolicy"
        elif self.data_lost is not None:
            why = f"{self.data_lost}, and the grace window of {self.grace:g}s has passed"
        else:
            why = (f"{self.describe()} is unreachable ({self.last_error or 'no answer'}) and the grace window "
                   f"of {self.grace:g}s has passed")
        view = PolicyView(base.policies, usable=False, problem=why)
        self._expired = (until, base, view)
        return view

    def record(self, request: StepRequest) -> None:
        """Note a call an Observe-mode policy governs (written from the watcher thread)."""
        self.surface.add(request)

    def status(self) -> dict[str, Any]:
        """The source's state (JSON): the policies in force, whether usable, why not."""
        v = self.view()
        return {"source": self.describe(), "agent": self.agent, "usable": v.usable, "problem": v.problem,
                "degraded": v.degraded, "policies": v.policies.refs, "problems": list(self.problems),
                "reloads": self.reloads, "last_error": self.last_error, "data_lost": self.data_lost is not None}

    # ------------------------------------------------------------------ reader hooks
    def _apply(self, docs: Sequence[tuple[str, Any]]) -> None:
        parsed: list[dict[str, Any]] = []
        problems: list[str] = []
        for id_, raw in docs:
            try:
                doc = json.loads(raw)
                if not isinstance(doc, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                problems.append(f"{id_}: unreadable document ({exc}) (skipped)")
                continue
            parsed.append(doc)
        policies, more = policies_from_documents(parsed)
        problems += more
        now = self._clock.monotonic()
        with self._lock:
            cur = self._pset
            changed = (not self._view.usable or self._view.degraded is not None
                       or tuple(p for p in policies if p.policy.applies(self.agent)) != cur.policies
                       or tuple(problems) != self.problems)
            if changed:
                self._version += 1
                self._pset = PolicySet(policies, agent=self.agent, version=self._version)
                self._view = PolicyView(self._pset)
                self.problems = tuple(problems)
            self._valid_until = now + 3 * self.heartbeat + self.grace
        if changed:
            for p in problems:
                log.warning("%s: %s", self.describe(), p)

    def _heartbeat(self, client: Any) -> None:
        self._load(client)  # every read proves the plane answers: it renews the grace window
        self._write_surface(client)

    def _backstop(self, client: Any, rev: Any) -> None:
        super()._backstop(client, rev)  # the agent's watcher, every heartbeat
        self._write_surface(client)

    def _proven(self) -> None:
        """The agent's watcher read the ``P:rev`` of the policies held: the plane answers and
        they are current, so the grace window is renewed as by a read."""
        with self._lock:
            self._valid_until = self._clock.monotonic() + 3 * self.heartbeat + self.grace

    def _write_surface(self, client: Any) -> None:
        if self._surface_ns is None:
            return
        entries = self.surface.drain()
        if not entries:
            return
        try:
            record_surface(client, self.prefix, self._surface_ns, self.agent, entries)
        except Exception as exc:  # noqa: BLE001 - a record never breaks the reader; kept for next time
            self.surface.restore(entries)
            log.warning("%s: the tool surface could not be recorded (%s); retrying", self.describe(),
                        self._target.error_text(exc))

    def _on_lost(self, error: str, first: bool) -> None:
        self._degrade(f"{self.describe()} is unreachable ({error})")
        if first:
            log.warning("%s lost (%s): the last known SagaPolicies hold for %gs, then every call is refused",
                        self.describe(), error, self.grace)

    def _on_data_lost(self, missing: frozenset[str], first: bool) -> None:
        self._degrade(str(self.data_lost))
        if first:
            log.warning("%s: the last known SagaPolicies hold for %gs, then every call is refused until they are "
                        "re-projected", self.data_lost, self.grace)

    def _on_restored(self, writers: frozenset[str]) -> None:
        log.warning("%s: the policy plane's synced marker is back (%s): the SagaPolicies in Redis are "
                    "authoritative again", self.describe(), ", ".join(sorted(writers)))

    def _degrade(self, why: str) -> None:
        """Hold the last known policies for ``grace`` from now (never longer than already
        allowed), saying why and until when."""
        now = self._clock.monotonic()
        with self._lock:
            self._valid_until = min(self._valid_until, now + self.grace)
            v = self._view
            if v.usable and v.degraded is None and self._valid_until > -math.inf:
                until = format_instant(self._clock.time() + max(0.0, self._valid_until - now))
                self._view = PolicyView(v.policies, degraded=f"{why}: the last known SagaPolicies hold until "
                                                             f"{until} (grace {self.grace:g}s)")
