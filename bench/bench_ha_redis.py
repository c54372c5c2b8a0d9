"""What replica confirmation costs behind Sentinel: WAIT on the WAL and on spend debits.

    .venv/bin/python bench/bench_ha_redis.py [--n 2000] [--json]

Starts a primary, two replicas and three Sentinels on this machine (tests/fixtures), and
measures, interleaved in the same run (absolute times on shared machines are noise):

    debit    RedisLimitStore.debit p50, min_replicas=1 / min_replicas=0   (ratio reported)
    wal      RedisWAL append+barrier p50, wait_replicas=1 / wait_replicas=0 (ratio reported)

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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "runtime"), str(ROOT / "tests")]

import _common  # noqa: E402  bench/_common.py
from agent_saga.controls.limits import Charge, RedisLimitStore  # noqa: E402
from agent_saga.wal.redis import RedisWAL  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with RedisSentinelGroup() as group:
        d = asyncio.run(debits(group.url, args.n))
        w = asyncio.run(appends(group.url, args.n))
    rows = {
        "debit_p50_us": {k: _common.pct(v, 0.5) * 1e6 for k, v in d.items()},
        "wal_p50_us": {k: _common.pct(v, 0.5) * 1e6 for k, v in w.items()},
    }
    rows["debit_ratio"] = rows["debit_p50_us"]["1"] / rows["debit_p50_us"]["0"]  # type: ignore[assignment]
    rows["wal_ratio"] = rows["wal_p50_us"]["1"] / rows["wal_p50_us"]["0"]  # type: ignore[assignment]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"debit p50: {rows['debit_p50_us']['0']:.0f} us without WAIT, {rows['debit_p50_us']['1']:.0f} us with "
          f"min_replicas=1 ({rows['debit_ratio']:.2f}x)")
    print(f"WAL append+barrier p50: {rows['wal_p50_us']['0']:.0f} us without WAIT, {rows['wal_p50_us']['1']:.0f} us "
          f"with wait_replicas=1 ({rows['wal_ratio']:.2f}x)")


if __name__ == "__main__":
    main()
