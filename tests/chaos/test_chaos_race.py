"""Two daemons racing: two real processes, real Redis claims, one refund per charge.

A worker runs 30 sagas of two charges at once and is killed with all of them in flight.
Two daemon processes are released at the same instant on that log, sharing a RedisLedger
and RedisClaimLock. Every charge must be refunded exactly once, and every refund call
must have been made exactly once (the second call was never made). A third daemon run
afterwards does nothing.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from agent_saga.history import ROLLED_BACK
from chaos_bank import Bank
from chaos_checks import chain_ok, sagas
from chaos_support import PYTHON, subprocess_env

N = 30

RACER = """
import asyncio, json, os, sys, time
from agent_saga.recovery import RecoveryDaemon, RedisClaimLock, RedisLedger

async def main():
    wal, url, go = sys.argv[1:4]
    while not os.path.exists(go):
        await asyncio.sleep(0.001)
    d = RecoveryDaemon(wal, ledger=RedisLedger(url), lock=RedisClaimLock(url), imports=["chaos_handlers"],
                       clock=lambda: time.time() + 3600, concurrency=2, writer_wait=10)
    total = {"recovered": 0, "conflicts": 0, "calls": 0, "sweeps": 0, "statuses": {}}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        rep = await d.sweep()
        if rep.halted:
            print(json.dumps({"halted": rep.halted})); sys.exit(2)
        total["sweeps"] += 1
        total["recovered"] += rep.recovered
        total["conflicts"] += rep.claim_conflicts
        total["calls"] += rep.compensations_run
        for r in rep.results:
            total["statuses"][r.status] = total["statuses"].get(r.status, 0) + 1
        if rep.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    await d.close()
    print(json.dumps(total))

asyncio.run(main())
"""


def test_two_daemons_racing_issue_one_refund_per_charge(tmp_path: Path, fresh_redis) -> None:  # type: ignore[no-untyped-def]
    wal, bank, trace = tmp_path / "race.wal", tmp_path / "race.bank", tmp_path / "trace"
    env = subprocess_env()
    worker = subprocess.run(
        [PYTHON, "-m", "chaos_worker", "many", str(wal), str(bank), str(trace), str(N), "30"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert worker.returncode == 137, worker.stderr
    chain_ok(wal)
    assert len(Bank(bank).state()) == 2 * N
    go = tmp_path / "go"
    racers = [
        subprocess.Popen([PYTHON, "-c", RACER, str(wal), fresh_redis.url, str(go)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    time.sleep(0.5)  # both interpreters up and polling for the start signal
    go.write_text("go")
    outs = [r.communicate(timeout=180) for r in racers]
    for r, (_out, err) in zip(racers, outs, strict=True):
        assert r.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    print("racers:", results)
    assert sum(r["recovered"] for r in results) == N
    chain_ok(wal)
    assert {s.status for s in sagas(wal).values()} == {ROLLED_BACK}
    for c in Bank(bank).state().values():
        assert len(c.applied) == 1, f"{c.id}: applied {c.applied}"
        assert len(c.attempts) == 1, f"{c.id}: the refund was called {len(c.attempts)} times"
    assert sum(r["calls"] for r in results) == 2 * N
    # A third run, later: nothing left to do, nothing called.
    third = subprocess.run([PYTHON, "-c", RACER, str(wal), fresh_redis.url, str(go)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout.strip().splitlines()[-1])["calls"] == 0
    assert sum(len(c.attempts) for c in Bank(bank).state().values()) == 2 * N
