"""Where a step's work goes, counted rather than timed: Python bytecodes per step, by thread
and function (the event loop's and the WAL flusher's), for COMPENSABLE steps or for
REVERSIBLE steps with an async or a sync tool.

A count does not depend on the machine's load, so two versions can be compared on a busy
machine (times cannot). It undercounts work done in C (``json``, ``hashlib``, regular
expressions, ``os.write``), which a py-spy profile shows instead; see docs/performance.md.

    python bench/profile_step.py [--mode comp|rev|rev-sync] [--wal file|redis] [--redis-url URL]
                                 [--sealer thread|process]
                                 [--sagas 64] [--steps 5] [--top 30] [--json]

``--wal redis`` runs the steps over RedisWAL (a throwaway redis-server unless ``--redis-url``).
``--sealer process`` opens the FileWAL with ``sealer="process"``: the counts are this
process's (the event loop's and the flusher thread's); the sealer process is not traced.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from _common import start_redis
from agent_saga import ActionSemantics, FileWAL, saga_scope
from bench_core import (  # the same step as bench_core measures
    _async_tool,
    _sync_tool,
    _undo,
    open_redis,
)

COUNTS: collections.Counter[tuple[str, str, str]] = collections.Counter()
_ON = [False]


def _where(filename: str) -> str:
    if "agent_saga" in filename:
        return filename.split("agent_saga", 1)[1].lstrip("/")
    if "asyncio" in filename:
        return "asyncio"
    return os.path.basename(filename)


def _tracer(frame: Any, event: str, arg: Any) -> Any:
    frame.f_trace_opcodes = True
    return _local


def _local(frame: Any, event: str, arg: Any) -> Any:
    if _ON[0] and event == "opcode":
        thread = threading.current_thread().name.split(":")[0]
        COUNTS[(thread, _where(frame.f_code.co_filename), frame.f_code.co_name)] += 1
    return _local


async def run(mode: str, sagas: int, steps: int, backend: str = "file", redis_url: str | None = None,
              sealer: str = "thread") -> int:
    sem = ActionSemantics.COMPENSABLE if mode == "comp" else ActionSemantics.REVERSIBLE
    fwd = _sync_tool if mode == "rev-sync" else _async_tool
    undo = _undo if mode == "comp" else None
    tmp = Path(tempfile.mkdtemp(prefix="agent-saga-profile-", dir=os.environ.get("BENCH_DIR")))
    proc, workdir = None, None
    if backend == "redis" and redis_url is None:
        redis_url, proc, workdir = start_redis("profile-step-redis-")
    threading.settrace(_tracer)  # the flusher and the tool threads start after this
    sys.settrace(_tracer)
    if redis_url is not None and backend == "redis":
        wal: Any = open_redis(redis_url)
    else:
        # sync=False: the count is the same with fdatasync (which runs in C), only faster.
        wal = FileWAL(tmp / "profile.wal", max_pending=1_000_000, sync=False, stall_timeout=600, sealer=sealer)

    async def one() -> None:
        async with saga_scope(wal, name="profile") as saga:
            for _ in range(steps):
                await saga.execute("stripe.charge", sem, fwd, undo)

    try:
        await asyncio.gather(*(one() for _ in range(sagas)))  # warm-up: caches, first-use imports
        _ON[0] = True
        await asyncio.gather(*(one() for _ in range(sagas)))
        await wal.barrier()
        _ON[0] = False
    finally:
        sys.settrace(None)
        threading.settrace(None)
        wal.close(timeout=600)
        if proc is not None:
            proc.kill()
            proc.wait()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    return sagas * steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("comp", "rev", "rev-sync"), default="comp")
    ap.add_argument("--wal", choices=("file", "redis"), default="file", help="the WAL the steps write to")
    ap.add_argument("--redis-url", help="with --wal redis: an existing Redis (default: a throwaway redis-server)")
    ap.add_argument("--sealer", choices=("thread", "process"), default="thread",
                    help="with --wal file: where batches are sealed (FileWAL's sealer option)")
    ap.add_argument("--sagas", type=int, default=64, help="concurrent sagas")
    ap.add_argument("--steps", type=int, default=5, help="steps per saga (tracing is slow: keep it small)")
    ap.add_argument("--top", type=int, default=30, help="functions to list")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    n = asyncio.run(run(args.mode, args.sagas, args.steps, args.wal, args.redis_url, args.sealer))
    per_thread: collections.Counter[str] = collections.Counter()
    per_file: collections.Counter[str] = collections.Counter()
    for (thread, where, _fn), v in COUNTS.items():
        per_thread[thread] += v
        per_file[where] += v
    result = {
        "mode": args.mode,
        "wal": args.wal,
        "sealer": args.sealer if args.wal == "file" else None,
        "steps": n,
        "bytecodes_per_step": round(sum(COUNTS.values()) / n),
        "by_thread": {k: round(v / n) for k, v in per_thread.most_common()},
        "by_file": {k: round(v / n) for k, v in per_file.most_common(20)},
        "top": [
            {"thread": t, "file": w, "function": f, "per_step": round(v / n, 1)}
            for (t, w, f), v in COUNTS.most_common(args.top)
        ],
    }
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(f"{args.mode}: {result['bytecodes_per_step']} Python bytecodes per step ({n} steps, {args.sagas} sagas)")
    print("  by thread: " + ", ".join(f"{k} {v}" for k, v in result["by_thread"].items()))
    print("  by file:   " + ", ".join(f"{k} {v}" for k, v in result["by_file"].items()))
    for row in result["top"]:
        print(f"  {row['per_step']:>8} {row['thread'][:24]:24} {row['file']:24} {row['function']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
