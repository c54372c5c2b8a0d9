"""``RedisRouteSource``: the ModelRoute the operator projected for this agent, watched.

    source = RedisRouteSource(url, agent="payments-agent", namespaces=["payments"])
    router = Router(source)           # reads source.route() on every call (no I/O)

Reads ``P:v1:modelroute:<ns>/<name>`` documents through the policy-plane reader
(``agent_saga.controls._policyplane``: subscribe, then load; notifications; a re-read every
``heartbeat``; the synced marker) and keeps the route whose ``appliesTo`` matches
``agent`` (a route without ``appliesTo`` applies to every agent of its namespace).

Invariants:
- Live reload: a ModelRoute edited with kubectl decides the next call after the change
  notification (typically milliseconds) or the next heartbeat.
- One route in force: when several match, the first by ``namespace/name`` is used and the
  others are reported (``problems``); only the route in force is acknowledged (``applied``),
  so its ``Ready`` says an agent routes by it and the others' say none does.
- Until a route has been read, ``route()`` raises ``RoutingUnavailable`` (the router
  refuses: it never invents a host). When the plane stops answering or loses its data the
  last route read keeps deciding (hosts and preferences are not a safety control) and
  ``status()`` says so; a deleted route stops deciding at the next read.
- A document this version cannot read is skipped and reported, never guessed at.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from collections.abc import Collection, Sequence
from typing import Any

from ..controls._policyplane import DEFAULT_PREFIX, PolicyPlaneReader
from ..errors import ConfigurationError, StoreUnavailable
from ..heartbeat import AppliedRef
from ._route import Route

__all__ = ["RedisRouteSource", "RoutingUnavailable"]

log = logging.getLogger("agent_saga.routing")


class RoutingUnavailable(StoreUnavailable):
    """No route can be read for this agent (the plane was never read, or no ModelRoute applies)."""


class RedisRouteSource(PolicyPlaneReader):
    """ModelRoutes from the policy plane for one agent (see the module doc).

    ``agent``: this agent's name (what ``appliesTo`` matches). ``namespaces``: whose
    ModelRoutes apply (default: every namespace). ``timeout`` / ``stream`` /
    ``stall_timeout``: how the route's ``OpenAIHost``\\ s call their endpoints. Needs
    ``pip install agent-saga[redis]``.
    """

    NAME = "RedisRouteSource"
    KIND = "ModelRoute"
    SLUG = "modelroute"
    UNAVAILABLE = RoutingUnavailable
    AUTHORITY = "operator"
    THREAD_NAME = "agent-saga-routes"
    UNREAD = "the router refuses every call"
    DATA_LOST_SUFFIX = "; the last route read keeps deciding until the ModelRoutes are re-projected"

    def __init__(self, url: str, *, agent: str, namespaces: Collection[str] | None = None,
                 prefix: str = DEFAULT_PREFIX, heartbeat: float = 0.5, timeout: float = 60.0, stream: bool = False,
                 stall_timeout: float = 10.0, socket_timeout: float = 1.0, connect_timeout: float = 1.0) -> None:
        if not isinstance(agent, str) or not agent:
            raise ConfigurationError("RedisRouteSource needs the agent's name (what a ModelRoute's appliesTo matches)")
        self.agent = agent
        self._host_opts: dict[str, Any] = {"timeout": timeout, "stream": stream, "stall_timeout": stall_timeout}
        super().__init__(url, namespaces=namespaces, prefix=prefix, heartbeat=heartbeat,
                         socket_timeout=socket_timeout, connect_timeout=connect_timeout)

    def _initial_state(self) -> None:
        self._route: Route | None = None
        self._why = f"{self.describe()} has not been read yet"
        self.problems: tuple[str, ...] = ()
        self._docs: tuple[tuple[str, str], ...] | None = None

    def __repr__(self) -> str:
        return f"{self.describe()[:-1]}, agent={self.agent})"

    # ------------------------------------------------------------------ hot path
    def route(self) -> Route:
        """The route in force for the agent (no I/O; starts the watcher on first use).
        Raises ``RoutingUnavailable`` naming why there is none."""
        if not self.running:
            self.start()
        r = self._route
        if r is None:
            raise RoutingUnavailable(f"no route for agent {self.agent}: {self._why}; the router refuses every call",
                                     store=self.describe())
        return r

    def applied(self) -> tuple[AppliedRef, ...]:
        """The ModelRoute in force, as the heartbeat acknowledges it (empty: none)."""
        r = self._route
        return () if r is None or r.id is None else (AppliedRef(r.id, r.uid, r.generation),)

    def status(self) -> dict[str, Any]:
        """The source's state (JSON): the route in force, or why there is none."""
        r = self._route
        return {"source": self.describe(), "agent": self.agent, "route": None if r is None else r.to_doc(),
                "hosts": [] if r is None else [h.name for h in r.hosts], "problem": None if r else self._why,
                "problems": list(self.problems), "reloads": self.reloads, "last_error": self.last_error,
                "connected": self.connected, "data_lost": self.data_lost is not None}

    # ------------------------------------------------------------------ reader hooks
    def _apply(self, docs: Sequence[tuple[str, Any]]) -> None:
        raw_docs = tuple((i, r.decode() if isinstance(r, bytes) else str(r)) for i, r in docs)
        if raw_docs == self._docs and self._route is not None:
            return
        routes: list[Route] = []
        problems: list[str] = []
        for id_, raw in raw_docs:
            try:
                doc = json.loads(raw)
                if not isinstance(doc, dict):
                    raise ValueError("not a JSON object")
                route = Route.from_document({"id": id_, **doc}, **self._host_opts)
            except (ValueError, ConfigurationError) as exc:
                problems.append(f"{id_}: unreadable ModelRoute ({exc}) (skipped)")
                continue
            if route.applies_to is None or any(fnmatch.fnmatchcase(self.agent, g) for g in route.applies_to):
                routes.append(route)
        chosen = routes[0] if routes else None
        problems += [f"{r.id} also applies to agent {self.agent}; {chosen.id} is in force (the first by name)"
                     for r in routes[1:] if chosen is not None]
        with self._lock:
            self._docs = raw_docs
            self._route = chosen
            ns = ", ".join(sorted(self.namespaces)) if self.namespaces else "any namespace"
            self._why = "" if chosen else f"no ModelRoute in {ns} applies to agent {self.agent}"
            changed = tuple(problems) != self.problems
            self.problems = tuple(problems)
        if changed:
            for p in problems:
                log.warning("%s: %s", self.describe(), p)

    def _on_lost(self, error: str, first: bool) -> None:
        if self._route is None:
            self._why = f"{self.describe()} is unreachable ({error}) and no route has been read"
        if first:
            log.warning("%s lost (%s): the last route read keeps deciding", self.describe(), error)
