"""An approval store from a URL or a directory.

There is no process-wide approval store: the gate is handed its ``approval_provider``
(an ``ApprovalGateway`` over a store) explicitly, because who may approve what is a
decision of the code that builds the gate, never of the environment.
"""

from __future__ import annotations

from ._local import FileApprovalStore
from ._store import ApprovalStore

__all__ = ["open_approval_store"]


def open_approval_store(target: str) -> ApprovalStore:
    """A store from a ``redis://`` URL or a directory path."""
    if target.startswith(("redis://", "rediss://", "unix://")):
        from ._redis import RedisApprovalStore

        return RedisApprovalStore(target)
    return FileApprovalStore(target)
