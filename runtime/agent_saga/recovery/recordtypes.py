"""The record types recovery adds to the log, and the kinds of escalation it raises.

Extension record types (upper snake case, chained like every other record; readers that
do not know them, such as ``history.fold``, pass over them):

    RECOVERY_STARTED        {recovered_by, claim, owner_last_seen_us, lease_seconds}
                            a daemon took the saga over after its lease expired
    STEP_RECONCILED         {tool, happened, reversed, observation, compensation, recovered_by}
                            a reconciler decided a dangling step's outcome
    SAGA_QUARANTINED        {reason, by}   freeze the saga: recovery skips it, a human decides
    SAGA_QUARANTINE_LIFTED  {reason, by}   release it

Every record a daemon writes for a saga carries ``recovered_by`` (the daemon id) in its
payload; that is how a lease tells the owner's signs of life from the daemon's.
"""

from __future__ import annotations

import enum
from typing import Final

from ..records import ExtensionType

RECOVERY_STARTED: Final = ExtensionType.RECOVERY_STARTED.value
STEP_RECONCILED: Final = ExtensionType.STEP_RECONCILED.value
SAGA_QUARANTINED: Final = ExtensionType.SAGA_QUARANTINED.value
SAGA_QUARANTINE_LIFTED: Final = ExtensionType.SAGA_QUARANTINE_LIFTED.value

RECOVERED_BY: Final = "recovered_by"


class EscalationKind(enum.StrEnum):
    """Why a step was handed to a human instead of being resolved automatically."""

    IRREVERSIBLE = "IRREVERSIBLE"  # no automated undo exists
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"  # may have happened; no way to derive the inverse
    HANDLER_NOT_REGISTERED = "HANDLER_NOT_REGISTERED"  # the daemon did not import it
    NOT_REPLAYABLE = "NOT_REPLAYABLE"  # in-process only (fn=), or no usable compensation
    COMPENSATION_FAILED = "COMPENSATION_FAILED"  # the compensation ran and raised
    COMPENSATION_TIMEOUT = "COMPENSATION_TIMEOUT"  # it did not return in time: in doubt
    RECONCILE_FAILED = "RECONCILE_FAILED"  # the reconciler raised or answered nonsense
    ESCALATED_BEFORE = "ESCALATED_BEFORE"  # the owner's own rollback escalated it
    NOT_ALLOWED = "NOT_ALLOWED"  # the allow-list does not grant its handler or credential_ref to the saga's writer
