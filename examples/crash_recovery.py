"""kill -9 in the middle of a payment saga, and an independent process that undoes it.

An agent process charges two cards (each charge durable, with its refund derived from the
charge id) and is SIGKILLed while a third call is in flight: no except, no finally, no
event-loop shutdown. The charges are real in the (file-backed) bank. A RecoveryDaemon in
another process waits for the dead saga's lease to expire, refunds both charges through
the named handler, under the same idempotency keys the agent would have used, and writes
the resolution into the dead process's own log. Running it again refunds nothing more.
`certify` then proves every effect is accounted for.

Run: python examples/crash_recovery.py   (or `make demo`)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent_saga import (
    ActionSemantics,
    Compensation,
    FileWAL,
    RecoveryDaemon,
    certify,
    compensator,
    read_log,
    saga_scope,
    saga_states,
)

C = ActionSemantics.COMPENSABLE


class Bank:
    """A file-backed card network: charges, refund attempts and refunds applied."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> dict:
        if not self.path.exists():
            return {"charges": {}, "refund_attempts": [], "refunded": []}
        return json.loads(self.path.read_text())

    def _save(self, d: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(d))
        os.replace(tmp, self.path)

    def charge(self, amount: int) -> dict:
        d = self._load()
        cid = f"ch_{len(d['charges']) + 1}"
        d["charges"][cid] = amount
        self._save(d)
        return {"id": cid, "amount": amount}

    def refund(self, charge_id: str, key: str) -> None:
        d = self._load()
        d["refund_attempts"].append(key)
        if key not in {k for _, k in d["refunded"]}:  # the processor's idempotency
            d["refunded"].append([charge_id, key])
        self._save(d)

    def outstanding(self) -> int:
        d = self._load()
        gone = {c for c, _ in d["refunded"]}
        return sum(a for c, a in d["charges"].items() if c not in gone)

    def attempts(self) -> int:
        return len(self._load()["refund_attempts"])


BANK = Bank(Path(os.environ.get("DEMO_BANK", "/tmp/agent-saga-demo-bank.json")))


@compensator("bank.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    BANK.refund(charge_id, idempotency_key)


async def agent(wal_path: str, ready: str) -> None:
    """The agent process: two durable charges, then it dies mid-call."""

    def transfer_in_flight() -> None:
        Path(ready).write_text("in flight")
        time.sleep(60)  # SIGKILL arrives here

    wal = FileWAL(wal_path)
    async with saga_scope(wal, name="checkout", lease_seconds=1.0) as saga:
        for amount in (4_200, 9_900):
            await saga.execute("bank.charge", C, lambda amount=amount: BANK.charge(amount),
                               lambda r: Compensation(handler="bank.refund", kwargs={"charge_id": r["id"]}),
                               policy_args={"amount": amount})
        await saga.execute("bank.transfer", ActionSemantics.REVERSIBLE, transfer_in_flight)


def dollars(cents: int) -> str:
    return f"${cents / 100:,.2f}"


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="agent-saga-crash-"))
    wal_path, ready = tmp / "agent.wal", tmp / "ready"
    env = {**os.environ, "DEMO_BANK": str(tmp / "bank.json")}
    BANK.path = tmp / "bank.json"

    print("an agent charges two cards, then is killed with SIGKILL mid-call")
    child = subprocess.Popen([sys.executable, __file__, "--agent", str(wal_path), str(ready)], env=env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            print("the agent did not reach its third call")
            return 1
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    print(f"  killed pid {child.pid}: {dollars(BANK.outstanding())} charged and not refunded")
    (saga,) = saga_states(r for _, r in read_log(wal_path)).values()
    print(f"  the log: saga {saga.saga_id} {saga.status}, "
          f"{sum(1 for s in saga.steps.values() if s.state == 'COMMITTED')} committed charges with their refunds")

    print("\na recovery daemon in another process takes over once the saga's lease expires")
    return asyncio.run(recover(wal_path))


async def recover(wal_path: Path) -> int:
    daemon = RecoveryDaemon(wal_path, lease_grace=0.2)
    deadline = time.monotonic() + 30
    while True:
        report = await daemon.sweep()
        if report.results:
            break
        if time.monotonic() > deadline:
            print("  the daemon never found the orphan")
            return 1
        await asyncio.sleep(0.2)  # the lease is still running: a live process is never touched
    print(f"  {report.summary()}")
    again = await RecoveryDaemon(wal_path, lease_grace=0.2).sweep()
    print(f"  second run: {again.summary()}")

    records = [r for _, r in read_log(wal_path)]
    cert = certify(records)
    print(f"\nbank: {dollars(BANK.outstanding())} outstanding, {BANK.attempts()} refund call(s) for 2 charges")
    print(f"certify: {'every effect accounted for' if cert.ok else 'NOT certified'}")
    ok = BANK.outstanding() == 0 and BANK.attempts() == 2 and cert.ok
    print("\nresult: " + ("clean" if ok else "NOT CLEAN"))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--agent":
        asyncio.run(agent(sys.argv[2], sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
