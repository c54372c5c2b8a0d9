"""Wiring an agent to the policy plane with one setting (``AGENT_SAGA_REDIS_URL``).

``PlaneSettings`` reads the environment; ``connect_policy_plane`` (or the environment,
on the first ``PreFlightGate()`` / ``AgentKit()`` / ``saga_scope()``) builds every
control over the plane and makes it the process default; ``choose_store`` is how the CLI
finds the store a command reads; ``acl_rules`` is the least-privilege Redis ACL of each
component, and ``preload_scripts`` loads the scripts agents may run (docs/threat-model.md). See docs/policy-plane.md, "Wiring an agent".
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ..controls._wiring import set_environment_hook
from ._connect import plane_from_env  # the environment hook, registered below

if TYPE_CHECKING:
    from ._acl import ROLES, acl_rules, acl_setuser, agent_scripts, preload_scripts
    from ._connect import (
        PlaneConnection,
        connect_policy_plane,
        disconnect_policy_plane,
        get_plane,
        open_plane,
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

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    "._acl": ("ROLES", "acl_rules", "acl_setuser", "agent_scripts", "preload_scripts"),
    "._connect": (
        "PlaneConnection", "connect_policy_plane", "disconnect_policy_plane", "get_plane",
        "open_plane", "plane_from_env", "plane_router",
    ),
    "._settings": (
        "DEFAULT_GRACE", "ENV_AGENT", "ENV_NAMESPACE", "ENV_REDIS_URL", "PlaneSettings",
        "StoreChoice", "choose_store",
    ),
}

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
    "open_plane",
    "plane_from_env",
    "plane_router",
    "preload_scripts",
]

set_environment_hook(plane_from_env)

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
