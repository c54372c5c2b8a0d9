"""The limit store from a URL, and the process-wide one used by every gate not given one.

Resolution order: the store set with ``set_limit_store``; else a ``RedisLimitStore`` at
``$AGENT_SAGA_LIMIT_STORE`` (a ``redis://`` URL); else an ``InProcessLimitStore``.
It is created on first use, once, under a lock. ``set_limit_source`` names the limit
definitions a gate built without ``limits=`` enforces (the policy-plane wiring sets it
to a ``RedisLimitSource``).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..._backends import REDIS_SCHEMES, Address, Backends
from ...errors import ConfigurationError
from ._store import LimitStore

__all__ = ["ENV_LIMIT_STORE", "LIMIT_STORES", "get_limit_source", "get_limit_store", "open_limit_store",
           "peek_limit_store", "set_limit_source", "set_limit_store"]

ENV_LIMIT_STORE = "AGENT_SAGA_LIMIT_STORE"

_lock = threading.Lock()
_default: LimitStore | None = None
_source: Any = None


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


#: The limit stores, by scheme (``agent_saga._backends``): nothing is the in-process store.
LIMIT_STORES: Backends[LimitStore] = Backends("limit store")


@LIMIT_STORES.register("")
def _in_process(address: Address) -> LimitStore:
    from ._local import InProcessLimitStore

    return InProcessLimitStore()


def set_limit_source(source: Any) -> Any:
    """Make ``source`` (a ``LimitSource``: ``RedisLimitSource``) the limit definitions of
    every ``PreFlightGate`` built without ``limits=``; return the previous one. ``None``:
    such gates have no limits (the default)."""
    global _source
    if source is not None and not callable(getattr(source, "snapshot", None)):
        raise ConfigurationError(f"set_limit_source() takes a limit source (RedisLimitSource(url)), got {source!r}")
    with _lock:
        prev, _source = _source, source
    return prev


def get_limit_source() -> Any:
    """The process-wide limit source, or ``None``."""
    return _source


@LIMIT_STORES.register(*REDIS_SCHEMES, options=("part",))
def _redis(address: Address) -> LimitStore:
    from ._redis import RedisLimitStore

    # ?part=<namespace>/<pod>: this process's own part of the windows (RedisLimitStore).
    return RedisLimitStore(address.url, part=address.options.get("part") or None)


def open_limit_store(target: str) -> LimitStore:
    """The store ``target`` names: an ``InProcessLimitStore`` for an empty target, a
    ``RedisLimitStore`` for a ``redis://`` URL. Raises ``ConfigurationError`` for another
    scheme."""
    return LIMIT_STORES.open(target)
