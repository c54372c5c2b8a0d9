"""Wiring an agent to the policy plane with one setting (``AGENT_SAGA_REDIS_URL``).

``PlaneSettings`` reads the environment; ``connect_policy_plane`` (or the environment,
on the first ``PreFlightGate()`` / ``AgentKit()`` / ``saga_scope()``) builds every
control over the plane and makes it the process default; ``choose_store`` is how the CLI
finds the store a command reads; ``acl_rules`` is the least-privilege Redis ACL of each
component, and ``preload_scripts`` loads the scripts agents may run (docs/threat-model.md). See docs/policy-plane.md, "Wiring an agent".
"""

from ..controls._wiring import set_environment_hook
from ._acl import ROLES, acl_rules, acl_setuser, agent_scripts, preload_scripts
from ._connect import (
    PlaneConnection,
    connect_policy_plane,
    disconnect_policy_plane,
    get_plane,
    plane_from_env,
    plane_router,
)
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
    "ROLES",
    "PlaneConnection",
    "PlaneSettings",
    "StoreChoice",
    "acl_rules",
    "acl_setuser",
    "agent_scripts",
    "choose_store",
    "connect_policy_plane",
    "disconnect_policy_plane",
    "get_plane",
    "plane_from_env",
    "plane_router",
    "preload_scripts",
]

set_environment_hook(plane_from_env)
