"""A worker for the crash test: charge on Stripe, update a row in PostgreSQL, say so, and
wait to be SIGKILLed before the saga can finish."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import e2e_credentials  # noqa: F401 - installs the resolver
from agent_saga import FileWAL, saga_scope
from agent_saga.connectors import postgres, stripe


async def main(wal_path: str, ready: str) -> None:
    wal = FileWAL(wal_path)
    async with saga_scope(wal, lease_seconds=1.0) as saga:
        charge = await stripe.charge(saga, amount=4200, currency="usd", customer="cus_e2e", credential_ref="stripe_test")
        await postgres.update(saga, credential_ref="orders_db", table="orders", key={"tenant": "t1", "id": 7},
                              values={"status": "paid"})
        Path(ready).write_text(charge["id"])
        await asyncio.Event().wait()  # SIGKILLed here, mid-saga


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
