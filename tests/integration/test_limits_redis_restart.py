"""The brief's stated limit, asserted so it cannot quietly stop being true: spend windows
live in the limit store, not the WAL. With the in-process store a crashed and restarted
agent starts its window fresh (a crash loop can spend the daily budget once per restart);
with RedisLimitStore it does not."""

from __future__ import annotations

import os
import subprocess
import sys

WORKER = r"""
import asyncio, os, sys
from agent_saga.controls import BudgetLimit, InProcessLimitStore, PreFlightGate, RedisLimitStore
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics

kind, url = sys.argv[1], sys.argv[2]
store = InProcessLimitStore() if kind == "in-process" else RedisLimitStore(url)

async def main():
    gate = PreFlightGate(limits=[BudgetLimit("daily-spend", arg="amount", max_total=1000, window=86_400)],
                         store=store, default_rules=())
    spent = 0
    for i in range(20):
        d = await gate.decide(StepRequest("s", f"s/{i}", "stripe.charge", ActionSemantics.COMPENSABLE,
                                          {"amount": 100}))
        spent += 100 if d.allowed else 0
    print(spent, flush=True)
    os._exit(0)  # a crash: no atexit, no finally, no event-loop shutdown

asyncio.run(main())
"""


def run_agent(kind: str, url: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", WORKER, kind, url],
        capture_output=True, text=True, timeout=120, env={**os.environ, "AGENT_SAGA_SINGLE_PROCESS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip())


def test_in_process_store_a_restarted_process_starts_its_window_fresh():
    assert run_agent("in-process", "") == 1000
    assert run_agent("in-process", "") == 1000, "the brief's stated limit: a crash loop re-spends the budget"


def test_redis_store_a_restarted_process_does_not_start_its_window_fresh(fresh_redis):
    assert run_agent("redis", fresh_redis.url) == 1000
    assert run_agent("redis", fresh_redis.url) == 0, "the window survived the crash"
