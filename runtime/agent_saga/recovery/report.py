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
    daemon stopped (fail-closed); ``error`` why this sweep stopped early (transient);
    ``held_writers`` which writers' sagas it left alone (broken or quarantined).
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
    #: writers whose sagas this sweep did not act on, each "writer W: why" (BROKEN: its
    #: chain failed; QUARANTINED by an operator), and how many of its orphans were left
    held_writers: tuple[str, ...] = ()
    held: int = 0
    #: writers that wrote records of sagas they do not own (ignored), one line each
    foreign: tuple[str, ...] = ()
    #: the writers among ``held_writers`` whose chain failed verification (not the ones
    #: an operator quarantined: that is a decision already taken)
    broken_writers: tuple[str, ...] = ()
    #: orphans two writers started (among ``held``)
    contested: int = 0

    @property
    def awaits_human(self) -> bool:
        """A broken writer's sagas, a contested saga, or records one writer forged into
        another's saga: recovery left them for a human to decide."""
        return bool(self.broken_writers or self.contested or self.foreign)

    def count(self, *statuses: str) -> int:
        """How many sagas ended in one of ``statuses``."""
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
        """How many steps were escalated to a human."""
        return sum(len(r.escalations) for r in self.results)

    @property
    def claim_conflicts(self) -> int:
        """How many sagas another daemon held."""
        return self.count("CLAIMED")

    @property
    def compensations_run(self) -> int:
        """How many compensations ran."""
        return sum(r.compensations_run for r in self.results)

    @property
    def ok(self) -> bool:
        """True unless the daemon halted or the sweep stopped early (``halted``, ``error``)."""
        return self.halted is None and self.error is None

    def summary(self) -> str:
        """One line for a human."""
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
        if self.held_writers:
            text += (f"; {self.held} orphan(s) of writers recovery does not act on were left alone: "
                     + "; ".join(self.held_writers))
        if self.foreign:
            text += "; " + "; ".join(self.foreign)
        if self.error:
            text += f"; stopped early: {self.error}"
        return text + f" in {self.duration:.3f}s"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON."""
        return {
            "source": self.source, "started": self.started, "duration": self.duration,
            "records_read": self.records_read, "in_flight": self.in_flight, "live": self.live,
            "quarantined": self.quarantined, "orphans": self.orphans,
            "oldest_orphan_age": self.oldest_orphan_age, "recovered": self.recovered,
            "escalations": self.escalations, "claim_conflicts": self.claim_conflicts,
            "halted": self.halted, "error": self.error, "drained": self.drained,
            "dry_run": self.dry_run, "unknown_types": list(self.unknown_types),
            "held_writers": list(self.held_writers), "held": self.held, "foreign": list(self.foreign),
            "broken_writers": list(self.broken_writers), "contested": self.contested,
            "results": [r.to_dict() for r in self.results],
        }
