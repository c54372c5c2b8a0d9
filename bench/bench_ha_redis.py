"""What replica confirmation costs behind Sentinel: WAIT on the WAL and on spend debits.

    PYTHONPATH=tests .venv/bin/python bench/bench_ha_redis.py [--n 2000] [--failovers 2] [--json]

Starts a primary, two replicas and three Sentinels on this machine (tests/fixtures), and
measures, interleaved in the same run (absolute times on shared machines are noise):

    debit    RedisLimitStore.debit p50, min_replicas=1 / min_replicas=0   (ratio reported)
    wal      RedisWAL append+barrier p50, wait_replicas=1 / wait_replicas=0 (ratio reported)
    loss     --failovers K rounds of the failover test's workload (32 sagas appending, 4
             processes spending, the primary SIGKILLed mid-budget), without WAIT and with
             WAIT 1, each on a fresh group: records acknowledged and lost, debits
             authorised against the budget and counted after (the loss window, measured)

No target: the ratio is the price of "a failover cannot forget it" (docs/ha-redis.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))

import _common  # noqa: E402  bench/_common.py
from agent_saga.controls.limits import Charge, RedisLimitStore  # noqa: E402
from agent_saga.wal import RedisWAL  # noqa: E402
from fixtures.redis_ha import RedisSentinelGroup  # noqa: E402


async def debits(url: str, n: int) -> dict[str, list[float]]:
    stores = {r: RedisLimitStore(url, namespace=f"bench-{r}", min_replicas=r) for r in (0, 1)}
    charge = [Charge("spend", "fleet", 1.0, 1e12, 3600.0)]
    out: dict[str, list[float]] = {"0": [], "1": []}
    for _ in range(n):
        for r, store in stores.items():
            t = time.perf_counter()
            await store.debit(charge, uuid.uuid4().hex)
            out[str(r)].append(time.perf_counter() - t)
    for store in stores.values():
        await store.aclose()
    return out


async def appends(url: str, n: int) -> dict[str, list[float]]:
    wals = {r: RedisWAL(url, key="{bench}:wal", writer=f"bench-{r}", wait_replicas=r) for r in (0, 1)}
    out: dict[str, list[float]] = {"0": [], "1": []}
    try:
        for i in range(n):
            for r, wal in wals.items():
                t = time.perf_counter()
                await wal.barrier(wal.append("STEP_COMMITTED", f"s-{i}", None, {"i": i}))
                out[str(r)].append(time.perf_counter() - t)
    finally:
        for wal in wals.values():
            wal.close()
    return out


def failovers(k: int) -> dict[str, list[dict[str, float]]]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from test_redis_failover import BUDGET, _failover_under_load  # the test's workload, as is

    out: dict[str, list[dict[str, float]]] = {"0": [], "1": []}
    for _ in range(k):
        for r in (0, 1):
            with RedisSentinelGroup() as group:
                run = _failover_under_load(group, replicas=r)
            out[str(r)].append({**run._asdict(), "budget": BUDGET})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--failovers", type=int, default=2, help="failover rounds per mode (0: none)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with RedisSentinelGroup() as group:
        d = asyncio.run(debits(group.url, args.n))
        w = asyncio.run(appends(group.url, args.n))
    loss = failovers(args.failovers)
    rows: dict[str, Any] = {
        "debit_p50_us": {k: _common.pct(v, 0.5) * 1e6 for k, v in d.items()},
        "wal_p50_us": {k: _common.pct(v, 0.5) * 1e6 for k, v in w.items()},
    }
    rows["debit_ratio"] = rows["debit_p50_us"]["1"] / rows["debit_p50_us"]["0"]
    rows["wal_ratio"] = rows["wal_p50_us"]["1"] / rows["wal_p50_us"]["0"]
    rows["failovers"] = loss
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"debit p50: {rows['debit_p50_us']['0']:.0f} us without WAIT, {rows['debit_p50_us']['1']:.0f} us with "
          f"min_replicas=1 ({rows['debit_ratio']:.2f}x)")
    print(f"WAL append+barrier p50: {rows['wal_p50_us']['0']:.0f} us without WAIT, {rows['wal_p50_us']['1']:.0f} us "
          f"with wait_replicas=1 ({rows['wal_ratio']:.2f}x)")
    for r, runs in loss.items():
        for x in runs:
            print(f"failover, WAIT {r}: {x['acked']:.0f} records acknowledged, {x['lost']:.0f} lost; "
                  f"{x['authorised']:.0f} of {x['budget']:.0f} authorised, {x['after']:.0f} counted after; "
                  f"settled in {x['failover']:.1f}s")


if __name__ == "__main__":
    main()
