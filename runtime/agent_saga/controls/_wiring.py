"""How the controls learn that the environment wires them (one hook, set from above).

The policy-plane wiring (``agent_saga.plane``) sits above the controls: it builds every
control from ``AGENT_SAGA_REDIS_URL``. The controls must not import it, so it registers
itself here when imported (the first ``from_environment()`` imports it by name), and ``PreFlightGate()`` / ``saga_scope()`` call ``from_environment()``
before they look up their process-wide defaults: an agent configured by the environment
alone connects the first time any of them is built (and fails there, naming the fix, if
the settings are half right).

Invariant: ``from_environment()`` is cheap after the first call (the hook caches), and
raises only ``ConfigurationError`` (a half-configured agent refuses to start).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["from_environment", "set_environment_hook"]

#: The module that registers the hook when imported (``agent_saga.plane``): named, not
#: imported, because the plane sits above the controls; the first ``from_environment()``
#: imports it, so ``import agent_saga`` does not load the plane.
_PLANE = "agent_saga.plane"


def _load_plane() -> object:
    importlib.import_module(_PLANE)  # registers plane_from_env, replacing this hook
    registered = _hook
    if registered is None or registered is _load_plane:
        return None
    return registered()


_hook: Callable[[], object] | None = _load_plane


def set_environment_hook(hook: Callable[[], object] | None) -> None:
    """Register the callable that wires this process from its environment."""
    global _hook
    _hook = hook


def from_environment() -> None:
    """Wire this process from its environment, if a hook is registered (idempotent)."""
    if _hook is not None:
        _hook()
