"""Agent heartbeats: each agent process reports, in the policy plane, what it has applied.

The operator folds them into status (``kubectl get killswitches`` says which agents obey;
a SagaPolicy is Ready only once an agent enforces it). See docs/policy-plane.md, "Agent
heartbeats".
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._model import AGENTS_CHANNEL as AGENTS_CHANNEL
    from ._model import HEARTBEAT_VERSION as HEARTBEAT_VERSION
    from ._model import INDEX_BUCKETS as INDEX_BUCKETS
    from ._model import AppliedRef as AppliedRef
    from ._model import Heartbeat as Heartbeat
    from ._model import decode_heartbeats as decode_heartbeats
    from ._model import heartbeat_buckets_key as heartbeat_buckets_key
    from ._model import heartbeat_index_key as heartbeat_index_key
    from ._model import heartbeat_index_keys as heartbeat_index_keys
    from ._model import heartbeat_key as heartbeat_key
    from ._model import heartbeat_legacy_index_key as heartbeat_legacy_index_key
    from ._model import read_heartbeats as read_heartbeats
    from ._model import served_namespaces_key as served_namespaces_key
    from ._model import split_index as split_index
    from ._refusals import RefusalCount as RefusalCount
    from ._refusals import RefusalLedger as RefusalLedger
    from ._refusals import note_refusal as note_refusal
    from ._refusals import refusal_ledger as refusal_ledger
    from ._writer import AppliedState as AppliedState
    from ._writer import HeartbeatWriter as HeartbeatWriter

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._model": (
        "AGENTS_CHANNEL", "HEARTBEAT_VERSION", "INDEX_BUCKETS", "AppliedRef", "Heartbeat",
        "decode_heartbeats", "heartbeat_buckets_key", "heartbeat_index_key", "heartbeat_index_keys",
        "heartbeat_key", "heartbeat_legacy_index_key", "read_heartbeats", "served_namespaces_key",
        "split_index",
    ),
    "._refusals": ("RefusalCount", "RefusalLedger", "note_refusal", "refusal_ledger"),
    "._writer": ("AppliedState", "HeartbeatWriter"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
