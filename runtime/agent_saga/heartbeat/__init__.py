"""Agent heartbeats: each agent process reports, in the policy plane, what it has applied.

The operator folds them into status (``kubectl get killswitches`` says which agents obey;
a SagaPolicy is Ready only once an agent enforces it). See docs/policy-plane.md, "Agent
heartbeats".
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._model import (
        AGENTS_CHANNEL,
        HEARTBEAT_VERSION,
        INDEX_BUCKETS,
        AppliedRef,
        Heartbeat,
        decode_heartbeats,
        heartbeat_buckets_key,
        heartbeat_index_key,
        heartbeat_index_keys,
        heartbeat_key,
        heartbeat_legacy_index_key,
        read_heartbeats,
        served_namespaces_key,
        split_index,
    )
    from ._refusals import RefusalCount, RefusalLedger, note_refusal, refusal_ledger
    from ._writer import AppliedState, HeartbeatWriter

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
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

__all__ = [
    "AGENTS_CHANNEL",
    "HEARTBEAT_VERSION",
    "INDEX_BUCKETS",
    "AppliedRef",
    "AppliedState",
    "Heartbeat",
    "HeartbeatWriter",
    "RefusalCount",
    "RefusalLedger",
    "heartbeat_buckets_key",
    "heartbeat_index_key",
    "heartbeat_index_keys",
    "heartbeat_key",
    "heartbeat_legacy_index_key",
    "decode_heartbeats",
    "note_refusal",
    "read_heartbeats",
    "refusal_ledger",
    "served_namespaces_key",
    "split_index",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
