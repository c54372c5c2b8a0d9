"""Agent-side Prometheus metrics (``setup_metrics``; ``pip install 'agent-saga[metrics]'``).

    from agent_saga import setup_metrics
    setup_metrics()                      # prometheus_client's default registry
    prometheus_client.start_http_server(9102)

Metrics (the process that runs the sagas; the recovery daemon has its own, see
``agent-saga-recoveryd``):

    agent_saga_steps_total{semantics, outcome}    steps run: outcome committed | failed |
                                                  unknown | refused
    agent_saga_refusals_total{control}            steps a gate refused, by the control
                                                  that refused (the PreFlightGate stage:
                                                  kill_switch, limits, approval, ...; another
                                                  gate's decided_by; agent_saga.engine)
    agent_saga_rollbacks_total{result}            in-process rollbacks: clean | partial
    agent_saga_wal_fence_seconds                  histogram: how long a durability fence
                                                  waited for the log (fences already
                                                  satisfied when asked wait 0 and are not
                                                  observed)
    agent_saga_wal_failstops_total{how}           WAL writers that failed-stop: how is
                                                  stalled (the log did not answer within
                                                  its bound) or failed (a write raised);
                                                  the writer refuses every record after
    agent_saga_policy_plane_errors_total{kind}    failed reads of the policy plane (Redis),
                                                  by the reader's kind (KillSwitch,
                                                  BudgetLimit, SagaPolicy, ...); one per
                                                  attempt while it stays unreachable

Invariants:
- Off by default; importing ``agent_saga`` never imports prometheus_client (this module
  imports it inside ``setup_metrics``).
- Every series counts something the engine did: nothing is pre-filled or estimated.
"""

from __future__ import annotations

from typing import Any

from . import observe as _observe
from .errors import ConfigurationError

__all__ = ["SagaMetrics", "setup_metrics", "teardown_metrics"]

#: Fence waits are milliseconds for a local fsync, up to seconds for a slow replica.
FENCE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SagaMetrics(_observe.Observer):
    """The observer that counts (see the module doc); ``setup_metrics`` makes one."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Histogram

        self.registry = registry
        self.steps = Counter("agent_saga_steps", "Saga steps run, by declared semantics and outcome",
                             ["semantics", "outcome"], registry=registry)
        self.refusals = Counter("agent_saga_refusals", "Steps refused before they ran, by the control that refused",
                                ["control"], registry=registry)
        self.rollbacks = Counter("agent_saga_rollbacks", "In-process saga rollbacks, clean or partial",
                                 ["result"], registry=registry)
        self.fence = Histogram("agent_saga_wal_fence_seconds", "Time a WAL durability fence waited for the log",
                               buckets=FENCE_BUCKETS, registry=registry)
        self.failstops = Counter("agent_saga_wal_failstops", "WAL writers that failed-stop, stalled or failed",
                                 ["how"], registry=registry)
        self.plane_errors = Counter("agent_saga_policy_plane_errors", "Failed reads of the policy plane (Redis)",
                                    ["kind"], registry=registry)

    def step_started(self, saga_id: str, step_id: str, tool: str, semantics: str) -> Any:
        """Remember the step's semantics for its outcome."""
        return semantics

    def step_ended(self, handle: Any, outcome: str, error: BaseException | None) -> None:
        """Count the step by semantics and outcome."""
        if handle is not None:
            self.steps.labels(semantics=handle, outcome=outcome).inc()

    def step_refused(
        self, saga_id: str, step_id: str, tool: str, semantics: str, control: str, error: BaseException
    ) -> None:
        """Count the refused step and the control that refused it."""
        self.steps.labels(semantics=semantics, outcome="refused").inc()
        self.refusals.labels(control=control).inc()

    def rollback_ended(self, saga_id: str, clean: bool) -> None:
        """Count the rollback, clean or partial."""
        self.rollbacks.labels(result="clean" if clean else "partial").inc()

    def fence_waited(self, seconds: float) -> None:
        """Observe the fence's wait."""
        self.fence.observe(seconds)

    def wal_failed(self, wal: str, how: str) -> None:
        """Count the writer's fail-stop."""
        self.failstops.labels(how=how).inc()

    def plane_unreachable(self, kind: str) -> None:
        """Count the failed read."""
        self.plane_errors.labels(kind=kind).inc()


_installed: dict[int, SagaMetrics] = {}


def setup_metrics(registry: Any = None) -> SagaMetrics:
    """Count steps, refusals, rollbacks, WAL fence waits and fail-stops, and failed
    policy-plane reads into ``registry`` (default:
    ``prometheus_client.REGISTRY``). Idempotent per registry. Raises ``ConfigurationError``
    naming the extra to install if prometheus-client is missing."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(
            f"setup_metrics() needs prometheus-client ({exc}): pip install 'agent-saga[metrics]'"
        ) from None
    reg = prometheus_client.REGISTRY if registry is None else registry
    found = _installed.get(id(reg))
    if found is not None and found.registry is reg:
        return found
    metrics = SagaMetrics(reg)
    _installed[id(reg)] = metrics
    _observe.add_observer(metrics)
    return metrics


def teardown_metrics(registry: Any = None) -> None:
    """Stop counting into ``registry`` (default: every registry set up); the series stay
    registered (idempotent)."""
    for key, metrics in list(_installed.items()):
        if registry is None or metrics.registry is registry:
            _observe.remove_observer(metrics)
            del _installed[key]
