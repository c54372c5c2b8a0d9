"""REVERSIBLE step latency next to the thread hops it is built on (a quick, latency-only run).

Interleaved rounds of, each a p50 over the same round:
- ``run_in_executor``: a bare round trip through asyncio's executor machinery on a
  one-thread pool (``concurrent.futures.Future`` + ``wrap_future``);
- ``queue_hop``: a bare round trip to a long-lived thread fed through a
  ``queue.SimpleQueue``, the result handed back with one ``call_soon_threadsafe``: the
  cheapest hop there is from Python (two thread wake-ups);
- ``tool_executor``: the tool executor's own hop (``ToolExecutor.submit``), which is
  built like ``queue_hop`` and adds the context copy and the pool's bookkeeping;
- ``reversible_sync`` / ``reversible_async``: ``saga.execute`` of a REVERSIBLE step
  with a plain function / an ``async def`` tool, over FileWAL.

The ratios divide medians of the rounds' p50s by ``queue_hop``'s of the same run; the
median of the rounds' p99s is reported too (the flusher sealing in the same process shows
there, not in the p50).

    python bench/bench_hop.py [--rounds 7] [--n 2000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_saga import FileWAL
from agent_saga.executor import ToolExecutor
from bench_core import _sync_tool, pct, queue_hop, reversible, thread_hop


async def executor_hop(ex: ToolExecutor, n: int) -> list[float]:
    out = []
    for i in range(n + 200):  # the first 200: warm-up
        t = time.perf_counter()
        await ex.submit(_sync_tool, {})
        if i >= 200:
            out.append(time.perf_counter() - t)
    return out


async def run(rounds: int, n: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="agent-saga-bench-hop-", dir=os.environ.get("BENCH_DIR")))
    wal = FileWAL(tmp / "bench.wal", max_pending=1_000_000)
    ex = ToolExecutor(4, name="bench-hop")
    p50s: dict[str, list[float]] = {}
    p99s: dict[str, list[float]] = {}
    try:
        for _ in range(rounds):
            for name, samples in (
                ("run_in_executor", await thread_hop(n)),
                ("queue_hop", await queue_hop(n)),
                ("tool_executor", await executor_hop(ex, n)),
                ("reversible_sync", await reversible(wal, n, sync_tool=True)),
                ("reversible_async", await reversible(wal, n * 4, sync_tool=False)),
            ):
                p50s.setdefault(name, []).append(round(pct(samples, 0.5) * 1e6, 2))
                p99s.setdefault(name, []).append(round(pct(samples, 0.99) * 1e6, 2))
        await wal.barrier()
    finally:
        wal.close()
    med = {k: round(statistics.median(v), 2) for k, v in p50s.items()}
    return {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "loadavg": [round(x, 2) for x in os.getloadavg()]},
        "p50_us_median_of_rounds": med,
        "p50_us_per_round": p50s,
        # the tail: what the WAL's flusher, sealing in the same process, adds now and then
        "p99_us_median_of_rounds": {k: round(statistics.median(v), 2) for k, v in p99s.items()},
        "over_queue_hop": {k: round(v / med["queue_hop"], 2) for k, v in med.items() if k != "reversible_async"},
        "targets": {
            "reversible_sync_p50_le_80us": med["reversible_sync"] <= 80,
            "reversible_async_p50_le_5us": med["reversible_async"] <= 5,
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=2000, help="samples per hop and round (the async step: 4 ×)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    r = asyncio.run(run(args.rounds, args.n))
    if args.json:
        json.dump(r, sys.stdout, indent=2)
        print()
        return 0
    print(f"load average {r['machine']['loadavg']}; p50 µs, median of {args.rounds} rounds (÷ queue hop); p99 µs")
    for k, v in r["p50_us_median_of_rounds"].items():
        ratio = r["over_queue_hop"].get(k)
        print(f"  {k:18} {v:8.1f}" + (f"   {ratio:.2f} ×" if ratio is not None else "         ")
              + f"   p99 {r['p99_us_median_of_rounds'][k]:8.1f}")
    for k, met in r["targets"].items():
        print(f"  {k}: {'met' if met else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
