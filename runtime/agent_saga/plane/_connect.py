"""Connecting a process to the policy plane: every control, from one setting or one call.

    # the environment (what the chart hands agent pods):
    AGENT_SAGA_REDIS_URL=redis://... AGENT_SAGA_NAMESPACE=payments AGENT_SAGA_AGENT=payments-agent
    kit = AgentKit(name="payments-agent")          # or PreFlightGate(): wired on first use

    # or one explicit call:
    connect_policy_plane("redis://...", namespace="payments", agent="payments-agent")

What it builds and makes the process-wide default (what ``PreFlightGate()`` uses when not
told otherwise):

    kill switch     KillSwitch(RedisSwitchStore(url, grace, namespaces=[ns]))   set_kill_switch
    limits          RedisLimitStore(url) for the spend, RedisLimitSource(url, [ns]) for
                    the BudgetLimit definitions                  set_limit_store / set_limit_source
    approvals       ApprovalGateway(RedisApprovalStore(url), namespace, agent)   set_approval_provider
    SagaPolicy      RedisPolicySource(url, agent, [ns], grace)                   set_policy_source
    WAL (optional)  RedisWAL(url, key=AGENT_SAGA_WAL_STREAM, identity=NS/POD)   set_default_wal
    heartbeat       HeartbeatWriter: what this process applied, and what each BudgetLimit
                    and SagaPolicy made its gate refuse, for the operator's status
    ModelRoute      RedisRouteSource(url, agent, [ns]), only once a router asks for it
                    (``plane_router()``): a process without a router acknowledges no route

Invariants:
- A half-configured agent does not start: the URL set but Redis not answering, or a
  namespace no operator on this plane serves, raises ``ConfigurationError`` naming the
  fix, before any control is installed.
- Connecting twice with the same settings returns the same connection; with other
  settings it is refused (a process reads one policy plane).
- Every reader tells the heartbeat when it applied something, so the operator's
  ``Acknowledged`` follows within milliseconds.
- The heartbeat's posture is ``closed`` while the kill switch or the SagaPolicy reader
  refuses everything, or while the process's WAL has failed (every saga is refused then).
- A failed RedisWAL is replaced, once Redis answers again, by a new writer (a new chain
  in the same log, as recoveryd does), and only when every record's outcome is known
  (``RedisWAL.settle``: the batch in doubt is read back). Sagas that held the failed
  writer stay failed; the next saga writes to the new one. Checked at every heartbeat.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .._identity import process_identity
from ..errors import ConfigurationError
from ..heartbeat import (
    AppliedRef,
    AppliedState,
    HeartbeatWriter,
    refusal_ledger,
    served_namespaces_key,
)
from ..wal.writers import local_identity
from ._settings import ENV_NAMESPACE, ENV_REDIS_URL, PlaneSettings

if TYPE_CHECKING:
    from ..wal.base import BaseWAL
    from ..wal.redis import RedisWAL

__all__ = ["PlaneConnection", "connect_policy_plane", "disconnect_policy_plane", "get_plane", "open_plane",
           "plane_from_env", "plane_router"]

log = logging.getLogger("agent_saga.plane")

#: Seconds an approval request waits for a human when the wiring builds the gateway.
DEFAULT_APPROVAL_TIMEOUT = 900.0


@dataclass
class PlaneConnection:
    """The controls of this process, connected to one policy plane."""

    settings: PlaneSettings
    switch_store: Any
    kill_switch: Any
    limit_store: Any
    limit_source: Any
    approval_store: Any
    approvals: Any
    policy: Any
    heartbeat: HeartbeatWriter | None = None
    wal: Any = None
    routes: Any = None
    #: The Redis connections its controls share (``agent_saga._shared``): one client per
    #: URL and timeouts, one pub/sub connection.
    shared: Any = None
    _previous: dict[str, Any] = field(default_factory=dict)
    #: Why the failed WAL is not replaced yet (None: it is healthy, or was replaced).
    wal_recovery: str | None = None
    _wal_unsettled: str | None = None
    _reopening: threading.Lock = field(default_factory=threading.Lock)

    def describe(self) -> str:
        return self.settings.describe()

    def state(self) -> AppliedState:
        """What this process enforces now (its heartbeat)."""
        self.reopen_wal()
        now = time.time()
        sv = self.switch_store.view()
        pv = self.policy.view()
        posture: Literal["ok", "degraded", "closed"]
        if not sv.usable or not pv.usable or self.wal_failed():
            posture = "closed"
        elif sv.degraded or pv.degraded:
            posture = "degraded"
        else:
            posture = "ok"
        levers = tuple(AppliedRef(lv.id, lv.uid, lv.generation) for lv in sv.levers if not lv.expired(now))
        policies = tuple(AppliedRef(p.id, p.uid, p.generation) for p in pv.policies.policies)
        limits = tuple(AppliedRef(i, u, g) for i, u, g in self.limit_source.snapshot().documents)
        rev = self.policy.applied_rev or self.switch_store.applied_rev
        routes = None if self.routes is None else self.routes.applied()
        return AppliedState(rev=rev, posture=posture, killswitches=levers, policies=policies, limits=limits,
                            routes=routes, refusals=refusal_ledger().snapshot())

    def wal_failed(self) -> bool:
        """Has the WAL this process writes its sagas to failed (a failed WAL refuses every
        saga: it stays failed, e.g. after Redis lost records it had acknowledged)? The
        connection's RedisWAL, else the process-wide WAL once one exists; a WAL whose
        state cannot be read counts as failed."""
        from ..wal.default import made_default_wal

        wal = self.wal if self.wal is not None else made_default_wal()
        try:
            return wal is not None and wal.stats().failed is not None
        except Exception:  # noqa: BLE001 - an unreadable WAL is not a healthy one
            return True

    def reopen_wal(self) -> bool:
        """Replace the connection's failed RedisWAL with a new writer once Redis answers
        and every record's outcome is known (see the module doc); True if it did. Sets
        ``wal_recovery`` to why not while it cannot; never raises."""
        if not self._reopening.acquire(blocking=False):
            return False  # another thread is at it (the heartbeat's, a status read)
        try:
            return self._reopen_wal()
        finally:
            self._reopening.release()

    def _reopen_wal(self) -> bool:
        old = self.wal
        if old is None or old.stats().failed is None:
            self.wal_recovery = None
            return False
        from ..errors import SagaError
        from ..wal import set_default_wal
        from ..wal.default import made_default_wal

        try:
            why = old.settle()
        except SagaError as exc:
            self.wal_recovery = f"waiting for Redis: {exc}"
            return False
        if why is not None:
            self.wal_recovery = f"fail-stop: a record is in doubt: {why}"
            if why != self._wal_unsettled:
                log.error("WAL %s stays failed: %s", old.name, why)
                self._wal_unsettled = why
            return False
        s = self.settings
        if not s.wal_key:
            return False
        try:
            new = open_plane_wal(s, s.wal_key)
        except SagaError as exc:
            self.wal_recovery = f"waiting for Redis: {exc}"
            return False
        with _lock:
            self.wal = new
            if made_default_wal() is old:
                set_default_wal(new)
        with contextlib.suppress(Exception):
            old.close(timeout=0)  # failed: it raises what it failed with
        log.warning("WAL %s had failed (%s); every record's outcome is known: sagas now write to %s",
                    old.name, old.stats().failed, new.name)
        self.wal_recovery = None
        self._wal_unsettled = None
        return True

    def gate(self) -> Any:
        """A ``PreFlightGate`` over this connection's own controls (its kill switch, limits,
        approvals and SagaPolicy reader), whatever the process defaults are."""
        from ..controls import PreFlightGate

        return PreFlightGate(limits=self.limit_source, approval_provider=self.approvals, store=self.limit_store,
                             checks=[self.kill_switch], policy=self.policy)

    def route_source(self, *, timeout: float = 60.0, stream: bool = False, stall_timeout: float = 10.0) -> Any:
        """The ``RedisRouteSource`` of this agent (made and started on first use; later
        calls return it): from then on the heartbeat acknowledges the ModelRoute it routes by."""
        with _lock:
            if self.routes is None:
                from ..routing import RedisRouteSource

                s = self.settings
                src = RedisRouteSource(s.url, agent=s.agent, namespaces=[s.namespace], prefix=s.prefix,
                                       heartbeat=s.check_interval, timeout=timeout, stream=stream,
                                       stall_timeout=stall_timeout)
                if self.shared is not None:
                    src.share_connections(self.shared)
                src.start()
                if self.heartbeat is not None:
                    src.add_listener(self.heartbeat.poke)
                self.routes = src
                if self.heartbeat is not None:
                    self.heartbeat.poke()
            return self.routes

    def close(self) -> None:
        """Stop the readers and the heartbeat; restore the defaults found at connect."""
        if self.heartbeat is not None:
            self.heartbeat.close()
        _restore(self._previous)
        for c in (self.policy, self.limit_source, self.switch_store, self.routes):
            if c is None:
                continue
            with contextlib.suppress(Exception):
                c.close()
        for c in (self.approval_store, self.shared):
            if c is None:
                continue
            with contextlib.suppress(Exception):
                c.close()


_lock = threading.RLock()
_current: PlaneConnection | None = None
_env_checked = False


def get_plane() -> PlaneConnection | None:
    """The connection made by ``connect_policy_plane`` or the environment, or ``None``."""
    return _current


def plane_from_env() -> PlaneConnection | None:
    """Connect from ``AGENT_SAGA_REDIS_URL`` (once per process); ``None`` when it is not
    set. Raises ``ConfigurationError`` for a half-configured agent."""
    global _env_checked
    if _env_checked:
        return _current
    with _lock:
        if _env_checked:
            return _current
        settings = PlaneSettings.from_env()
        conn = _current if settings is None else connect_policy_plane(settings=settings)
        _env_checked = True
        return conn


def connect_policy_plane(
    url: str | None = None,
    *,
    namespace: str | None = None,
    agent: str | None = None,
    grace: float | None = None,
    wal_key: str | None = None,
    settings: PlaneSettings | None = None,
    heartbeat: bool = True,
) -> PlaneConnection:
    """Wire every control of this process to the policy plane (see the module doc): the
    same as setting ``AGENT_SAGA_REDIS_URL``, ``AGENT_SAGA_NAMESPACE``, ``AGENT_SAGA_AGENT``.
    Raises ``ConfigurationError`` naming the fix when Redis does not answer or no
    operator serves the namespace."""
    global _current
    if settings is None:
        if not url or not namespace:
            raise ConfigurationError("connect_policy_plane needs the policy plane's url= and the namespace= whose "
                                     "KillSwitches, BudgetLimits and SagaPolicies govern this agent")
        from ._settings import DEFAULT_GRACE

        settings = PlaneSettings(url, namespace, agent or process_identity().short_host,
                                 grace=DEFAULT_GRACE if grace is None else float(grace), wal_key=wal_key)
    with _lock:
        if _current is not None:
            if _current.settings == settings:
                return _current
            raise ConfigurationError(f"this process is already connected to the {_current.describe()}; one process "
                                     f"reads one policy plane (disconnect_policy_plane() first)")
        _check_reachable(settings)
        conn = _build(settings, heartbeat)
        _current = conn
    log.info("agent-saga: connected to the %s (kill switch grace %gs)", settings.describe(), settings.grace)
    return conn


def plane_router(*, timeout: float = 60.0, stream: bool = False, stall_timeout: float = 10.0,
                 **router_options: Any) -> Any:
    """A ``Router`` over the ModelRoute that applies to this agent, read live from the
    policy plane this process is connected to (``connect_policy_plane`` or the
    environment); its decisions go to the process WAL. ``router_options`` are ``Router``'s
    (``breaker=``, ``count_tokens=``). Raises ``ConfigurationError`` when not connected."""
    from ..routing import Router
    from ..wal.default import DEFAULT_WAL

    conn = get_plane() or plane_from_env()
    if conn is None:
        raise ConfigurationError(f"plane_router() reads ModelRoutes from the policy plane: set {ENV_REDIS_URL} (and "
                                 f"{ENV_NAMESPACE}) or call connect_policy_plane(...) first; or build "
                                 f"Router(Route([...])) in code")
    source = conn.route_source(timeout=timeout, stream=stream, stall_timeout=stall_timeout)
    router_options.setdefault("wal", conn.wal or DEFAULT_WAL)
    return Router(source, timeout=timeout, **router_options)


def open_plane(env: Mapping[str, str], *, wal: BaseWAL | None = None, heartbeat: bool = True) -> PlaneConnection:
    """One agent's controls, wired from ``env`` exactly as a pod is from its environment
    (``AGENT_SAGA_REDIS_URL``, ``AGENT_SAGA_NAMESPACE``, ``AGENT_SAGA_AGENT``, ``POD_NAME``,
    ...), but NOT made the process defaults: a process hosting many agents (the fleet
    simulator, ``bench/fleet``) gives each its own kill switch reader, limits, approval
    gateway, SagaPolicy reader and heartbeat, and calls ``close()`` on each. ``gate()`` is
    a ``PreFlightGate`` over them; ``wal`` is where the kill switch and the approval
    gateway record (default: the process WAL; with ``AGENT_SAGA_WAL_STREAM`` in ``env``
    it must be given). Raises ``ConfigurationError`` as ``connect_policy_plane`` does, or
    when ``AGENT_SAGA_REDIS_URL`` is not in ``env``."""
    settings = PlaneSettings.from_env(env)
    if settings is None:
        raise ConfigurationError(f"open_plane needs {ENV_REDIS_URL} in the environment it is given")
    if settings.wal_key and wal is None:
        raise ConfigurationError(f"open_plane does not open the process WAL that AGENT_SAGA_WAL_STREAM="
                                 f"{settings.wal_key} names (one process, many agents): pass wal=RedisWAL(...) "
                                 f"or another WAL, or leave AGENT_SAGA_WAL_STREAM out of the environment given")
    _check_reachable(settings)
    return _build(settings, heartbeat, install=False, pod=(env.get("POD_NAME") or "").strip() or None, wal=wal)


def disconnect_policy_plane() -> None:
    """Undo ``connect_policy_plane`` (tests, a process that switches planes)."""
    global _current, _env_checked
    with _lock:
        conn, _current = _current, None
        _env_checked = False
    if conn is not None:
        conn.close()


# ---------------------------------------------------------------------- building
def _check_reachable(s: PlaneSettings) -> None:
    from .._redis import Target, connect
    from ..wal.urls import redact

    client = connect(s.url, feature="the policy plane", socket_timeout=2.0, connect_timeout=2.0)
    try:
        try:
            client.ping()
            served = {m.decode() if isinstance(m, bytes) else str(m)
                      for m in client.smembers(served_namespaces_key(s.prefix))}
        except Exception as exc:
            raise ConfigurationError(
                f"{ENV_REDIS_URL}={redact(s.url)} does not answer ({Target.of(s.url).error_text(exc)}): start Redis "
                f"or fix the URL. The agent does not start half-connected: its kill switch, limits and SagaPolicies "
                f"would refuse every call") from None
    finally:
        with contextlib.suppress(Exception):
            client.close()
    if not served:
        log.warning("no operator has announced the namespaces it serves on %s (%s is empty): nothing projects "
                    "KillSwitches or SagaPolicies for namespace %s yet", redact(s.url),
                    served_namespaces_key(s.prefix), s.namespace)
    elif "*" not in served and s.namespace not in served:
        raise ConfigurationError(
            f"namespace {s.namespace!r} ({ENV_NAMESPACE}) is not served by any operator on this policy plane (they "
            f"serve {', '.join(sorted(served))}): set {ENV_NAMESPACE} to the namespace of this agent's KillSwitches "
            f"and SagaPolicies, or add {s.namespace} to the operator's --namespace (chart: operator.watchNamespaces)")



def open_plane_wal(s: PlaneSettings, key: str) -> RedisWAL:
    """The process-wide RedisWAL of a plane connection, first or reopened: its writer is
    this pod's identity's own (``local_identity``), the only stream an agent ACL user with
    ``--agent NS/POD --wal-key KEY`` may append to."""
    from ..wal.redis import RedisWAL

    return RedisWAL(s.url, key=key, identity=local_identity(s.namespace), wait_replicas=s.wal_min_replicas)


def _build(s: PlaneSettings, heartbeat: bool, *, install: bool = True, pod: str | None = None,
           wal: BaseWAL | None = None) -> PlaneConnection:
    """The controls of ``s``; ``install``: made the process defaults (``connect_policy_plane``),
    else this agent's own (``open_plane``: ``pod`` names it, ``wal`` is where it records)."""
    from .._shared import SharedConnections
    from ..controls.approvals import (
        ApprovalGateway,
        ApprovalPolicy,
        RedisApprovalStore,
        get_approval_provider,
        set_approval_provider,
    )
    from ..controls.killswitch import KillSwitch, RedisSwitchStore, get_kill_switch, set_kill_switch
    from ..controls.limits import (
        RedisLimitSource,
        RedisLimitStore,
        get_limit_source,
        peek_limit_store,
        set_limit_source,
        set_limit_store,
    )
    from ..controls.policy import RedisPolicySource, get_policy_source, set_policy_source
    from ..wal import set_default_wal
    from ..wal.default import DEFAULT_WAL

    ns = [s.namespace]
    previous: dict[str, Any] = {}
    plane_wal = None
    if s.wal_key and install:
        plane_wal = open_plane_wal(s, s.wal_key)
        previous["wal"] = set_default_wal(plane_wal)
    # the process WAL is chosen when first written: connecting creates no log file
    default_wal = DEFAULT_WAL if wal is None else wal
    # the readers' heartbeat is the agent's one plane check (its watcher ticks at the smallest)
    check = s.check_interval
    switch_store = RedisSwitchStore(s.url, grace=s.grace, namespaces=ns, prefix=s.prefix, heartbeat=check)
    switch = KillSwitch(switch_store, wal=default_wal)
    policy = RedisPolicySource(s.url, agent=s.agent, grace=s.grace, namespaces=ns, prefix=s.prefix, heartbeat=check)
    limit_source = RedisLimitSource(s.url, namespaces=ns, prefix=s.prefix, heartbeat=check)
    # This pod's own part of the limit windows and its own approval requests: an agent's
    # Redis user with --agent <ns>/<pod> may write only these.
    identity = local_identity(s.namespace, pod)
    limit_store = RedisLimitStore(s.url, part=identity)
    approval_store = RedisApprovalStore(s.url, prefix=s.prefix, owner=identity)
    approvals = ApprovalGateway(approval_store, wal=default_wal, policy=ApprovalPolicy(DEFAULT_APPROVAL_TIMEOUT),
                                namespace=s.namespace, agent=s.agent)
    # One client per URL and timeouts and one pub/sub connection for all of them (the
    # limit store's asyncio client is its own): a pod's connections do not grow per control.
    shared = SharedConnections()
    for c in (switch_store, policy, limit_source, approval_store):
        c.share_connections(shared)
    for reader in (switch_store, policy, limit_source):
        reader.start()
    if install:
        previous.update(switch=get_kill_switch(), limits=get_limit_source(), store=peek_limit_store(),
                        approvals=get_approval_provider(), policy=get_policy_source())
        set_kill_switch(switch)
        set_limit_store(limit_store)
        set_limit_source(limit_source)
        set_approval_provider(approvals)
        set_policy_source(policy)
    conn = PlaneConnection(s, switch_store, switch, limit_store, limit_source, approval_store, approvals, policy,
                           wal=plane_wal, shared=shared, _previous=previous)
    if heartbeat:
        writer = HeartbeatWriter(s.url, namespace=s.namespace, agent=s.agent, state=conn.state, prefix=s.prefix,
                                 interval=s.heartbeat_interval, pod=pod)
        writer.share_connections(shared)
        for reader in (switch_store, policy, limit_source):
            reader.add_listener(writer.poke)
        try:
            writer.start()
        except ConnectionError as exc:
            conn.close()
            raise ConfigurationError(f"{exc}: the agent's heartbeat could not be written; check the URL and the "
                                     f"Redis user's rights (docs/policy-plane.md, Access)") from None
        conn.heartbeat = writer
        if install:
            atexit.register(writer.close)
    return conn


def _restore(previous: dict[str, Any]) -> None:
    from ..controls.approvals import set_approval_provider
    from ..controls.killswitch import set_kill_switch
    from ..controls.limits import set_limit_source, set_limit_store
    from ..controls.policy import set_policy_source
    from ..wal import set_default_wal

    if not previous:
        return
    set_kill_switch(previous.get("switch"))
    set_limit_source(previous.get("limits"))
    set_limit_store(previous.get("store"))
    set_approval_provider(previous.get("approvals"))
    set_policy_source(previous.get("policy"))
    if "wal" in previous:
        set_default_wal(previous["wal"])
