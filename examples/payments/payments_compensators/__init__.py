"""What undoes a payment: the compensation handlers of the payments example.

Both the agent (its own rollbacks) and agent-saga-recoveryd (sagas whose agent died) run
them, so both import this package: the recoveryd image is built FROM the project's
recoveryd image with it installed, and the chart is told ``recoveryd.imports:
[payments_compensators]``.

The "bank" is a stand-in kept in the policy-plane Redis (``$AGENT_SAGA_REDIS_URL``), with
the books a real payment provider keeps:

    payments:bank:charges   HASH  charge id -> amount charged
    payments:bank:refunds   HASH  idempotency key -> charge id refunded (applied once per key)
    payments:bank:calls     HASH  idempotency key -> refund requests received (every call)
    payments:bank:callers   HASH  idempotency key -> who sent the last one (pod name)
    payments:bank:recalls   HASH  idempotency key -> wire recalled
    payments:bank:paused    STRING while it exists the bank holds refund requests (an outage)

A refund is idempotent by its key, as a real provider's is: a call repeated after a crash
left it in doubt applies nothing twice.
"""

from __future__ import annotations

import os
import socket
import time
from functools import cache
from typing import Any

from agent_saga import compensator

PREFIX = "payments:bank"
CHARGES, REFUNDS, CALLS, CALLERS, RECALLS, PAUSED = (
    f"{PREFIX}:{k}" for k in ("charges", "refunds", "calls", "callers", "recalls", "paused")
)


@cache
def bank() -> Any:
    """A Redis client for the bank's books (the same Redis as the policy plane)."""
    import redis

    url = os.environ.get("AGENT_SAGA_REDIS_URL", "").strip()
    if not url:
        raise RuntimeError("AGENT_SAGA_REDIS_URL is not set: the bank's books live in that Redis")
    return redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)


def caller() -> str:
    """This process's name in the books: recoveryd's replica id, else the pod's host name."""
    return os.environ.get("AGENT_SAGA_RECOVERYD_DAEMON_ID") or socket.gethostname()


def charge(charge_id: str, amount: int) -> dict[str, Any]:
    """The forward call: the bank takes ``amount`` (the agent's step)."""
    bank().hset(CHARGES, charge_id, amount)
    return {"id": charge_id, "amount": amount}


@compensator("payments.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    """Give a charge back. Every request is counted; the refund is applied once per key."""
    r = bank()
    r.hincrby(CALLS, idempotency_key, 1)
    r.hset(CALLERS, idempotency_key, caller())
    while r.exists(PAUSED):  # the bank is down: the request waits (recoveryd bounds it)
        time.sleep(0.2)
    r.hsetnx(REFUNDS, idempotency_key, charge_id)


@compensator("payments.wire_recall")
def wire_recall(wire: str, idempotency_key: str) -> None:
    """Recall a wire that went out in a saga that then failed (applied once per key)."""
    bank().hsetnx(RECALLS, idempotency_key, wire)
