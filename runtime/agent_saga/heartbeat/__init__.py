"""Agent heartbeats: each agent process reports, in the policy plane, what it has applied.

The operator folds them into status (``kubectl get killswitches`` says which agents obey;
a SagaPolicy is Ready only once an agent enforces it). See docs/policy-plane.md, "Agent
heartbeats".
"""

from ._model import (
    AGENTS_CHANNEL,
    HEARTBEAT_VERSION,
    AppliedRef,
    Heartbeat,
    decode_heartbeats,
    heartbeat_index_key,
    heartbeat_key,
    read_heartbeats,
    served_namespaces_key,
)
from ._writer import AppliedState, HeartbeatWriter

__all__ = [
    "AGENTS_CHANNEL",
    "HEARTBEAT_VERSION",
    "AppliedRef",
    "AppliedState",
    "Heartbeat",
    "HeartbeatWriter",
    "heartbeat_index_key",
    "heartbeat_key",
    "decode_heartbeats",
    "read_heartbeats",
    "served_namespaces_key",
]
