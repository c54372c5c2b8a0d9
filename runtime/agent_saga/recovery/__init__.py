"""Crash recovery: resolve sagas whose owner died, from the log, exactly once.

    from agent_saga.recovery import RecoveryDaemon, FileLedger, RedisLedger, RedisClaimLock

    daemon = RecoveryDaemon("./agent-saga.wal", imports=["myapp.handlers"])
    report = await daemon.sweep()

Modules: ``daemon`` (RecoveryDaemon), ``report`` (SweepReport), ``scan`` (one pass over the log),
``plan`` (what to do per step, pure), ``resolver`` (doing it), ``ledger`` (journal and
human escalation queue; FileLedger), ``claims`` (FileClaimLock), ``redis`` (RedisLedger,
RedisClaimLock), ``reconcilers`` (@reconciler), ``quarantine``, ``sources`` (where a log
is read and written), ``verified`` (every record checked before it is acted on),
``partials`` (escalations from an owner's own partial rollback).

Layering: this package imports the engine's modules, the WAL interface and the standard
library; ``redis`` is imported only when a Redis ledger or lock is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .claims import Claim, ClaimLock, FileClaimLock
    from .daemon import RecoveryDaemon, SweepReport
    from .errors import (
        ClaimLost,
        ClaimStoreUnavailable,
        LedgerCorrupt,
        LocationUnavailable,
        RecoveryError,
        RecoveryHalted,
    )
    from .ledger import (
        Escalation,
        FileLedger,
        LedgerEntry,
        LedgerKind,
        RecoveryLedger,
        escalation_id,
    )
    from .plan import Action, SagaPlan, StepPlan, plan_saga
    from .quarantine import QuarantineSource, lift_quarantine, quarantine_saga
    from .reconcilers import Observation, get_reconciler, reconciler, registered_reconcilers
    from .recordtypes import (
        RECOVERY_STARTED,
        SAGA_QUARANTINE_LIFTED,
        SAGA_QUARANTINED,
        STEP_RECONCILED,
        EscalationKind,
    )
    from .redis import RedisClaimLock, RedisLedger
    from .resolver import SagaResult
    from .sources import LogRead, LogSource, PathSource, WALSource, WriterBusy
    from .targets import open_claim_lock

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    ".claims": ("Claim", "ClaimLock", "FileClaimLock"),
    ".daemon": ("RecoveryDaemon", "SweepReport"),
    ".errors": (
        "ClaimLost", "ClaimStoreUnavailable", "LedgerCorrupt", "LocationUnavailable",
        "RecoveryError", "RecoveryHalted",
    ),
    ".ledger": (
        "Escalation", "FileLedger", "LedgerEntry", "LedgerKind", "RecoveryLedger",
        "escalation_id",
    ),
    ".plan": ("Action", "SagaPlan", "StepPlan", "plan_saga"),
    ".quarantine": ("QuarantineSource", "lift_quarantine", "quarantine_saga"),
    ".reconcilers": ("Observation", "get_reconciler", "reconciler", "registered_reconcilers"),
    ".redis": ("RedisClaimLock", "RedisLedger"),
    ".recordtypes": (
        "RECOVERY_STARTED", "SAGA_QUARANTINE_LIFTED", "SAGA_QUARANTINED", "STEP_RECONCILED",
        "EscalationKind",
    ),
    ".resolver": ("SagaResult",),
    ".sources": ("LogRead", "LogSource", "PathSource", "WALSource", "WriterBusy"),
    ".targets": ("open_claim_lock",),
}

__all__ = [
    "RECOVERY_STARTED",
    "SAGA_QUARANTINED",
    "SAGA_QUARANTINE_LIFTED",
    "STEP_RECONCILED",
    "Action",
    "Claim",
    "ClaimLock",
    "ClaimLost",
    "ClaimStoreUnavailable",
    "Escalation",
    "EscalationKind",
    "FileClaimLock",
    "FileLedger",
    "LedgerCorrupt",
    "LedgerEntry",
    "LedgerKind",
    "LocationUnavailable",
    "LogRead",
    "LogSource",
    "PathSource",
    "QuarantineSource",
    "RecoveryDaemon",
    "RecoveryError",
    "RecoveryHalted",
    "RecoveryLedger",
    "RedisClaimLock",
    "RedisLedger",
    "SagaPlan",
    "SagaResult",
    "StepPlan",
    "SweepReport",
    "WALSource",
    "WriterBusy",
    "escalation_id",
    "Observation",
    "get_reconciler",
    "lift_quarantine",
    "open_claim_lock",
    "plan_saga",
    "quarantine_saga",
    "reconciler",
    "registered_reconcilers",
]


__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
