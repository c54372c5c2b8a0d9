"""Offline mesh sagas: per-device local logs merged as a grow-only set (G-Set CRDT).

``MeshWAL`` is one device's own log; ``RecordSet`` is the set replicas exchange (merge is
union: commutative, associative, idempotent); ``MeshView`` verifies every device's chain
inside the merged set, names every conflict with all its sides, and gives one
deterministic display order. See docs/mesh.md.
"""

from .device import MESH_CLAIM, MeshWAL
from .gset import Damage, RecordSet, fingerprint, validate_device
from .view import Conflict, MeshView, Side

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
