"""Wiring an agent to the policy plane with one setting (``AGENT_SAGA_REDIS_URL``).

See docs/policy-plane.md, "Wiring an agent".
"""

from ._settings import (
    DEFAULT_GRACE,
    ENV_AGENT,
    ENV_NAMESPACE,
    ENV_REDIS_URL,
    PlaneSettings,
    StoreChoice,
    choose_store,
)

__all__ = [
    "DEFAULT_GRACE",
    "ENV_AGENT",
    "ENV_NAMESPACE",
    "ENV_REDIS_URL",
    "PlaneSettings",
    "StoreChoice",
    "choose_store",
]
