"""agent-saga-recoveryd: the recovery fleet process.

N replicas share nothing but Redis: each sweeps the log(s) it is given, claims orphaned
sagas with leases in Redis (so two replicas never compensate the same step), resolves
them with ``agent_saga.recovery.RecoveryDaemon``, and exposes Prometheus metrics and
liveness/readiness endpoints. SIGTERM drains: the claims in hand are finished, no new
one is taken, the process exits 0.

    agent-saga-recoveryd --wal-url 'redis://redis:6379/0?key=agent-saga:wal' \\
        --redis-url redis://redis:6379/0 --imports myapp.handlers --metrics-port 9102
"""

from .app import Recoveryd, main
from .config import Config, parse_args
from .metrics import RecoveryMetrics

__all__ = ["Config", "RecoveryMetrics", "Recoveryd", "main", "parse_args"]
