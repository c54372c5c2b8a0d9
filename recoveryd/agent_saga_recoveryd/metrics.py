"""Prometheus metrics of a recoveryd process, on a private registry.

    agent_saga_recovery_sagas_recovered_total{source,outcome}   closed by this replica
                                                                (outcome: clean | partial)
    agent_saga_recovery_sagas_escalated_total{source}           closed with an escalation
    agent_saga_recovery_escalations_total{source}               steps handed to a human
    agent_saga_recovery_claim_conflicts_total{source}           orphans another replica held
    agent_saga_recovery_compensations_total{source}             handler calls made
    agent_saga_recovery_sweeps_total{source,result}             result: ok | error | halted
    agent_saga_recovery_sweep_duration_seconds{source}          histogram
    agent_saga_recovery_oldest_orphan_age_seconds{source}       since its lease expired
    agent_saga_recovery_orphans{source}                         orphans seen by the last sweep
    agent_saga_recovery_in_flight{source}                       unresolved sagas in the log
    agent_saga_recovery_halted{source}                          1 = fail-closed halt: page someone
    agent_saga_recovery_sweep_stopped{source}                   1 = the last sweep stopped early
                                                                (reason on /readyz); retried
    agent_saga_recovery_draining                                1 after SIGTERM
    agent_saga_recovery_ready                                   1 while /readyz answers 200
    agent_saga_recovery_claim_ttl_seconds                       --claim-ttl: an orphan older than a
                                                                few of these is stuck
    agent_saga_recovery_escalations_open{source}                escalations in the ledger no human
                                                                resolved yet, by the log they came from

``prometheus-client`` is the ``recoveryd`` extra; without it ``render`` says so (HTTP 501)
and everything else works.
"""

from __future__ import annotations

from typing import Any

from agent_saga.recovery import SweepReport

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RecoveryMetrics:
    """Counters fed from ``SweepReport``s; ``render()`` is the /metrics body."""

    def __init__(self) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            self.available = False
            self._prom: Any = None
            return
        self.available = True
        self._prom = prom
        self.registry = prom.CollectorRegistry(auto_describe=True)
        r = self.registry
        ns = "agent_saga_recovery"
        self.recovered = prom.Counter(f"{ns}_sagas_recovered", "Sagas closed by this replica", ["source", "outcome"], registry=r)
        self.escalated = prom.Counter(f"{ns}_sagas_escalated", "Sagas closed with at least one escalation", ["source"], registry=r)
        self.escalations = prom.Counter(f"{ns}_escalations", "Steps handed to a human", ["source"], registry=r)
        self.conflicts = prom.Counter(f"{ns}_claim_conflicts", "Orphans another replica had claimed", ["source"], registry=r)
        self.compensations = prom.Counter(f"{ns}_compensations", "Compensation handler calls made", ["source"], registry=r)
        self.sweeps = prom.Counter(f"{ns}_sweeps", "Sweeps by result", ["source", "result"], registry=r)
        self.duration = prom.Histogram(
            f"{ns}_sweep_duration_seconds", "Duration of one sweep", ["source"], registry=r,
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.oldest = prom.Gauge(f"{ns}_oldest_orphan_age_seconds", "Seconds since the oldest orphan's lease expired", ["source"], registry=r)
        self.orphans = prom.Gauge(f"{ns}_orphans", "Orphaned sagas seen by the last sweep", ["source"], registry=r)
        self.in_flight = prom.Gauge(f"{ns}_in_flight", "Unresolved sagas in the log", ["source"], registry=r)
        self.halted = prom.Gauge(f"{ns}_halted", "1 when recovery halted fail-closed on a log it cannot read or verify", ["source"], registry=r)
        self.stopped = prom.Gauge(
            f"{ns}_sweep_stopped", "1 when the last sweep stopped early (the reason is on /readyz)", ["source"], registry=r,
        )
        self.draining = prom.Gauge(f"{ns}_draining", "1 after SIGTERM: no new claims are taken", registry=r)
        self.ready = prom.Gauge(f"{ns}_ready", "1 while /readyz answers 200 (the reason it does not is on /readyz)",
                                registry=r)
        self.claim_ttl = prom.Gauge(f"{ns}_claim_ttl_seconds", "Seconds a claim lives unrenewed (--claim-ttl)",
                                    registry=r)
        self.escalations_open = prom.Gauge(f"{ns}_escalations_open", "Escalations no human has resolved yet",
                                           ["source"], registry=r)

    def observe(self, rep: SweepReport) -> None:
        """Count one sweep's outcomes."""
        if not self.available:
            return
        s = rep.source
        clean = rep.count("ROLLED_BACK")
        partial = rep.count("ROLLBACK_PARTIAL")
        if clean:
            self.recovered.labels(s, "clean").inc(clean)
        if partial:
            self.recovered.labels(s, "partial").inc(partial)
        if rep.escalated_sagas:
            self.escalated.labels(s).inc(rep.escalated_sagas)
        if rep.escalations:
            self.escalations.labels(s).inc(rep.escalations)
        if rep.claim_conflicts:
            self.conflicts.labels(s).inc(rep.claim_conflicts)
        if rep.compensations_run:
            self.compensations.labels(s).inc(rep.compensations_run)
        result = "halted" if rep.halted else "error" if rep.error else "ok"
        self.sweeps.labels(s, result).inc()
        self.duration.labels(s).observe(rep.duration)
        self.oldest.labels(s).set(rep.oldest_orphan_age)
        self.orphans.labels(s).set(rep.orphans)
        self.in_flight.labels(s).set(rep.in_flight)
        self.halted.labels(s).set(1 if rep.halted else 0)
        self.stopped.labels(s).set(1 if rep.error and not rep.halted else 0)

    def set_draining(self, on: bool) -> None:
        """Set the draining gauge."""
        if self.available:
            self.draining.set(1 if on else 0)

    def set_state(self, *, ready: bool, claim_ttl: float) -> None:
        """Set the readiness and configuration gauges (at each scrape)."""
        if self.available:
            self.ready.set(1 if ready else 0)
            self.claim_ttl.set(claim_ttl)

    def set_open_escalations(self, by_source: dict[str, int]) -> None:
        """Replace the open escalation counts (a source with none left leaves the series)."""
        if self.available:
            self.escalations_open.clear()
            for source, n in by_source.items():
                self.escalations_open.labels(source).set(n)

    def render(self) -> tuple[int, str, bytes]:
        """(HTTP status, content type, body) of /metrics."""
        if not self.available:
            return 501, "text/plain", b"prometheus-client is not installed: pip install 'agent-saga[recoveryd]'\n"
        return 200, CONTENT_TYPE, self._prom.generate_latest(self.registry)
