"""Reconcilers: how recovery learns whether a dangling step happened.

A step whose intent is durable but whose outcome is not (the process died inside the
forward call, or it timed out) may or may not have happened, and its compensation cannot
be derived: the factory needed the forward result. A reconciler, registered by tool name,
asks the real system::

    @reconciler("stripe.charge")
    def find_charge(policy_args, idempotency_key):
        charge = stripe.Charge.search(query=f"metadata['key']:'{idempotency_key}'")
        if not charge:
            return None                      # provably did not happen
        return Compensation(handler="stripe.refund", kwargs={"charge_id": charge.id})

It is called with the step's ``policy_args`` and the forward call's idempotency key
(``idempotency_key(saga_id, step_id, "forward")``, the key the dead process passed to the
forward call) and returns:

- ``None``: the effect provably did not happen (nothing to undo);
- a ``Compensation`` with a ``handler`` (or the dict form): it happened, undo it so;
- or raises: it cannot tell, and the step is escalated to a human.

A tool without a reconciler is escalated. A reconciler must be authoritative: "not found"
must mean "will never happen", e.g. because the provider refuses a replay of the same
idempotency key. A reconciler that guesses is the bug this module exists to prevent.

Invariants: ``@reconciler`` validates eagerly and returns the function unchanged; the
registry is process-local and thread-safe, like the compensation registry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..compensation import HANDLER_PATTERN
from ..errors import ConfigurationError

__all__ = ["get_reconciler", "reconciler", "registered_reconcilers", "unregister_reconciler"]

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_registry: dict[str, Callable[..., Any]] = {}


def reconciler(tool: str) -> Callable[[F], F]:
    """Register the decorated function as the reconciler of ``tool`` (see the module doc).

    Raises ``ConfigurationError`` at decoration time for an invalid tool name, a
    non-callable, or a tool that already has a different reconciler.
    """
    if not isinstance(tool, str) or not HANDLER_PATTERN.match(tool):
        raise ConfigurationError(
            f"reconciler tool name {tool!r} is not valid: use the tool's stable name, e.g. "
            f"'stripe.charge' (1-128 characters from [A-Za-z0-9._:/-])"
        )

    def register(fn: F) -> F:
        if not callable(fn):
            raise ConfigurationError(f"@reconciler({tool!r}) must decorate a callable, got {fn!r}")
        with _lock:
            prev = _registry.get(tool)
            if prev is not None and prev is not fn and _qualname(prev) != _qualname(fn):
                raise ConfigurationError(
                    f"tool {tool!r} already has the reconciler {_qualname(prev)}; cannot register "
                    f"{_qualname(fn)} as well: one tool, one authority on whether it happened"
                )
            _registry[tool] = fn
        return fn

    return register


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def get_reconciler(tool: str) -> Callable[..., Any] | None:
    """The reconciler registered for ``tool``, or ``None``."""
    return _registry.get(tool)


def registered_reconcilers() -> dict[str, Callable[..., Any]]:
    """A snapshot of the registry: tool name -> function."""
    with _lock:
        return dict(_registry)


def unregister_reconciler(tool: str) -> bool:
    """Remove ``tool``'s reconciler (tests, plugin unloading); True if there was one."""
    with _lock:
        return _registry.pop(tool, None) is not None
