"""An approval store from a URL or a directory.

There is no process-wide approval store: the gate is handed its ``approval_provider``
(an ``ApprovalGateway`` over a store) explicitly, because who may approve what is a
decision of the code that builds the gate, never of the environment.
"""

from __future__ import annotations

from ..._backends import REDIS_SCHEMES, Address, Backends
from ._local import FileApprovalStore
from ._store import ApprovalStore

__all__ = ["APPROVAL_STORES", "open_approval_store"]


#: The approval stores, by scheme (``agent_saga._backends``).
APPROVAL_STORES: Backends[ApprovalStore] = Backends("approval store")


@APPROVAL_STORES.register("file")
def _directory(address: Address) -> ApprovalStore:
    return FileApprovalStore(address.path)


@APPROVAL_STORES.register(*REDIS_SCHEMES)
def _redis(address: Address) -> ApprovalStore:
    from ._redis import RedisApprovalStore

    return RedisApprovalStore(address.url)


def open_approval_store(target: str) -> ApprovalStore:
    """A store from a ``redis://`` URL (``RedisApprovalStore``) or a directory path or
    ``file://`` (``FileApprovalStore``). Raises ``ConfigurationError`` for another scheme."""
    return APPROVAL_STORES.open(target)
