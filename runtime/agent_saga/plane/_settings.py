"""One setting wires an agent pod: the policy plane's URL, the namespace, the identity.

    AGENT_SAGA_REDIS_URL    redis://:PASSWORD@redis:6379/0   the policy plane (what the chart hands agent pods)
    AGENT_SAGA_NAMESPACE    payments      whose KillSwitches, BudgetLimits, SagaPolicies apply
                                          (default: $POD_NAMESPACE)
    AGENT_SAGA_AGENT        payments-agent   this agent's name: what a SagaPolicy's appliesTo
                                          matches and what status names (default: the host name)
    AGENT_SAGA_SWITCH_GRACE 30            seconds the kill switch honours its last known levers
                                          while the plane is unreachable, then fails closed
    AGENT_SAGA_WAL_STREAM   agent-saga:wal   optional: the process-wide WAL is a RedisWAL on
                                          the plane under this key (recoveryd reads it)
    AGENT_SAGA_WAL_MIN_REPLICAS 0         with the WAL stream: replicas that must acknowledge
                                          each batch (WAIT) before it counts as durable
    AGENT_SAGA_KEY_PREFIX   agentsaga     the policy plane's key prefix (as the operator's)
    AGENT_SAGA_HEARTBEAT_INTERVAL 2       seconds between heartbeats
    AGENT_SAGA_PLANE_CHECK_INTERVAL 0.5   seconds between the agent's checks that what it holds
                                          of the plane is current (one GET of its rev): a lost
                                          notification is healed, and a silent loss of the
                                          plane seen, within this (three of them)

``PlaneSettings.from_env()`` reads them (``None`` when the URL is not set: the embedded,
zero-dependency default stays as it is). ``choose_store`` is how the CLI finds the store
a command reads — the same settings an agent uses, and it always says which one it took.

Invariants:
- Bad values are refused with ``ConfigurationError`` naming the variable and the fix;
  a URL without a namespace is refused (the agent would read nobody's policy).
- No silent fallback: a store that was not configured is never replaced by a local one
  that does not exist; a local default that exists is used only when named as such.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .._identity import process_identity
from ..errors import ConfigurationError

__all__ = [
    "DEFAULT_GRACE",
    "ENV_AGENT",
    "ENV_NAMESPACE",
    "ENV_REDIS_URL",
    "PlaneSettings",
    "StoreChoice",
    "choose_store",
]

ENV_REDIS_URL = "AGENT_SAGA_REDIS_URL"
ENV_NAMESPACE = "AGENT_SAGA_NAMESPACE"
ENV_AGENT = "AGENT_SAGA_AGENT"
ENV_GRACE = "AGENT_SAGA_SWITCH_GRACE"
ENV_WAL_STREAM = "AGENT_SAGA_WAL_STREAM"
ENV_WAL_MIN_REPLICAS = "AGENT_SAGA_WAL_MIN_REPLICAS"
ENV_KEY_PREFIX = "AGENT_SAGA_KEY_PREFIX"
ENV_HEARTBEAT = "AGENT_SAGA_HEARTBEAT_INTERVAL"
ENV_CHECK = "AGENT_SAGA_PLANE_CHECK_INTERVAL"

#: The kill switch's grace window when the plane is wired by ``AGENT_SAGA_REDIS_URL``
#: and ``AGENT_SAGA_SWITCH_GRACE`` is not set (docs/killswitch.md).
DEFAULT_GRACE = 30.0
DEFAULT_HEARTBEAT = 2.0
#: Seconds between an agent's checks of the plane's rev (its kill switch, SagaPolicy,
#: BudgetLimit and ModelRoute readers share them), and the most that can be asked.
DEFAULT_CHECK = 0.5
MAX_CHECK = 60.0

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_AGENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$")
_SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://", "rediss+sentinel://", "redis+cluster://",
            "rediss+cluster://")


def _seconds(env: Mapping[str, str], name: str, default: float, *, zero_ok: bool, most: float = math.inf) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"{name}={text!r} must be a number of seconds") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ConfigurationError(f"{name}={text!r} must be a {'non-negative' if zero_ok else 'positive'} "
                                 f"number of seconds")
    if value > most:
        raise ConfigurationError(f"{name}={text!r} is more than {most:g} seconds: set at most {most:g} (default "
                                 f"{default:g})")
    return value


def check_namespace(namespace: str, *, what: str = ENV_NAMESPACE) -> str:
    if not _NAMESPACE.match(namespace) or len(namespace) > 63:
        raise ConfigurationError(f"{what}={namespace!r} is not a Kubernetes namespace name (lower-case letters, "
                                 f"digits and '-', at most 63): set it to the namespace of your KillSwitches and "
                                 f"SagaPolicies")
    return namespace


def check_agent(agent: str, *, what: str = ENV_AGENT) -> str:
    if not _AGENT.match(agent) or len(agent) > 253:
        raise ConfigurationError(f"{what}={agent!r} is not an agent name (letters, digits and _ . : -; what a "
                                 f"SagaPolicy's appliesTo matches)")
    return agent


@dataclass(frozen=True, slots=True)
class PlaneSettings:
    """How this process reaches the policy plane (see the module doc)."""

    url: str
    namespace: str
    agent: str
    grace: float = DEFAULT_GRACE
    key_prefix: str = "agentsaga"
    heartbeat_interval: float = DEFAULT_HEARTBEAT
    check_interval: float = DEFAULT_CHECK
    wal_key: str | None = None
    wal_min_replicas: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(_SCHEMES):
            raise ConfigurationError(f"the policy plane's URL must be redis://HOST:PORT/DB (or rediss://, unix://, redis+sentinel://, redis+cluster://), "
                                     f"got {self.url!r}")
        check_namespace(self.namespace, what="namespace")
        check_agent(self.agent, what="agent")
        check = self.check_interval
        if isinstance(check, bool) or not isinstance(check, int | float) or not 0 < check <= MAX_CHECK:
            raise ConfigurationError(f"check_interval must be a number of seconds above 0 and at most {MAX_CHECK:g} "
                                     f"(how late a lost change notification may land), got {check!r}")

    @property
    def prefix(self) -> str:
        """The key prefix with the schema segment: ``agentsaga:v1``."""
        return f"{self.key_prefix}:v1"

    def describe(self) -> str:
        from ..wal.urls import redact

        return f"policy plane {redact(self.url)}, namespace {self.namespace}, agent {self.agent}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PlaneSettings | None:
        """The settings in the environment, or ``None`` when ``AGENT_SAGA_REDIS_URL`` is
        not set. Raises ``ConfigurationError`` naming the variable to fix."""
        env = os.environ if env is None else env
        url = env.get(ENV_REDIS_URL, "").strip()
        if not url:
            return None
        if not url.startswith(_SCHEMES):
            raise ConfigurationError(f"{ENV_REDIS_URL} must be redis://HOST:PORT/DB (or rediss://, unix://, redis+sentinel://, redis+cluster://), got a "
                                     f"value starting {url[:12]!r}")
        namespace = (env.get(ENV_NAMESPACE) or env.get("POD_NAMESPACE") or "").strip()
        if not namespace:
            raise ConfigurationError(
                f"{ENV_REDIS_URL} is set but no namespace: set {ENV_NAMESPACE} to the Kubernetes namespace whose "
                f"KillSwitches, BudgetLimits and SagaPolicies govern this agent (in a pod: valueFrom.fieldRef "
                f"metadata.namespace)")
        check_namespace(namespace, what=ENV_NAMESPACE if env.get(ENV_NAMESPACE) else "POD_NAMESPACE")
        agent = (env.get(ENV_AGENT) or "").strip() or process_identity().short_host
        check_agent(agent, what=ENV_AGENT if env.get(ENV_AGENT) else "the host name (set AGENT_SAGA_AGENT)")
        prefix = (env.get(ENV_KEY_PREFIX) or "agentsaga").strip()
        if not prefix or any(c.isspace() for c in prefix):
            raise ConfigurationError(f"{ENV_KEY_PREFIX}={prefix!r} must be a key prefix without spaces")
        wal_key = (env.get(ENV_WAL_STREAM) or "").strip() or None
        replicas = (env.get(ENV_WAL_MIN_REPLICAS) or "0").strip()
        if not replicas.isdigit():
            raise ConfigurationError(f"{ENV_WAL_MIN_REPLICAS}={replicas!r} must be a whole number >= 0: the replicas "
                                     f"that must acknowledge each WAL batch (WAIT) before it counts as durable")
        return cls(url, namespace, agent, grace=_seconds(env, ENV_GRACE, DEFAULT_GRACE, zero_ok=True),
                   key_prefix=prefix, heartbeat_interval=_seconds(env, ENV_HEARTBEAT, DEFAULT_HEARTBEAT, zero_ok=False),
                   check_interval=_seconds(env, ENV_CHECK, DEFAULT_CHECK, zero_ok=False, most=MAX_CHECK),
                   wal_key=wal_key, wal_min_replicas=int(replicas))


@dataclass(frozen=True, slots=True)
class StoreChoice:
    """The store a command reads and why: ``source`` is ``--store``, ``$VARIABLE`` or the
    local default; ``target`` is ``None`` when nothing is configured."""

    target: str | None
    source: str

    @property
    def from_plane(self) -> bool:
        return self.source == f"${ENV_REDIS_URL}"

    def describe(self) -> str:
        from ..wal.urls import redact

        if self.target is None:
            return "none configured"
        return f"{redact(self.target)} (from {self.source})"


def choose_store(explicit: str | None, specific: str, *, env: Mapping[str, str] | None = None,
                 local_default: str | None = None) -> StoreChoice:
    """Which store a CLI command reads: ``--store``, else ``$<specific>``, else the policy
    plane (``$AGENT_SAGA_REDIS_URL``, what agents use), else ``local_default`` if it
    exists on disk, else nothing (the caller says how to configure one)."""
    env = os.environ if env is None else env
    if explicit and explicit.strip():
        return StoreChoice(explicit.strip(), "--store")
    value = env.get(specific, "").strip()
    if value:
        return StoreChoice(value, f"${specific}")
    value = env.get(ENV_REDIS_URL, "").strip()
    if value:
        return StoreChoice(value, f"${ENV_REDIS_URL}")
    if local_default is not None and os.path.exists(local_default):
        return StoreChoice(local_default, f"the local default ./{local_default}: no store configured")
    return StoreChoice(None, "nothing")
