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
    from .claims import Claim as Claim
    from .claims import ClaimLock as ClaimLock
    from .claims import FileClaimLock as FileClaimLock
    from .daemon import RecoveryDaemon as RecoveryDaemon
    from .daemon import SweepReport as SweepReport
    from .daemon import import_modules as import_modules
    from .errors import ClaimLost as ClaimLost
    from .errors import ClaimStoreUnavailable as ClaimStoreUnavailable
    from .errors import LedgerCorrupt as LedgerCorrupt
    from .errors import LocationUnavailable as LocationUnavailable
    from .errors import RecoveryError as RecoveryError
    from .errors import RecoveryHalted as RecoveryHalted
    from .grants import Grants as Grants
    from .ledger import Escalation as Escalation
    from .ledger import FileLedger as FileLedger
    from .ledger import LedgerEntry as LedgerEntry
    from .ledger import LedgerKind as LedgerKind
    from .ledger import RecoveryLedger as RecoveryLedger
    from .ledger import escalation_id as escalation_id
    from .plan import Action as Action
    from .plan import SagaPlan as SagaPlan
    from .plan import StepPlan as StepPlan
    from .plan import plan_saga as plan_saga
    from .quarantine import QuarantineSource as QuarantineSource
    from .quarantine import lift_quarantine as lift_quarantine
    from .quarantine import quarantine_saga as quarantine_saga
    from .reconcilers import Observation as Observation
    from .reconcilers import get_reconciler as get_reconciler
    from .reconcilers import reconciler as reconciler
    from .reconcilers import registered_reconcilers as registered_reconcilers
    from .recordtypes import RECOVERY_STARTED as RECOVERY_STARTED
    from .recordtypes import SAGA_QUARANTINE_LIFTED as SAGA_QUARANTINE_LIFTED
    from .recordtypes import SAGA_QUARANTINED as SAGA_QUARANTINED
    from .recordtypes import STEP_RECONCILED as STEP_RECONCILED
    from .recordtypes import EscalationKind as EscalationKind
    from .redis import RedisClaimLock as RedisClaimLock
    from .redis import RedisLedger as RedisLedger
    from .resolver import SagaResult as SagaResult
    from .sources import LogRead as LogRead
    from .sources import LogSource as LogSource
    from .sources import PathSource as PathSource
    from .sources import WALSource as WALSource
    from .sources import WriterBusy as WriterBusy
    from .targets import default_file_paths as default_file_paths
    from .targets import open_claim_lock as open_claim_lock

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".claims": ("Claim", "ClaimLock", "FileClaimLock"),
    ".daemon": ("RecoveryDaemon", "SweepReport", "import_modules"),
    ".errors": (
        "ClaimLost", "ClaimStoreUnavailable", "LedgerCorrupt", "LocationUnavailable",
        "RecoveryError", "RecoveryHalted",
    ),
    ".grants": ("Grants",),
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
    ".targets": ("default_file_paths", "open_claim_lock"),
}


__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
