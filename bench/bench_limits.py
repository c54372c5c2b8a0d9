"""Limit-check latency: ours vs. a bare Redis round trip, and the in-process store.

    .venv/bin/python bench/bench_limits.py [--redis-url URL] [--n 20000] [--json]

Without --redis-url a throwaway redis-server (from PATH) is started on a free port.
Absolute times on shared machines are noise, so the Redis target is a ratio measured in
the same run, with the two measurements interleaved:

    redis check-and-debit of 3 limits (RedisLimitStore.debit)  p50 <= 1.5 x bare EVALSHA p50
    in-process check-and-debit of 3 limits (InProcessLimitStore) p50 <= 5 us

Also reported, not targeted: the whole gate decision (pricing the call, the store call,
the default rule) on each store, and (``--parts N``, default 8) the check-and-debit of a
pod that debits into its own part of the windows (``RedisLimitStore(part=...)``, what an
agent wired by ``AGENT_SAGA_REDIS_URL`` does) while N other pods' parts hold spend in the
same windows: its ratio to the bare round trip too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import _common  # bench/_common.py (benchmarks run as scripts from bench/)
from agent_saga.controls import (  # noqa: E402
    BudgetLimit,
    InProcessLimitStore,
    PreFlightGate,
    RateLimit,
    RedisLimitStore,
    by_arg,
    by_tool,
)
from agent_saga.controls.limits import Charge  # noqa: E402
from agent_saga.gates import StepRequest  # noqa: E402
from agent_saga.semantics import ActionSemantics  # noqa: E402

BIG = 1e15
WINDOW = 86_400.0
LIMITS: list[BudgetLimit | RateLimit] = [
    BudgetLimit("daily-spend", arg="amount", max_total=BIG, window=WINDOW),
    BudgetLimit("per-customer", arg="amount", max_total=BIG, window=WINDOW, scope=by_arg("customer_id")),
    RateLimit("velocity", max_calls=10**12, window=60, scope=by_tool),
]
REQUEST = StepRequest("bench", "bench/0", "stripe.charge", ActionSemantics.COMPENSABLE,
                      {"amount": 4200, "customer_id": "cus_1"})
CHARGES = [lim.charge(REQUEST) for lim in LIMITS]


pct = _common.pct


def summary(name: str, ns: list[float]) -> dict[str, Any]:
    us = [x / 1000 for x in ns]
    return {"name": name, "n": len(us), "p50_us": round(pct(us, 0.5), 2),
            "p95_us": round(pct(us, 0.95), 2), "p99_us": round(pct(us, 0.99), 2)}


def start_redis() -> tuple[str, subprocess.Popen[bytes], str]:
    return _common.start_redis("bench-limits-redis-")


async def timed(fn: Callable[[], Awaitable[Any]], out: list[float]) -> None:
    t0 = time.perf_counter_ns()
    await fn()
    out.append(time.perf_counter_ns() - t0)


async def bench_redis(url: str, n: int, parts: int) -> list[dict[str, Any]]:
    import redis.asyncio as aioredis

    ns = f"bench-{os.getpid()}"
    store = RedisLimitStore(url, namespace=ns)
    gate = PreFlightGate(limits=LIMITS, store=store)
    client = store._client()  # the same connection pool: only the script differs
    bare_sha = await client.script_load("return 1")
    await store.debit(CHARGES, "warm-0")
    await gate.decide(REQUEST)
    counter = iter(range(1, 10**9))
    # A fleet of its own (a namespace of its own): the shared-keys store above sees no parts.
    pod = RedisLimitStore(url, namespace=f"{ns}-fleet", part="bench/pod-0")
    for i in range(1, parts + 1):  # the other pods' spend in the same windows
        other = RedisLimitStore(url, namespace=f"{ns}-fleet", part=f"bench/pod-{i}")
        await other.debit(CHARGES, f"other-{i}")
        await other.aclose()

    async def own_part() -> Any:
        return await pod.debit(CHARGES, f"p{next(counter)}")

    async def bare() -> Any:
        return await client.evalsha(bare_sha, 0)

    async def debit() -> Any:
        return await store.debit(CHARGES, f"b{next(counter)}")

    async def decide() -> Any:
        return await gate.decide(REQUEST)

    for _ in range(500):  # warm every path
        await bare()
        await debit()
        await own_part()
    t_bare: list[float] = []
    t_debit: list[float] = []
    t_gate: list[float] = []
    t_part: list[float] = []
    for _ in range(n):
        await timed(bare, t_bare)
        await timed(debit, t_debit)
        await timed(decide, t_gate)
        await timed(own_part, t_part)
    await store.aclose()
    await pod.aclose()
    cleanup = aioredis.Redis.from_url(url)
    try:
        async for key in cleanup.scan_iter(match=f"{{bench-{os.getpid()}*"):
            await cleanup.delete(key)
    finally:
        await cleanup.aclose()
    return [summary("redis: bare EVALSHA round trip", t_bare),
            summary("redis: check-and-debit, 3 limits", t_debit),
            summary("redis: gate decision, 3 limits", t_gate),
            summary(f"redis: check-and-debit, own part of {parts + 1}", t_part)]


async def bench_inprocess(n: int) -> list[dict[str, Any]]:
    store = InProcessLimitStore()
    gate = PreFlightGate(limits=LIMITS, store=store)
    counter = iter(range(1, 10**9))
    charges: list[Charge] = CHARGES
    t_debit: list[float] = []
    t_gate: list[float] = []
    await gate.decide(REQUEST)
    clock = time.perf_counter_ns
    for _ in range(n):
        did = f"i{next(counter)}"
        t0 = clock()
        await store.debit(charges, did)
        t_debit.append(clock() - t0)
    for _ in range(n):
        t0 = clock()
        await gate.decide(REQUEST)
        t_gate.append(clock() - t0)
    return [summary("in-process: check-and-debit, 3 limits", t_debit),
            summary("in-process: gate decision, 3 limits", t_gate)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis-url", help="an existing Redis (default: start a throwaway redis-server)")
    ap.add_argument("--n", type=int, default=20_000, help="samples per measurement")
    ap.add_argument("--parts", type=int, default=8, help="other pods' parts in the windows (default 8)")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args()
    os.environ.setdefault("AGENT_SAGA_SINGLE_PROCESS", "1")

    proc = workdir = None
    url = args.redis_url
    if url is None:
        url, proc, workdir = start_redis()
    try:
        rows = asyncio.run(bench_redis(url, args.n, args.parts))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
            shutil.rmtree(workdir or "", ignore_errors=True)
    rows += asyncio.run(bench_inprocess(args.n))

    by = {r["name"]: r for r in rows}
    ratio = by["redis: check-and-debit, 3 limits"]["p50_us"] / by["redis: bare EVALSHA round trip"]["p50_us"]
    inproc = by["in-process: check-and-debit, 3 limits"]["p50_us"]
    part = by[f"redis: check-and-debit, own part of {args.parts + 1}"]["p50_us"] / by[
        "redis: bare EVALSHA round trip"]["p50_us"]
    targets = {
        "redis_debit_p50_over_bare_evalsha_p50": {"value": round(ratio, 3), "target": 1.5, "ok": ratio <= 1.5},
        "inprocess_check_p50_us": {"value": inproc, "target": 5.0, "ok": inproc <= 5.0},
    }
    measured = {"redis_part_debit_p50_over_bare_evalsha_p50": round(part, 3)}
    result = {"bench": "limits", "python": sys.version.split()[0], "rows": rows, "targets": targets,
              "measured": measured}
    if not args.json:
        print(f"{'measurement':42} {'n':>7} {'p50 µs':>9} {'p95 µs':>9} {'p99 µs':>9}")
        for r in rows:
            print(f"{r['name']:42} {r['n']:>7} {r['p50_us']:>9.2f} {r['p95_us']:>9.2f} {r['p99_us']:>9.2f}")
        print()
        for name, t in targets.items():
            print(f"{name:42} {t['value']:>9} target <= {t['target']}  {'OK' if t['ok'] else 'MISSED'}")
        print()
    print(json.dumps(result, indent=None if args.json else 2))
    return 0 if all(t["ok"] for t in targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
