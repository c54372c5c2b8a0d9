"""Offline mesh sagas: per-device local logs merged as a grow-only set (G-Set CRDT).

``MeshWAL`` is one device's own log; ``RecordSet`` is the set replicas exchange (merge is
union: commutative, associative, idempotent); ``MeshView`` verifies every device's chain
inside the merged set, names every conflict with all its sides, and gives one
deterministic display order. See docs/mesh.md.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .device import MESH_CLAIM as MESH_CLAIM
    from .device import MeshWAL as MeshWAL
    from .gset import Damage as Damage
    from .gset import RecordSet as RecordSet
    from .gset import fingerprint as fingerprint
    from .gset import validate_device as validate_device
    from .view import Conflict as Conflict
    from .view import MeshView as MeshView
    from .view import Side as Side

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".device": ("MESH_CLAIM", "MeshWAL"),
    ".gset": ("Damage", "RecordSet", "fingerprint", "validate_device"),
    ".view": ("Conflict", "MeshView", "Side"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
