"""A fleet against one budget: 8 real processes x 200 concurrent charges each against a
50,000 daily budget in Redis never authorise a cent more than 50,000 (summed from each
process's own ledger of what it was allowed), and reach it (no under-spend beyond one
charge). Nothing is debited for a refused charge: the store's total equals the ledgers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from agent_saga.controls import BudgetLimit, RedisLimitStore
from fixtures.redis_server import RedisServer

PROCESSES = 8
CHARGES = 200
BUDGET = 50_000
MAX_CHARGE = 500

WORKER = r"""
import asyncio, json, os, random, sys, time
from agent_saga.controls import BudgetLimit, PreFlightGate, RedisLimitStore
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics

url, ledger, go, seed, n, budget, max_charge = sys.argv[1:8]

async def main():
    store = RedisLimitStore(url, socket_timeout=30, connect_timeout=10, pool_timeout=30)
    gate = PreFlightGate(
        limits=[BudgetLimit("daily-spend", arg="amount", max_total=int(budget), window=86_400)],
        store=store, default_rules=(),
    )
    rnd = random.Random(int(seed))
    amounts = [rnd.randint(1, int(max_charge)) for _ in range(int(n))]
    await store.declare([gate.limits[0].spec()])  # connect before the race
    open(ledger + ".ready", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(go):  # start together, so the processes really race
        if time.monotonic() > deadline:
            sys.exit("never told to go")
        await asyncio.sleep(0.002)

    async def charge(i, amount):
        d = await gate.decide(StepRequest(f"w{seed}", f"w{seed}/{i}", "stripe.charge",
                                          ActionSemantics.COMPENSABLE, {"amount": amount}))
        return {"amount": amount, "allowed": d.allowed, "decided_by": d.decided_by, "reason": d.reason}

    results = await asyncio.gather(*(charge(i, a) for i, a in enumerate(amounts)))
    await store.aclose()
    with open(ledger + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(ledger + ".tmp", ledger)

asyncio.run(main())
"""


async def test_8_processes_x_200_concurrent_charges_never_exceed_the_budget_and_reach_it(
    fresh_redis: RedisServer, tmp_path: Path
):
    go = tmp_path / "go"
    procs = []
    for p in range(PROCESSES):
        ledger = tmp_path / f"ledger-{p}.json"
        procs.append((ledger, subprocess.Popen(
            [sys.executable, "-c", WORKER, fresh_redis.url, str(ledger), str(go), str(p + 1),
             str(CHARGES), str(BUDGET), str(MAX_CHARGE)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )))
    deadline = time.monotonic() + 120
    while not all(Path(f"{ledger}.ready").exists() for ledger, _ in procs):  # all connected: race
        for _, proc in procs:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.01)
    go.touch()
    results = []
    for ledger, proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode()[-2000:]
        results += json.loads(ledger.read_text())

    assert len(results) == PROCESSES * CHARGES
    allowed = [r["amount"] for r in results if r["allowed"]]
    refused = [r for r in results if not r["allowed"]]
    total = sum(allowed)
    assert total <= BUDGET, f"authorised {total} against a budget of {BUDGET}"
    assert total >= BUDGET - MAX_CHARGE, f"under-spent: {total} of {BUDGET} with {len(refused)} refusals"
    assert refused, "the fleet asked for far more than the budget"
    store_errors = {r["reason"] for r in refused if r["decided_by"] != "limit:daily-spend"}
    assert not store_errors, store_errors
    # every refusal saw a window too full for its own amount
    assert all(r["amount"] > BUDGET - total for r in refused[-10:])

    store = RedisLimitStore(fresh_redis.url)
    try:
        (usage,) = await store.usage([BudgetLimit("daily-spend", arg="amount", max_total=BUDGET, window=86_400).spec()])
    finally:
        await store.aclose()
    assert usage.used == total and usage.entries == len(allowed), "nothing was debited for a refused charge"
