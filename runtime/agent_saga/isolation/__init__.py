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
    from .errors import LockStoreUnavailable as LockStoreUnavailable
    from .errors import SemanticLockNotHeld as SemanticLockNotHeld
    from .errors import SemanticLockTimeout as SemanticLockTimeout
    from .errors import SnapshotMissing as SnapshotMissing
    from .locks import DEFAULT_LOCK_LEASE as DEFAULT_LOCK_LEASE
    from .locks import DEFAULT_LOCK_WAIT as DEFAULT_LOCK_WAIT
    from .locks import LockClaim as LockClaim
    from .locks import SemanticLockManager as SemanticLockManager
    from .locks import SemanticLocks as SemanticLocks
    from .redis_locks import RedisSemanticLocks as RedisSemanticLocks
    from .snapshots import FileSnapshots as FileSnapshots
    from .snapshots import InProcessSnapshots as InProcessSnapshots
    from .snapshots import Snapshot as Snapshot
    from .snapshots import SnapshotGCReport as SnapshotGCReport
    from .tentative import COMMIT_SCOPE as COMMIT_SCOPE
    from .tentative import TentativeResource as TentativeResource
    from .tentative import TentativeStatus as TentativeStatus

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
