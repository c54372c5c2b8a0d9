"""A kill-switch store from a URL or a path, and the process-wide kill switch.

``open_switch_store("redis://host:6379/0?grace=30")`` or ``open_switch_store(path)``;
``get_kill_switch()`` is the switch every ``PreFlightGate`` built without ``checks=``
consults: the one set with ``set_kill_switch``, else one over
``open_switch_store($AGENT_SAGA_SWITCH_STORE)`` made on first use, else (no policy plane
configured either) the zero-setup default: a ``FileSwitchStore`` at
``default_switch_path()``, beside the default WAL, which ``agent-saga halt`` writes when no
store is configured. It stops processes on this host only, and says so loudly.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping

from ..._backends import REDIS_SCHEMES, Address, Backends
from ...errors import ConfigurationError
from ._local import FileSwitchStore
from ._store import SwitchStore
from ._switch import KillSwitch

log = logging.getLogger("agent_saga.controls")

__all__ = [
    "DEFAULT_SWITCH_FILE",
    "ENV_SWITCH_GRACE",
    "SWITCH_STORES",
    "ENV_SWITCH_STORE",
    "default_switch_path",
    "get_kill_switch",
    "is_zero_setup",
    "open_switch_store",
    "set_kill_switch",
]

ENV_SWITCH_STORE = "AGENT_SAGA_SWITCH_STORE"
ENV_SWITCH_GRACE = "AGENT_SAGA_SWITCH_GRACE"
#: The zero-setup store's file name, in the directory of the default WAL.
DEFAULT_SWITCH_FILE = "agent-saga.switch.json"
_ENV_PLANE = "AGENT_SAGA_REDIS_URL"  # the policy plane configures the switch (agent_saga.plane)

_default_lock = threading.Lock()
_default: KillSwitch | None = None
_resolved = False
# Every zero-setup switch made (weakly held): restoring one with set_kill_switch keeps it one.
_zero_setup: weakref.WeakSet[KillSwitch] = weakref.WeakSet()


def set_kill_switch(switch: KillSwitch | None) -> KillSwitch | None:
    """Make ``switch`` the kill switch of every ``PreFlightGate`` built without
    ``checks=``; return the previous one. ``None`` goes back to ``$AGENT_SAGA_SWITCH_STORE``."""
    global _default, _resolved
    if switch is not None and not isinstance(switch, KillSwitch):
        raise ConfigurationError(f"set_kill_switch() takes a KillSwitch, got {switch!r}")
    with _default_lock:
        prev, _default, _resolved = _default, switch, switch is not None
    return prev


def default_switch_path(env: Mapping[str, str] | None = None) -> str:
    """Where the zero-setup kill switch lives: ``agent-saga.switch.json`` in the directory
    of the default WAL (``$AGENT_SAGA_WAL_PATH``, else ``./agent-saga.wal``)."""
    from ...wal.default import DEFAULT_WAL_PATH, ENV_WAL_PATH

    env = os.environ if env is None else env
    wal = env.get(ENV_WAL_PATH, "").strip() or DEFAULT_WAL_PATH
    return os.path.join(os.path.dirname(wal), DEFAULT_SWITCH_FILE)


def is_zero_setup(switch: object) -> bool:
    """True if ``switch`` is the zero-setup default (a file on this host, nothing configured)."""
    return isinstance(switch, KillSwitch) and switch in _zero_setup


def get_kill_switch() -> KillSwitch | None:
    """The process-wide kill switch: the one set with ``set_kill_switch``, else one over
    ``open_switch_store($AGENT_SAGA_SWITCH_STORE)`` made on first use, else the zero-setup
    ``FileSwitchStore`` at ``default_switch_path()`` (logged as a WARNING: it stops this
    host only). ``None`` only while the policy plane (``$AGENT_SAGA_REDIS_URL``) is about
    to set its own."""
    global _default, _resolved
    if _resolved:
        return _default
    with _default_lock:
        if not _resolved:
            target = os.environ.get(ENV_SWITCH_STORE, "").strip()
            if target:
                _default = KillSwitch(open_switch_store(target))
            elif os.environ.get(_ENV_PLANE, "").strip():
                _default = None  # the policy plane's connection sets its RedisSwitchStore
            else:
                path = default_switch_path()
                log.warning(
                    "no kill switch store configured: using the zero-setup default %s, which stops agents on "
                    "THIS HOST ONLY (`agent-saga halt` without --store writes it). For a fleet set %s to a "
                    "redis:// URL or connect the policy plane (%s).", os.path.abspath(path), ENV_SWITCH_STORE,
                    _ENV_PLANE)
                from ...wal.default import (
                    DEFAULT_WAL,  # who/why/when: the process-wide WAL, when one is seen
                )

                _default = KillSwitch(FileSwitchStore(path, warn=False), wal=DEFAULT_WAL)  # warned above
                _zero_setup.add(_default)
            _resolved = True
        return _default


#: The kill-switch stores, by scheme (``agent_saga._backends``).
SWITCH_STORES: Backends[SwitchStore] = Backends("kill switch store")


@SWITCH_STORES.register("file")
def _file(address: Address, *, grace: float | None = None, warn: bool = True) -> SwitchStore:
    # The grace for a lost or unreadable file: the argument, else the variable, else the
    # store's default.
    text = os.environ.get(ENV_SWITCH_GRACE, "").strip()
    if grace is None and text:
        try:
            grace = float(text)
        except ValueError as exc:
            raise ConfigurationError(f"{ENV_SWITCH_GRACE} must be a number of seconds, got {text!r}") from exc
    return FileSwitchStore(address.path, warn=warn) if grace is None else FileSwitchStore(address.path, warn=warn, grace=grace)


@SWITCH_STORES.register(*REDIS_SCHEMES, options=("grace",))
def _redis(address: Address, *, grace: float | None = None, warn: bool = True) -> SwitchStore:
    from ._redis import RedisSwitchStore

    text = address.options.get("grace") or os.environ.get(ENV_SWITCH_GRACE, "").strip()
    if grace is None:
        if not text:
            raise ConfigurationError(
                f"a Redis kill switch store needs a grace window: how long the last known levers are "
                f"honoured when Redis is unreachable (0 = fail closed at once). Add ?grace=SECONDS to "
                f"the URL or set {ENV_SWITCH_GRACE}"
            )
        try:
            grace = float(text)
        except ValueError as exc:
            raise ConfigurationError(f"grace must be a number of seconds, got {text!r}") from exc
    from .._policyplane import env_prefix

    return RedisSwitchStore(address.url, grace=grace, prefix=env_prefix())


def open_switch_store(target: str, *, grace: float | None = None, warn: bool = True) -> SwitchStore:
    """A store from a URL or a path: ``redis://host:6379/0?grace=30`` (grace from the
    query, the ``grace`` argument or ``$AGENT_SAGA_SWITCH_GRACE``: one is required) or a
    file path (``FileSwitchStore``; its grace for a lost file from the argument or the
    variable, else 30 s). Raises ``ConfigurationError`` for another scheme."""
    return SWITCH_STORES.open(target, grace=grace, warn=warn)
