"""The demo fleet's agent and its local ledger (used by hack/demo_cluster.py).

    python hack/demo_fleet.py REDIS_URL NAMESPACE WAL_PATH LEDGER_PATH NAME

An agent runs sagas of three ``ledger.charge`` steps against a local SQLite ledger,
through a ``PreFlightGate`` that reads the policy plane (kill switch, BudgetLimits) from
Redis; it never talks to Kubernetes. It prints one JSON line per event. The recovery
daemons import this module for the ``demo.refund`` compensator.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from typing import Any

from agent_saga import Compensation, FileWAL, GateBlocked, compensator, saga_scope

SCHEMA = """CREATE TABLE IF NOT EXISTS ledger (
  key TEXT PRIMARY KEY, kind TEXT NOT NULL, agent TEXT, saga TEXT, charge TEXT, amount INTEGER, at REAL)"""


def _db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=10, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(SCHEMA)
    return db


def charge(ledger: str, agent: str, saga: str, amount: int, idempotency_key: str) -> dict[str, Any]:
    """Post a charge once per idempotency key; returns its id."""
    db = _db(ledger)
    try:
        db.execute("INSERT OR IGNORE INTO ledger VALUES (?, 'charge', ?, ?, ?, ?, ?)",
                   (idempotency_key, agent, saga, idempotency_key, amount, time.time()))
    finally:
        db.close()
    return {"charge_id": idempotency_key, "amount": amount}


@compensator("demo.refund")
def refund(ledger: str, charge_id: str, idempotency_key: str) -> str:
    """Refund a charge once (by the refund's idempotency key)."""
    db = _db(ledger)
    try:
        row = db.execute("SELECT agent, saga, amount FROM ledger WHERE key = ?", (charge_id,)).fetchone()
        if row is None:
            return "no such charge"
        db.execute("INSERT OR IGNORE INTO ledger VALUES (?, 'refund', ?, ?, ?, ?, ?)",
                   (idempotency_key, row[0], row[1], charge_id, -row[2], time.time()))
    finally:
        db.close()
    return "refunded"


def say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def main() -> None:
    from agent_saga.controls import (
        KillSwitch,
        PreFlightGate,
        RedisLimitSource,
        RedisLimitStore,
        RedisSwitchStore,
    )

    url, namespace, wal_path, ledger, name = sys.argv[1:6]
    wal = FileWAL(wal_path)
    switches = RedisSwitchStore(url, grace=5, heartbeat=0.2, namespaces=[namespace])
    switches.start()
    limits = RedisLimitSource(url, namespaces=[namespace], heartbeat=0.5)
    limits.start()
    gate = PreFlightGate(limits=limits, store=RedisLimitStore(url), checks=[KillSwitch(switches, wal=wal)])
    say(agent=name, event="ready")
    n = 0
    while True:
        n += 1
        try:
            async with saga_scope(wal, gate, name=f"{name}-order", lease_seconds=2) as saga:
                for i in range(3):
                    def fwd(idempotency_key: str, saga_id: str = saga.saga_id) -> dict[str, Any]:
                        return charge(ledger, name, saga_id, 10, idempotency_key)

                    await saga.execute(
                        "ledger.charge", "COMPENSABLE", fwd,
                        lambda r: Compensation(handler="demo.refund",
                                               kwargs={"ledger": ledger, "charge_id": r["charge_id"]}),
                        policy_args={"amount": 10})
                    say(agent=name, event="step", saga=saga.saga_id, step=i)
                    await asyncio.sleep(0.25)
            say(agent=name, event="committed", saga=saga.saga_id)
        except GateBlocked as e:
            say(agent=name, event="refused", reason=str(e).split(": ", 1)[-1])
            await asyncio.sleep(0.5)


if __name__ == "__main__":
    asyncio.run(main())
