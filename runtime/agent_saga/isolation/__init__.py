"""Saga isolation: the countermeasures for what sagas give up (a concurrent saga can read
a charge that is about to be refunded).

    TentativeResource      an entity PENDING for the saga's life, COMMITTED or ROLLED_BACK at
                           its boundary; durable, so recovery settles one stranded by a crash
    SemanticLockManager    claim a resource id so a concurrent saga cannot dirty-read it
    RedisSemanticLocks     the same claims shared by a fleet (``agent-saga[redis]``)
    InProcessSnapshots     before-images for REVERSIBLE steps
    FileSnapshots          durable before-images for COMPENSABLE steps, with a conservative GC

Modules: ``tentative``, ``locks`` (the interface and the process-local store),
``redis_locks``, ``snapshots``, ``errors``. Everything stands on the engine's own
mechanisms: steps (a registration is a COMPENSABLE step), compensations registered by
name, and the saga boundary hooks (``Saga.on_commit`` / ``Saga.on_exit``).

Layering: this package imports the engine's modules and the standard library; ``redis``
is imported only when a ``RedisSemanticLocks`` is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .errors import (
        LockStoreUnavailable,
        SemanticLockNotHeld,
        SemanticLockTimeout,
        SnapshotMissing,
    )
    from .locks import (
        DEFAULT_LOCK_LEASE,
        DEFAULT_LOCK_WAIT,
        LockClaim,
        SemanticLockManager,
        SemanticLocks,
    )
    from .redis_locks import RedisSemanticLocks
    from .snapshots import FileSnapshots, InProcessSnapshots, Snapshot, SnapshotGCReport
    from .tentative import COMMIT_SCOPE, TentativeResource, TentativeStatus

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    ".errors": (
        "LockStoreUnavailable", "SemanticLockNotHeld", "SemanticLockTimeout",
        "SnapshotMissing",
    ),
    ".locks": (
        "DEFAULT_LOCK_LEASE", "DEFAULT_LOCK_WAIT", "LockClaim", "SemanticLockManager",
        "SemanticLocks",
    ),
    ".redis_locks": ("RedisSemanticLocks",),
    ".snapshots": ("FileSnapshots", "InProcessSnapshots", "Snapshot", "SnapshotGCReport"),
    ".tentative": ("COMMIT_SCOPE", "TentativeResource", "TentativeStatus"),
}

__all__ = [
    "COMMIT_SCOPE",
    "DEFAULT_LOCK_LEASE",
    "DEFAULT_LOCK_WAIT",
    "FileSnapshots",
    "InProcessSnapshots",
    "LockClaim",
    "LockStoreUnavailable",
    "RedisSemanticLocks",
    "SemanticLockManager",
    "SemanticLockNotHeld",
    "SemanticLockTimeout",
    "SemanticLocks",
    "Snapshot",
    "SnapshotGCReport",
    "SnapshotMissing",
    "TentativeResource",
    "TentativeStatus",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
