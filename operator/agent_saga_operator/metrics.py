"""Prometheus metrics of the operator, served on ``/metrics`` (prometheus-client).

    agentsaga_operator_reconciles_total{kind,trigger,result}   handler runs
    agentsaga_operator_reconcile_seconds{kind}                  handler duration
    agentsaga_operator_projection_lag_seconds{kind}             spec change -> document written
    agentsaga_operator_projections_total{kind,op}               documents written / removed
    agentsaga_operator_redis_errors_total{kind}                 policy-plane failures
    agentsaga_operator_objects{kind}                            objects this replica manages
    agentsaga_operator_killswitches_engaged                     KillSwitches in force now
    agentsaga_operator_plane_synced                             1 while the synced marker is set
    agentsaga_operator_plane_rev                                the policy plane's change counter
    agentsaga_operator_plane_reprojections_total{cause}         full re-projections (lost, went_back)

``trigger`` is create / update / resume / resync / delete / expire; ``result`` is ok or
error. Projection lag is measured from the latest spec write the API server recorded
(``managedFields``, one-second resolution) to the end of the projection.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    "last_spec_write",
    "serve",
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
PLANE_SYNCED = Gauge("agentsaga_operator_plane_synced",
                     "1 while the policy plane carries this operator's synced marker, 0 while it re-projects.")
PLANE_REV = Gauge("agentsaga_operator_plane_rev", "The policy plane's change counter at the last marker check.")
PLANE_REPROJECTIONS = Counter(
    "agentsaga_operator_plane_reprojections",
    "Full re-projections begun: cause lost (no marker: a fresh or wiped Redis) or went_back (an older snapshot).",
    ["cause"],
)


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
