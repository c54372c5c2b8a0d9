"""Optimistic vs transactional, side by side, against the same flaky payment world.

A checkout agent charges a card for each item, then books shipping. The shipping API is
down. The optimistic agent (plain calls) leaves every charge standing; the transactional
agent (the same calls as saga steps) refunds them newest first and can prove it from its
log. A third run shows the timeout case: a charge whose reply never came is UNKNOWN — it
may have happened — so it is refunded by its deterministic idempotency key rather than
assumed not to have happened.

Run: python examples/chaos_demo.py   (or `make demo`)
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from agent_saga import (
    ActionSemantics,
    Compensation,
    FileWAL,
    StepOutcomeUnknown,
    compensator,
    read_log,
    saga_scope,
    verify_records,
)

C = ActionSemantics.COMPENSABLE
ITEMS = [("keyboard", 12_900), ("monitor", 31_900), ("cable", 1_900)]


class PaymentWorld:
    """A card network: charges by id, refunds keyed by idempotency key (applied once)."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.refunded: set[str] = set()
        self.refund_keys: set[str] = set()
        self.slow_next = False

    def outstanding(self) -> int:
        return sum(v for k, v in self.charges.items() if k not in self.refunded)


world = PaymentWorld()


async def charge(amount: int, idempotency_key: str = "") -> dict:
    cid = f"ch_{len(world.charges) + 1:04d}"
    world.charges[cid] = amount
    if world.slow_next:  # the network accepted the charge, the reply is lost
        world.slow_next = False
        await asyncio.sleep(5)
    return {"id": cid, "amount": amount}


@compensator("demo.refund")
async def refund(charge_id: str | None = None, idempotency_key: str = "", *, by_key: str | None = None) -> None:
    if idempotency_key in world.refund_keys:
        return  # a processor absorbs a duplicate refund by its idempotency key
    world.refund_keys.add(idempotency_key)
    if charge_id is None and by_key is not None:
        # outcome unknown: the charge id was never seen; find it by the forward key
        charge_id = next((c for c, k in _forward_keys.items() if k == by_key), None)
    if charge_id is not None:
        world.refunded.add(charge_id)


_forward_keys: dict[str, str] = {}


async def charge_tracked(amount: int, idempotency_key: str) -> dict:
    # the card network remembers which idempotency key created which charge
    before = set(world.charges)
    try:
        return await charge(amount, idempotency_key)
    finally:
        for cid in set(world.charges) - before:
            _forward_keys[cid] = idempotency_key


async def book_shipping() -> None:
    raise ConnectionError("shipping API: 503 Service Unavailable")


def dollars(cents: int) -> str:
    return f"${cents / 100:,.2f}"


async def optimistic() -> int:
    world.__init__()  # type: ignore[misc]
    try:
        for _, amount in ITEMS:
            await charge(amount)
        await book_shipping()
    except ConnectionError:
        pass
    return world.outstanding()


async def transactional(wal: FileWAL) -> tuple[int, bool]:
    world.__init__()  # type: ignore[misc]
    try:
        async with saga_scope(wal, name="checkout") as saga:
            for item, amount in ITEMS:
                await saga.execute(
                    f"stripe.charge:{item}", C,
                    forward=lambda amount=amount: charge(amount),
                    compensate=lambda r: Compensation(handler="demo.refund", kwargs={"charge_id": r["id"]}),
                    policy_args={"amount": amount})
            await saga.execute("shipping.book", ActionSemantics.REVERSIBLE, forward=book_shipping)
    except ConnectionError:
        pass
    report = saga.rollback_report
    return world.outstanding(), bool(report and report.clean)


async def timeout_case(wal: FileWAL) -> tuple[int, str]:
    world.__init__()  # type: ignore[misc]
    world.slow_next = True
    outcome = ""
    try:
        async with saga_scope(wal, name="checkout-timeout") as saga:
            await saga.execute(
                "stripe.charge", C,
                forward=charge_tracked_for(ITEMS[0][1]),
                # derivable without a result: refund by the forward's idempotency key
                compensate=lambda r: Compensation(
                    handler="demo.refund",
                    kwargs={"charge_id": r["id"]} if r else {"by_key": saga_key[0]}),
                timeout=0.2)
    except StepOutcomeUnknown as exc:
        outcome = type(exc).__name__
    return world.outstanding(), outcome


saga_key: list[str] = [""]


def charge_tracked_for(amount: int):
    async def fwd(idempotency_key: str) -> dict:
        saga_key[0] = idempotency_key
        return await charge_tracked(amount, idempotency_key)
    return fwd


async def main() -> int:
    wal_path = Path(tempfile.mkdtemp(prefix="agent-saga-chaos-")) / "chaos.wal"
    wal = FileWAL(wal_path)
    total = sum(a for _, a in ITEMS)
    print(f"checkout: {len(ITEMS)} charges totalling {dollars(total)}, then shipping (which is down)\n")
    opt = await optimistic()
    tx, clean = await transactional(wal)
    unk, outcome = await timeout_case(wal)
    wal.close()
    chain = verify_records(read_log(wal_path))
    rows = [
        ("outstanding after failure", dollars(opt), dollars(tx)),
        ("customer charged for nothing", "yes" if opt else "no", "yes" if tx else "no"),
        ("rollback report", "none", "clean" if clean else "PARTIAL"),
        ("audit log", "none", "chain intact" if chain.ok else "BROKEN"),
    ]
    print(f"  {'':30} {'optimistic':>14} {'transactional':>15}")
    for name, a, b in rows:
        print(f"  {name:30} {a:>14} {b:>15}")
    print(f"\ntimed-out charge: {outcome or 'no timeout?'} -> refunded by idempotency key, "
          f"outstanding {dollars(unk)}")
    ok = opt == total and tx == 0 and clean and unk == 0 and outcome and chain.ok
    print("\nresult: " + ("clean" if ok else "NOT CLEAN"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
