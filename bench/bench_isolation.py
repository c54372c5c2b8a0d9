"""Saga isolation: what a semantic lock and a durable snapshot cost, as ratios against
floors measured in the same run.

    .venv/bin/python bench/bench_isolation.py [--redis-url URL] [--n 2000] [--snapshots 200] [--json]

Without --redis-url a throwaway redis-server (from PATH) is started on a free port.

    RedisSemanticLocks acquire + release   vs  a bare SET NX PX + DEL (two round trips)
    SemanticLockManager acquire + release  (absolute µs: no I/O, for scale)
    FileSnapshots.capture                  vs  a bare write + fsync + rename + fsync(dir)
                                               of the same bytes on the same disk

Absolute times on a shared machine are noise; the ratios are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import _common  # bench/_common.py (benchmarks run as scripts from bench/)
from agent_saga import FileSnapshots, FileWAL, RedisSemanticLocks, SemanticLockManager, saga_scope  # noqa: E402


async def _locks(url: str, n: int, rounds: int = 3) -> dict[str, float]:
    """Best of ``rounds`` interleaved batches each (load on a shared machine comes and goes)."""
    import redis.asyncio

    bare = redis.asyncio.Redis.from_url(url)
    locks = RedisSemanticLocks(url, namespace="bench")
    local = SemanticLockManager()
    await locks.acquire("warm", "s")  # load the scripts
    await locks.release("warm", "s")
    floor = ours = in_process = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for i in range(n):
            await bare.set(f"bench:bare:{i % 16}", "s", nx=True, px=30_000)
            await bare.delete(f"bench:bare:{i % 16}")
        floor = min(floor, (time.perf_counter() - t) / n)
        t = time.perf_counter()
        for i in range(n):
            await locks.acquire(f"r{i % 16}", "s", wait=0)
            await locks.release(f"r{i % 16}", "s")
        ours = min(ours, (time.perf_counter() - t) / n)
        t = time.perf_counter()
        for i in range(n):
            await local.acquire(f"r{i % 16}", "s", wait=0)
            await local.release(f"r{i % 16}", "s")
        in_process = min(in_process, (time.perf_counter() - t) / n)
    await bare.aclose()
    await locks.close()
    return {"redis_lock_us": ours * 1e6, "bare_set_del_us": floor * 1e6, "redis_lock_ratio": ours / floor,
            "local_lock_us": in_process * 1e6}


def _bare_snapshot(directory: str, i: int, data: bytes) -> None:
    path = os.path.join(directory, f"bare-{i}.json")
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


async def _snapshots(n: int) -> dict[str, float]:
    work = tempfile.mkdtemp(prefix="bench-snap-", dir=os.environ.get("BENCH_DIR"))
    value: dict[str, Any] = {"replicas": 3, "image": "web:1.2.3", "env": {f"K{i}": f"v{i}" for i in range(20)}}
    try:
        bare_dir = os.path.join(work, "bare")
        os.makedirs(bare_dir)
        data = json.dumps({"value": value}).encode()
        store = FileSnapshots(os.path.join(work, "snaps"))
        wal = FileWAL(os.path.join(work, "b.wal"))
        floor = ours = float("inf")
        try:
            async with saga_scope(wal, saga_id="bench") as saga:
                for r in range(3):  # best of three interleaved batches each
                    t = time.perf_counter()
                    for i in range(n):
                        await asyncio.to_thread(_bare_snapshot, bare_dir, r * n + i, data)
                    floor = min(floor, (time.perf_counter() - t) / n)
                    t = time.perf_counter()
                    for _ in range(n):
                        await store.capture(saga, "config/web", value)
                    ours = min(ours, (time.perf_counter() - t) / n)
                saga._exit_hooks.clear()  # keep the boundary from timing the deletions
        finally:
            wal.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"snapshot_capture_us": ours * 1e6, "bare_fsync_rename_us": floor * 1e6, "snapshot_ratio": ours / floor}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--snapshots", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args()
    proc = workdir = None
    url = args.redis_url
    if url is None:
        url, proc, workdir = _common.start_redis()
    try:
        result = asyncio.run(_locks(url, args.n))
        result.update(asyncio.run(_snapshots(args.snapshots)))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
            shutil.rmtree(workdir or "", ignore_errors=True)
    result["load_average_1m"] = os.getloadavg()[0]
    if not args.json:
        print(f"RedisSemanticLocks acquire+release  {result['redis_lock_us']:9.1f} µs  "
              f"x{result['redis_lock_ratio']:.2f} a bare SET NX PX + DEL ({result['bare_set_del_us']:.1f} µs)")
        print(f"SemanticLockManager acquire+release {result['local_lock_us']:9.1f} µs")
        print(f"FileSnapshots.capture               {result['snapshot_capture_us']:9.1f} µs  "
              f"x{result['snapshot_ratio']:.2f} a bare write+fsync+rename+fsync(dir) "
              f"({result['bare_fsync_rename_us']:.1f} µs)")
        print(f"load average {result['load_average_1m']:.2f}")
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
