"""SweepReport: what one recovery sweep saw and did (read by the CLI, recoveryd's metrics
and health, and callers of ``RecoveryDaemon.sweep``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .resolver import SagaResult

__all__ = ["RESOLVED_STATUSES", "SweepReport"]

RESOLVED_STATUSES = frozenset({"ROLLED_BACK", "ROLLBACK_PARTIAL"})


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one sweep saw and did.

    ``in_flight``: sagas with no terminal record; ``live``: of those, leases still running;
    ``orphans``: leases expired (``quarantined`` ones excluded); ``results``: one per
    orphan the sweep looked at; ``oldest_orphan_age``: seconds since the lease expired of
    the oldest orphan still unresolved after the sweep (0 if none). ``halted`` says why the
    daemon stopped (fail-closed); ``error`` why this sweep stopped early (transient).
    """

    source: str
    started: float
    duration: float
    records_read: int
    in_flight: int
    live: int
    quarantined: int
    orphans: int
    oldest_orphan_age: float
    results: tuple[SagaResult, ...] = ()
    halted: str | None = None
    error: str | None = None
    drained: bool = False
    dry_run: bool = False
    #: record types this version does not know, seen in the log (in sagas recovery did
    #: not have to act on; in one it would act on, recovery halts)
    unknown_types: tuple[str, ...] = ()

    def count(self, *statuses: str) -> int:
        return sum(1 for r in self.results if r.status in statuses)

    @property
    def recovered(self) -> int:
        """Sagas this sweep closed (clean or partial)."""
        return self.count(*RESOLVED_STATUSES)

    @property
    def escalated_sagas(self) -> int:
        """Sagas this sweep closed with at least one escalation."""
        return sum(1 for r in self.results if r.status in RESOLVED_STATUSES and r.escalations)

    @property
    def escalations(self) -> int:
        return sum(len(r.escalations) for r in self.results)

    @property
    def claim_conflicts(self) -> int:
        return self.count("CLAIMED")

    @property
    def compensations_run(self) -> int:
        return sum(r.compensations_run for r in self.results)

    @property
    def ok(self) -> bool:
        return self.halted is None and self.error is None

    def summary(self) -> str:
        if self.halted:
            return f"{self.source}: HALTED: {self.halted}"
        head = "planned" if self.dry_run else "recovered"
        n = self.count("PLANNED") if self.dry_run else self.recovered
        text = (
            f"{self.source}: {self.in_flight} in flight, {self.live} live, {self.quarantined} "
            f"quarantined, {self.orphans} orphaned; {head} {n}"
        )
        if not self.dry_run:
            text += f" ({self.count('ROLLBACK_PARTIAL')} partial, {self.escalations} escalation(s))"
        if self.claim_conflicts:
            text += f", {self.claim_conflicts} claimed by another daemon"
        if self.unknown_types:
            text += (
                f"; the log holds records of types this version does not know "
                f"({', '.join(self.unknown_types)}): upgrade agent-saga"
            )
        if self.error:
            text += f"; stopped early: {self.error}"
        return text + f" in {self.duration:.3f}s"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "started": self.started, "duration": self.duration,
            "records_read": self.records_read, "in_flight": self.in_flight, "live": self.live,
            "quarantined": self.quarantined, "orphans": self.orphans,
            "oldest_orphan_age": self.oldest_orphan_age, "recovered": self.recovered,
            "escalations": self.escalations, "claim_conflicts": self.claim_conflicts,
            "halted": self.halted, "error": self.error, "drained": self.drained,
            "dry_run": self.dry_run, "unknown_types": list(self.unknown_types),
            "results": [r.to_dict() for r in self.results],
        }
