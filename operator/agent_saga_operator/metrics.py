"""Prometheus metrics of the operator, served on ``/metrics`` (prometheus-client).

    agentsaga_operator_reconciles_total{kind,trigger,result}   handler runs
    agentsaga_operator_reconcile_seconds{kind}                  handler duration
    agentsaga_operator_projection_lag_seconds{kind}             spec change -> document written
    agentsaga_operator_projections_total{kind,op}               documents written / removed
    agentsaga_operator_redis_errors_total{kind}                 policy-plane failures
    agentsaga_operator_objects{kind}                            objects this replica manages
    agentsaga_operator_killswitches_engaged                     KillSwitches in force now
    agentsaga_operator_ack_notifications_total                  agent heartbeat notifications received
    agentsaga_operator_ack_reads_total                          reads of every heartbeat (tally steps)
    agentsaga_operator_plane_synced                             1 while the synced marker is set
    agentsaga_operator_plane_rev                                the policy plane's change counter
    agentsaga_operator_plane_reprojections_total{cause}         full re-projections (lost, went_back)

State, read from this replica's memory at each scrape (``StateCollector``; a standby
replica exports no series):

    agentsaga_operator_agents{kind,namespace,name,state}        live agents a lever governs
                                                                (state matched) and those that
                                                                apply its generation (acknowledged)
    agentsaga_operator_budget_used{namespace,name}              a BudgetLimit's use in its fullest
    agentsaga_operator_budget_max{namespace,name}               window, and its cap (status.used, .max)
    agentsaga_operator_approval_requested_timestamp_seconds{namespace,name,tool}
    agentsaga_operator_approval_deadline_timestamp_seconds{namespace,name,tool}
                                                                each approval request still
                                                                pending in the policy plane

``trigger`` is create / update / resume / resync / delete / expire; ``result`` is ok or
error. Projection lag is measured from the latest spec write the API server recorded
(``managedFields``, one-second resolution) to the end of the projection. The state series
exist only once known: no ``agents`` series before the first heartbeat read, none for a
KillSwitch no longer engaged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

__all__ = [
    "ACK_NOTIFICATIONS",
    "ACK_READS",
    "HEARTBEAT_BUCKET_MAX",
    "KILLSWITCHES_ENGAGED",
    "OBJECTS",
    "PLANE_REPROJECTIONS",
    "PLANE_REV",
    "PLANE_SYNCED",
    "PROJECTIONS",
    "PROJECTION_LAG",
    "RECONCILES",
    "RECONCILE_SECONDS",
    "REDIS_ERRORS",
    "StateCollector",
    "Waiting",
    "last_spec_write",
    "serve",
    "watch",
]

RECONCILES = Counter(
    "agentsaga_operator_reconciles", "Reconciliations by kind, trigger and result.", ["kind", "trigger", "result"]
)
RECONCILE_SECONDS = Histogram(
    "agentsaga_operator_reconcile_seconds", "Time to reconcile one object.", ["kind"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
PROJECTION_LAG = Histogram(
    "agentsaga_operator_projection_lag_seconds",
    "From the latest spec write (API server, 1 s resolution) to the document in Redis.", ["kind"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
PROJECTIONS = Counter(
    "agentsaga_operator_projections", "Policy-plane documents written or removed.", ["kind", "op"]
)
REDIS_ERRORS = Counter("agentsaga_operator_redis_errors", "Policy-plane (Redis) failures.", ["kind"])
OBJECTS = Gauge("agentsaga_operator_objects", "Objects this replica currently manages.", ["kind"])
KILLSWITCHES_ENGAGED = Gauge("agentsaga_operator_killswitches_engaged", "KillSwitches in force now.")
ACK_NOTIFICATIONS = Counter("agentsaga_operator_ack_notifications",
                            "Agent heartbeat notifications received (an applied state changed).")
ACK_READS = Counter("agentsaga_operator_ack_reads",
                    "Reads of every live heartbeat by the acknowledgement tally (one per burst of notifications).")

HEARTBEAT_BUCKET_MAX = Gauge("agentsaga_operator_heartbeat_bucket_max",
                             "The most entries one heartbeat index key holds (past 480: over ~64 KB).")
PLANE_SYNCED = Gauge("agentsaga_operator_plane_synced",
                     "1 while the policy plane carries this operator's synced marker, 0 while it re-projects.")
PLANE_REV = Gauge("agentsaga_operator_plane_rev", "The policy plane's change counter at the last marker check.")
PLANE_REPROJECTIONS = Counter(
    "agentsaga_operator_plane_reprojections",
    "Full re-projections begun: cause lost (no marker: a fresh or wiped Redis) or went_back (an older snapshot).",
    ["cause"],
)


@dataclass(frozen=True, slots=True)
class Waiting:
    """An approval request pending in the policy plane, as the Approval bridge read it."""

    namespace: str
    tool: str
    requested_at: float  # epoch seconds
    deadline: float


class StateCollector:
    """The state series (module doc), read from the operator's ``Context`` at each scrape:
    a value is never older than the memory it comes from, and a series leaves with the
    object. Registered once; ``watch(ctx)`` points it at the running operator's context."""

    ctx: Any = None

    def collect(self) -> Iterator[Any]:
        """The families, empty until ``watch`` (their names are always exported)."""
        from prometheus_client.core import GaugeMetricFamily

        from .acks import tally

        agents = GaugeMetricFamily("agentsaga_operator_agents", "Live agents a lever governs (state=matched) and "
                                   "those applying its generation (state=acknowledged).",
                                   labels=["kind", "namespace", "name", "state"])
        used = GaugeMetricFamily("agentsaga_operator_budget_used", "A BudgetLimit's use in its fullest window.",
                                 labels=["namespace", "name"])
        cap = GaugeMetricFamily("agentsaga_operator_budget_max", "A BudgetLimit's cap per window.",
                                labels=["namespace", "name"])
        asked = GaugeMetricFamily("agentsaga_operator_approval_requested_timestamp_seconds",
                                  "When a pending approval request was made (epoch seconds).",
                                  labels=["namespace", "name", "tool"])
        deadline = GaugeMetricFamily("agentsaga_operator_approval_deadline_timestamp_seconds",
                                     "When a pending approval request expires, denied (epoch seconds).",
                                     labels=["namespace", "name", "tool"])
        ctx = self.ctx
        if ctx is not None:
            fleet = ctx.fleet
            for t in list(ctx.tracked.values()):
                if fleet is None or not t.engaged:
                    continue
                n = tally(fleet, t)
                agents.add_metric([t.kind, t.namespace, t.name, "matched"], n.matched)
                agents.add_metric([t.kind, t.namespace, t.name, "acknowledged"], n.acknowledged)
            for id_, (u, m) in sorted(ctx.budgets.items()):
                ns, name = id_.split("/", 1)
                used.add_metric([ns, name], u)
                cap.add_metric([ns, name], m)
            for request_id, w in sorted(ctx.waiting.items()):
                asked.add_metric([w.namespace, request_id, w.tool], w.requested_at)
                deadline.add_metric([w.namespace, request_id, w.tool], w.deadline)
        yield from (agents, used, cap, asked, deadline)


STATE = StateCollector()
REGISTRY.register(STATE)


def watch(ctx: Any) -> None:
    """Export ``ctx``'s state (the running operator's ``Context``) from now on."""
    STATE.ctx = ctx


def last_spec_write(meta: Mapping[str, Any]) -> datetime | None:
    """The latest time a manager other than the status subresource wrote the object."""
    latest: datetime | None = None
    for entry in meta.get("managedFields") or ():
        if entry.get("subresource") == "status" or not entry.get("time"):
            continue
        try:
            when = datetime.fromisoformat(entry["time"])
        except ValueError:
            continue
        if latest is None or when > latest:
            latest = when
    return latest


def observe_lag(kind: str, meta: Mapping[str, Any], now: datetime | None = None) -> None:
    written = last_spec_write(meta)
    if written is None:
        return
    now = now or datetime.now(UTC)
    PROJECTION_LAG.labels(kind).observe(max(0.0, (now - written).total_seconds()))


def serve(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> None:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread (port 0: do nothing)."""
    if port:
        start_http_server(port, addr=addr, registry=registry)
