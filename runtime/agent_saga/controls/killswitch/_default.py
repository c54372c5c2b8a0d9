"""A kill-switch store from a URL or a path, and the process-wide kill switch.

``open_switch_store("redis://host:6379/0?grace=30")`` or ``open_switch_store(path)``;
``get_kill_switch()`` is the switch every ``PreFlightGate`` built without ``checks=``
consults: the one set with ``set_kill_switch``, else one over
``open_switch_store($AGENT_SAGA_SWITCH_STORE)`` made on first use, else none.
"""

from __future__ import annotations

import os
import threading

from ..._backends import REDIS_SCHEMES, Address, Backends
from ...errors import ConfigurationError
from ._local import FileSwitchStore
from ._store import SwitchStore
from ._switch import KillSwitch

__all__ = [
    "ENV_SWITCH_GRACE",
    "SWITCH_STORES",
    "ENV_SWITCH_STORE",
    "get_kill_switch",
    "open_switch_store",
    "set_kill_switch",
]

ENV_SWITCH_STORE = "AGENT_SAGA_SWITCH_STORE"
ENV_SWITCH_GRACE = "AGENT_SAGA_SWITCH_GRACE"

_default_lock = threading.Lock()
_default: KillSwitch | None = None
_resolved = False


def set_kill_switch(switch: KillSwitch | None) -> KillSwitch | None:
    """Make ``switch`` the kill switch of every ``PreFlightGate`` built without
    ``checks=``; return the previous one. ``None`` goes back to ``$AGENT_SAGA_SWITCH_STORE``."""
    global _default, _resolved
    if switch is not None and not isinstance(switch, KillSwitch):
        raise ConfigurationError(f"set_kill_switch() takes a KillSwitch, got {switch!r}")
    with _default_lock:
        prev, _default, _resolved = _default, switch, switch is not None
    return prev


def get_kill_switch() -> KillSwitch | None:
    """The process-wide kill switch: the one set with ``set_kill_switch``, else one over
    ``open_switch_store($AGENT_SAGA_SWITCH_STORE)`` made on first use, else ``None``."""
    global _default, _resolved
    if _resolved:
        return _default
    with _default_lock:
        if not _resolved:
            target = os.environ.get(ENV_SWITCH_STORE, "").strip()
            _default = KillSwitch(open_switch_store(target)) if target else None
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
