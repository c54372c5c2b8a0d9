"""The process-wide breaker: the one every ``PreFlightGate`` built without ``checks=``
consults, if one was set.

There is no breaker store and no breaker from a URL: a breaker's state is per process
by design (it fails open: nothing can make it unreachable), so each process learns on its
own which dependencies are down.
"""

from __future__ import annotations

import threading

from ...errors import ConfigurationError
from ._breaker import CircuitBreaker

__all__ = ["get_breaker", "set_breaker"]

_default_lock = threading.Lock()
_default: CircuitBreaker | None = None


def set_breaker(breaker: CircuitBreaker | None) -> CircuitBreaker | None:
    """Make ``breaker`` the breaker of every ``PreFlightGate`` built without ``checks=``;
    return the previous one (``None``: no breaker)."""
    global _default
    if breaker is not None and not isinstance(breaker, CircuitBreaker):
        raise ConfigurationError(f"set_breaker() takes a CircuitBreaker(BreakerPolicy(...)), got {breaker!r}")
    with _default_lock:
        prev, _default = _default, breaker
    return prev


def get_breaker() -> CircuitBreaker | None:
    """The process-wide breaker set with ``set_breaker``, if any."""
    return _default
