"""The limit store from a URL, and the process-wide one used by every gate not given one.

Resolution order: the store set with ``set_limit_store``; else a ``RedisLimitStore`` at
``$AGENT_SAGA_LIMIT_STORE`` (a ``redis://`` URL); else an ``InProcessLimitStore``.
It is created on first use, once, under a lock.
"""

from __future__ import annotations

import os
import threading

from ...errors import ConfigurationError
from ._store import LimitStore

__all__ = ["ENV_LIMIT_STORE", "get_limit_store", "open_limit_store", "peek_limit_store", "set_limit_store"]

ENV_LIMIT_STORE = "AGENT_SAGA_LIMIT_STORE"

_lock = threading.Lock()
_default: LimitStore | None = None


def set_limit_store(store: LimitStore | None) -> LimitStore | None:
    """Make ``store`` the process-wide limit store; return the previous one.

    ``set_limit_store(RedisLimitStore(url))`` for anything running more than one process:
    the in-process default grants each process the full allowance. ``None`` goes back to
    the default resolution (see the module doc).
    """
    global _default
    if store is not None and not isinstance(store, LimitStore):
        raise ConfigurationError(
            f"set_limit_store() takes a limit store (InProcessLimitStore(), "
            f"RedisLimitStore(url)), got {store!r}"
        )
    with _lock:
        prev, _default = _default, store
    return prev


def peek_limit_store() -> LimitStore | None:
    """The store set with ``set_limit_store`` (or created by ``get_limit_store``), if any."""
    return _default


def get_limit_store() -> LimitStore:
    """The process-wide limit store, created on first use (see the module doc)."""
    global _default
    with _lock:
        if _default is None:
            _default = open_limit_store(os.environ.get(ENV_LIMIT_STORE, "").strip())
        return _default


def open_limit_store(target: str) -> LimitStore:
    """The store ``target`` names: a ``RedisLimitStore`` for a ``redis://`` URL, an
    ``InProcessLimitStore`` for an empty target."""
    if target:
        from ._redis import RedisLimitStore

        return RedisLimitStore(target)
    from ._local import InProcessLimitStore

    return InProcessLimitStore()
