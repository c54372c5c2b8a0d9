"""The errors of saga isolation (drawn in the tree of ``agent_saga.errors``).

    SemanticLockTimeout    a lock wait ran out: ``holder`` names the saga holding it
    SemanticLockNotHeld    a release (or renewal) by a saga that does not hold the lock
    LockStoreUnavailable   the lock store (Redis) could not be reached: nothing was claimed
    SnapshotMissing        a snapshot cannot be read back (gone, damaged, other store)
"""

from __future__ import annotations

from typing import Any

from ..errors import SagaError, StoreUnavailable

__all__ = ["LockStoreUnavailable", "SemanticLockNotHeld", "SemanticLockTimeout", "SnapshotMissing"]


class SemanticLockTimeout(SagaError):
    """Another saga held ``resource_id`` for the whole wait; ``holder`` is its saga id."""

    def __init__(self, message: str, *, resource_id: str, holder: str | None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.resource_id = resource_id
        self.holder = holder


class SemanticLockNotHeld(SagaError):
    """A saga tried to release a claim it does not hold: refused, the claim is untouched.
    ``holder`` is the saga that does hold it (``None`` if nobody does)."""

    def __init__(self, message: str, *, resource_id: str, holder: str | None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.resource_id = resource_id
        self.holder = holder


class LockStoreUnavailable(StoreUnavailable):
    """The semantic-lock store could not be read or written; nothing was claimed or freed."""


class SnapshotMissing(SagaError):
    """A snapshot cannot be loaded: not in this store, or its file does not verify."""

    def __init__(self, message: str, *, snapshot_id: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.snapshot_id = snapshot_id
