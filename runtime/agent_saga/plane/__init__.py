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
from ._connect import plane_from_env as plane_from_env  # the environment hook, registered below

if TYPE_CHECKING:
    from .._redis import PLANE_FIX as PLANE_FIX
    from .._redis import aclose as aclose
    from .._redis import connect_async as connect_async
    from .._redis import script as script
    from .._redis import tagged_on_cluster as tagged_on_cluster
    from .._repeat import ReplyLost as ReplyLost
    from .._repeat import check_retries as check_retries
    from .._repeat import lost_text as lost_text
    from .._repeat import repeating as repeating
    from ._acl import ROLES as ROLES
    from ._acl import acl_rules as acl_rules
    from ._acl import acl_setuser as acl_setuser
    from ._acl import agent_scripts as agent_scripts
    from ._acl import preload_scripts as preload_scripts
    from ._connect import PlaneConnection as PlaneConnection
    from ._connect import connect_policy_plane as connect_policy_plane
    from ._connect import disconnect_policy_plane as disconnect_policy_plane
    from ._connect import get_plane as get_plane
    from ._connect import open_plane as open_plane
    from ._connect import plane_from_env as plane_from_env
    from ._connect import plane_router as plane_router
    from ._settings import DEFAULT_CHECK as DEFAULT_CHECK
    from ._settings import DEFAULT_GRACE as DEFAULT_GRACE
    from ._settings import ENV_AGENT as ENV_AGENT
    from ._settings import ENV_NAMESPACE as ENV_NAMESPACE
    from ._settings import ENV_REDIS_URL as ENV_REDIS_URL
    from ._settings import PlaneSettings as PlaneSettings
    from ._settings import StoreChoice as StoreChoice
    from ._settings import choose_store as choose_store

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._acl": ("ROLES", "acl_rules", "acl_setuser", "agent_scripts", "preload_scripts"),
    "._connect": (
        "PlaneConnection", "connect_policy_plane", "disconnect_policy_plane", "get_plane",
        "open_plane", "plane_from_env", "plane_router",
    ),
    "._settings": (
        "DEFAULT_CHECK", "DEFAULT_GRACE", "ENV_AGENT", "ENV_NAMESPACE", "ENV_REDIS_URL", "PlaneSettings",
        "StoreChoice", "choose_store",
    ),
    ".._redis": ("PLANE_FIX", "aclose", "connect_async", "script", "tagged_on_cluster"),
    ".._repeat": ("ReplyLost", "check_retries", "lost_text", "repeating"),
}

set_environment_hook(plane_from_env)

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
