"""Status conditions, as cert-manager sets them.

A condition is ``{type, status, reason, message, lastTransitionTime, observedGeneration}``;
``status.conditions`` is a list the API server treats as a map keyed by ``type``.

Invariants (``set_condition``):
- ``lastTransitionTime`` changes only when ``status`` changes: a new reason or message
  with the same status keeps the time the status last flipped.
- Conditions of other types are kept, in their order; a new type is appended.
- Reasons are CamelCase constants (below), never free text; the sentence is the message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "READY",
    "SYNCED",
    "Cond",
    "Reason",
    "changed",
    "event_type",
    "find",
    "rfc3339",
    "set_condition",
]

READY = "Ready"
SYNCED = "Synced"

Status = Literal["True", "False", "Unknown"]


class Reason:
    """The reasons this operator writes (CamelCase, cert-manager style)."""

    PROJECTED = "Projected"               # Synced: the document is in the policy plane
    REMOVED = "Removed"                   # Synced: the document was taken out (expired)
    REDIS_UNAVAILABLE = "RedisUnavailable"
    INVALID = "Invalid"                   # the spec passed the schema but cannot be enforced
    ENGAGED = "Engaged"                   # KillSwitch in force
    EXPIRED = "Expired"                   # KillSwitch TTL or Approval deadline passed
    ENFORCED = "Enforced"                 # BudgetLimit, SagaPolicy in force
    OBSERVING = "Observing"               # SagaPolicy in Observe mode
    ROUTED = "Routed"                     # ModelRoute in force
    PENDING = "Pending"                   # Approval waiting for a human
    APPROVED = "Approved"
    DENIED = "Denied"
    CONFLICT = "Conflict"                 # the policy plane holds a different decision
    ACTION_MISMATCH = "ActionMismatch"    # Approval: what it would show is not what the agent will do
    NOT_ALL_SHOWN = "NotAllShown"         # Approval: the action is larger than an Approval shows
    UNSIGNED = "Unsigned"                 # Approval: an approval agents ignore, not signed
    UNTRUSTED_KEY = "UntrustedKey"        # Approval: signed, but not by a key trusted for its approver
    ACKNOWLEDGED = "Acknowledged"         # every agent it governs applies it
    LAGGING = "Lagging"                   # some agents it governs do not apply it (yet)
    NO_AGENTS = "NoAgents"                # Acknowledged: no live agent it governs
    NO_CONSUMER = "NoConsumer"            # Ready: projected, no live agent it governs applies it
    NOT_APPLIED = "NotApplied"            # Ready: agents match, none applied this generation yet
    NOT_ENGAGED = "NotEngaged"            # KillSwitch expired: nothing to acknowledge
    AGENTS_UNKNOWN = "AgentsUnknown"      # agent heartbeats not read yet


@dataclass(frozen=True, slots=True)
class Cond:
    """A condition to set: type, status, reason, message."""

    type: str
    status: Status
    reason: str
    message: str = ""


def rfc3339(when: datetime) -> str:
    """``2026-07-01T12:00:00Z``: whole seconds, UTC, as the API server writes times."""
    return when.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_``, or None."""
    for c in conditions or ():
        if c.get("type") == type_:
            return c
    return None


def set_condition(
    conditions: Iterable[Mapping[str, Any]] | None,
    cond: Cond,
    *,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """A new conditions list with ``cond`` set (see the module doc for the invariants)."""
    out: list[dict[str, Any]] = []
    placed = False
    for c in conditions or ():
        if c.get("type") != cond.type:
            out.append(dict(c))
            continue
        placed = True
        keep_time = c.get("status") == cond.status and c.get("lastTransitionTime")
        out.append(_make(cond, generation, c["lastTransitionTime"] if keep_time else rfc3339(now)))
    if not placed:
        out.append(_make(cond, generation, rfc3339(now)))
    return out


def _make(cond: Cond, generation: int | None, when: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "type": cond.type,
        "status": cond.status,
        "reason": cond.reason,
        "message": cond.message[:4096],
        "lastTransitionTime": when,
    }
    if generation is not None:
        doc["observedGeneration"] = generation
    return doc


#: Reasons that need a human: a Warning Event. Everything else (a pending Approval, a
#: policy no agent applied yet, an expiry) is how the system works: a Normal Event.
WARNING_REASONS = frozenset({Reason.INVALID, Reason.REDIS_UNAVAILABLE, Reason.CONFLICT})


def event_type(cond: Mapping[str, Any]) -> str:
    """``Warning`` for a condition whose reason is a real problem, else ``Normal``."""
    return "Warning" if cond.get("reason") in WARNING_REASONS else "Normal"


def changed(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether a human would call this a transition: status or reason differs."""
    if old is None or new is None:
        return old is not new
    return old.get("status") != new.get("status") or old.get("reason") != new.get("reason")
