"""Offline mesh sagas: per-device local logs merged as a grow-only set (G-Set CRDT).

``MeshWAL`` is one device's own log; ``RecordSet`` is the set replicas exchange (merge is
union: commutative, associative, idempotent); ``MeshView`` verifies every device's chain
inside the merged set, names every conflict with all its sides, and gives one
deterministic display order. See docs/mesh.md.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .device import MESH_CLAIM, MeshWAL
    from .gset import Damage, RecordSet, fingerprint, validate_device
    from .view import Conflict, MeshView, Side

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    ".device": ("MESH_CLAIM", "MeshWAL"),
    ".gset": ("Damage", "RecordSet", "fingerprint", "validate_device"),
    ".view": ("Conflict", "MeshView", "Side"),
}

__all__ = [
    "MESH_CLAIM",
    "Conflict",
    "Damage",
    "MeshView",
    "MeshWAL",
    "RecordSet",
    "Side",
    "fingerprint",
    "validate_device",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
