"""``HeartbeatWriter``: one thread per agent process keeping its heartbeat fresh.

    writer = HeartbeatWriter(url, namespace="payments", agent="payments-agent", state=read_state)
    writer.start()            # a heartbeat now, then every ``interval`` seconds
    writer.poke()             # something applied changed: write (and notify) now
    writer.close()            # removes the heartbeat: a clean exit is not a lagging agent

``state()`` returns an ``AppliedState``: what the controls of this process have applied
(the wiring module builds it from the kill switch, the SagaPolicy reader and the limit
source). The writer never decides anything: it reports.

Invariants:
- One Lua script per beat: the document (``PX ttl``), its index entry in its bucket
  (score: expiry in epoch ms; also in the unbucketed index while no operator that reads
  the buckets says so, for an operator of the previous release) and, only when the
  applied state differs from the last beat's, the notification on
  ``P:v1:agents:events`` — so the operator hears about an applied change at once and a
  refresh costs it nothing.
- ``ttl`` is ``3 × interval`` by default: a process that stops beating (SIGKILL, a hung
  loop, a lost network) drops out of every status within ``ttl`` seconds.
- A failed beat is logged once per outage and retried at the next tick; it never raises
  into the agent (the heartbeat is a report, the controls fail closed on their own).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._identity import process_identity
from .._redis import RedisStore
from ..errors import ConfigurationError
from ._model import (
    AGENTS_CHANNEL,
    AppliedRef,
    Heartbeat,
    Posture,
    RefusalCount,
    heartbeat_buckets_key,
    heartbeat_index_key,
    heartbeat_key,
    heartbeat_legacy_index_key,
)

__all__ = ["AppliedState", "HeartbeatWriter", "pod_name"]

log = logging.getLogger("agent_saga.heartbeat")

DEFAULT_INTERVAL = 2.0


@dataclass(frozen=True, slots=True)
class AppliedState:
    """What this process enforces now (``None``: that control is not wired)."""

    rev: str | None = None
    posture: Posture = "unknown"
    killswitches: tuple[AppliedRef, ...] | None = None
    policies: tuple[AppliedRef, ...] | None = None
    limits: tuple[AppliedRef, ...] | None = None
    routes: tuple[AppliedRef, ...] | None = None
    #: What each BudgetLimit / SagaPolicy made this process refuse or hold (``_refusals``).
    refusals: tuple[RefusalCount, ...] | None = None


def pod_name(pod: str | None = None) -> str:
    """This process's pod: ``pod``, else ``$POD_NAME``, else the host name (without "/").
    With the namespace it is the agent's identity: its heartbeat, its part of the limit
    windows, its Redis user (``agent-saga acl agent --agent <namespace>/<pod>``)."""
    return process_identity(pod).pod.replace("/", "-")


def _runtime_version() -> str:
    try:
        from importlib.metadata import version

        return f"agent-saga {version('agent-saga')}"
    except Exception:  # noqa: BLE001 - not installed as a distribution (a checkout)
        return "agent-saga"


class HeartbeatWriter(RedisStore):
    """Keeps this process's heartbeat in the policy plane (see the module doc). Its client
    (its own or the agent's shared one), scripts, cluster guard and connection are
    ``agent_saga._redis.RedisStore``'s; a failed beat raises ``ConnectionError``."""

    NAME = "HeartbeatWriter"
    FEATURE = "the agent heartbeat"

    # KEYS[1] the heartbeat   KEYS[2] its index bucket   KEYS[3] the unbucketed index
    # KEYS[4] the "an operator reads the buckets" marker
    # ARGV[1] "<ns>/<instance>"   ARGV[2] the document   ARGV[3] ttl (ms)   ARGV[4] expiry (epoch ms)
    # ARGV[5] the channel   ARGV[6] "1": the applied state changed, notify
    LUA_BEAT = """
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
if redis.call('EXISTS', KEYS[4]) == 0 then redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1]) end
if ARGV[6] == '1' then
  redis.call('PUBLISH', ARGV[5], '{"v":1,"kind":"AgentHeartbeat","id":' .. cjson.encode(ARGV[1]) .. ',"op":"put"}')
end
return 1
"""
    # KEYS as LUA_BEAT; ARGV[1] the id, ARGV[2] the channel
    LUA_GONE = """
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[2], '{"v":1,"kind":"AgentHeartbeat","id":' .. cjson.encode(ARGV[1]) .. ',"op":"delete"}')
return 1
"""

    def __init__(
        self,
        url: str,
        *,
        namespace: str,
        agent: str,
        state: Callable[[], AppliedState],
        prefix: str = "agentsaga:v1",
        interval: float = DEFAULT_INTERVAL,
        ttl: float | None = None,
        pod: str | None = None,
        namespaces: tuple[str, ...] | None = None,
        socket_timeout: float = 1.0,
    ) -> None:
        self._open(url, socket_timeout=socket_timeout, connect_timeout=socket_timeout, prefix=prefix)
        if not namespace or "/" in namespace:
            raise ConfigurationError(f"HeartbeatWriter namespace must be a Kubernetes namespace, got {namespace!r}")
        if not 0 < interval < math.inf:
            raise ConfigurationError(f"heartbeat interval must be a positive number of seconds, got {interval!r}")
        self.namespace = namespace
        self.agent = agent
        self.prefix = prefix
        self.interval = float(interval)
        self.ttl = float(ttl) if ttl is not None else 3 * self.interval
        if self.ttl <= self.interval:
            raise ConfigurationError(f"heartbeat ttl ({self.ttl}s) must exceed its interval ({self.interval}s)")
        self.pod = pod_name(pod)
        self.namespaces = namespaces or (namespace,)
        self._state = state
        self._started = time.time()
        self._runtime = _runtime_version()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_applied: dict[str, Any] | None = None
        self._failing = False
        self.beats = 0
        self.last_error: str | None = None

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.pod}.{os.getpid()}"

    def describe(self) -> str:
        """``HeartbeatWriter(<url without password>, <id>)``."""
        return f"HeartbeatWriter({self._target.where}, {self.id})"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Beat now (blocking; raises ``ConnectionError`` if Redis cannot be reached), then
        every ``interval`` from a daemon thread (idempotent)."""
        if self._thread is not None:
            return
        self.beat()
        self._stop.clear()
        thread = threading.Thread(target=self._run, name="agent-saga-heartbeat", daemon=True)
        self._thread = thread
        thread.start()

    def poke(self) -> None:
        """Something this process applied may have changed: beat now if it did (from the
        writer's thread; a poke that changes nothing writes nothing)."""
        self._wake.set()

    def close(self) -> None:
        """Stop beating and remove the heartbeat (a clean exit is not a lagging agent)."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5 + self._socket_timeout)
        try:
            client = self._main_client()
            self._script(client, self.LUA_GONE)(
                keys=self._keys(self.id), args=[self.id, f"{self.prefix}:{AGENTS_CHANNEL}"], client=client)
        except Exception as exc:  # noqa: BLE001 - it expires on its own within ttl
            log.info("%s: could not remove the heartbeat (%s); it expires within %gs", self.describe(),
                     type(exc).__name__, self.ttl)
        finally:
            self._disconnect()

    # ------------------------------------------------------------------ beating
    def heartbeat(self) -> Heartbeat:
        """The heartbeat this process would write now."""
        s = self._state()
        return Heartbeat(
            namespace=self.namespace, agent=self.agent, pod=self.pod, pid=os.getpid(), ts=time.time(),
            ttl=self.ttl, started_at=self._started, namespaces=self.namespaces, rev=s.rev, posture=s.posture,
            killswitches=s.killswitches, policies=s.policies, limits=s.limits, runtime=self._runtime,
            routes=s.routes, refusals=s.refusals,
        )

    def beat(self) -> bool:
        """Write the heartbeat now; True if the applied state changed (and was notified).
        Raises ``ConnectionError`` naming the store."""
        hb = self.heartbeat()
        applied = hb.applied()
        changed = applied != self._last_applied
        try:
            client = self._main_client()
            self._script(client, self.LUA_BEAT)(
                keys=self._keys(hb.id),
                args=[hb.id, hb.to_json(), int(self.ttl * 1000), int((hb.ts + self.ttl) * 1000),
                      f"{self.prefix}:{AGENTS_CHANNEL}", "1" if changed else "0"],
                client=client)
        except Exception as exc:
            self._disconnect()
            self.last_error = self._scrub(f"{type(exc).__name__}: {exc}")
            raise ConnectionError(f"{self.describe()} could not write the heartbeat ({self.last_error})") from exc
        self._last_applied = applied
        self.beats += 1
        self.last_error = None
        return changed

    def _keys(self, id_: str) -> list[str]:
        """The beat's and the goodbye's keys (``LUA_BEAT``)."""
        return [heartbeat_key(self.prefix, id_), heartbeat_index_key(self.prefix, f"{self.namespace}/{self.pod}"),
                heartbeat_legacy_index_key(self.prefix), heartbeat_buckets_key(self.prefix)]

    def _run(self) -> None:
        due = time.monotonic() + self.interval
        while not self._stop.is_set():
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if time.monotonic() < due and self.heartbeat().applied() == self._last_applied:
                    continue  # poked, but nothing this process applied changed: no write
                self.beat()
                due = time.monotonic() + self.interval
                if self._failing:
                    log.warning("%s: heartbeats are written again", self.describe())
                self._failing = False
            except ConnectionError as exc:
                if not self._failing:
                    log.warning("%s; the operator will count this process as gone after %gs", exc, self.ttl)
                self._failing = True
                due = time.monotonic() + self.interval
            except Exception as exc:  # noqa: BLE001 - a broken state reader must not kill the thread
                log.exception("%s: the applied state could not be read (%s)", self.describe(), exc)
                due = time.monotonic() + self.interval

    def _disconnect(self) -> None:
        if self._shared is None:  # a broken connection leaves the shared pool on its own
            RedisStore.close(self)
