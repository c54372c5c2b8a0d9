"""Core engine benchmark: step latency and durable throughput, next to the disk's floor.

Measures, in one run on the same disk:
- the floor: a bare ``write`` + ``fdatasync`` of one log line (what FileWAL calls), in a loop
  of its own and once after each COMPENSABLE step (the floor that step's ratio is taken
  against: the same disk at the same moments), and a bare ``write`` + ``fsync`` for reference;
- REVERSIBLE step latency (``saga.execute``) with an async and with a sync tool function;
- COMPENSABLE step latency (two durability fences) and its ratio to the p50 of the floor
  sampled between its steps (the median of the rounds' ratios);
- durable (COMPENSABLE) steps/s at 1, 16, 64 and 256 concurrent sagas, with step p99, the
  CPU per step and the garbage collector's share of it (``gc_cpu_share``),
  over FileWAL and over RedisWAL (a throwaway redis-server without persistence, or
  ``--redis-url``); each next to its floor in the same run (``--backends file`` skips Redis);
- the same at 64 and 256 sagas over ``FileWAL(sealer="process")`` (``file_process``), its
  passes interleaved with the thread-mode ones, with the sealer process's CPU per step
  (``sealer_cpu_us_per_step``, from /proc) next to this process's.

Floor and measured rounds are interleaved, because absolute times on a shared machine are
noise; the ratios are what to compare. Prints a table, or JSON with ``--json``.

    python bench/bench_core.py [--quick] [--json] [--backends file,redis] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import platform
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import start_redis
from agent_saga import ActionSemantics, BaseWAL, Compensation, FileWAL, saga_scope

REV = ActionSemantics.REVERSIBLE
COMP = ActionSemantics.COMPENSABLE
LINE = b'{"v":1,"seq":1,"ts":1,"type":"STEP_INTENT","saga":"bench-0123456789ab","step":"bench/1",' \
       b'"payload":{"tool":"stripe.charge"},"salt":"00","digest":"00","prev":"00","hash":"00"}\n'


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


CONCURRENCY = (1, 16, 64, 256)
PROCESS_CONCURRENCY = (64, 256)  # FileWAL(sealer="process")


def summary_us(samples: list[float]) -> dict[str, float]:
    return {k: round(pct(samples, q) * 1e6, 2) for k, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}


def bare_sync(path: Path, n: int, fn: Any) -> list[float]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    out = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, LINE)
            fn(fd)
            out.append(time.perf_counter() - t)
    finally:
        os.close(fd)
    return out


async def thread_hop(n: int) -> list[float]:
    """The sync tool's floor: a bare round trip to one worker thread and back
    (``run_in_executor`` on a one-thread pool), what any off-loop call costs."""
    loop = asyncio.get_running_loop()
    out = []
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        for _ in range(200):
            await loop.run_in_executor(pool, _sync_tool)
        for _ in range(n):
            t = time.perf_counter()
            await loop.run_in_executor(pool, _sync_tool)
            out.append(time.perf_counter() - t)
    return out


async def queue_hop(n: int) -> list[float]:
    """The cheapest thread round trip from Python: a long-lived thread fed through a
    ``queue.SimpleQueue`` (C) that hands the result back with one
    ``loop.call_soon_threadsafe(fut.set_result, ...)``: two thread wake-ups and nothing
    else (no context copy, no bookkeeping). The tool executor's hop is built like this."""
    loop = asyncio.get_running_loop()
    box: queue.SimpleQueue[asyncio.Future[Any] | None] = queue.SimpleQueue()

    def worker() -> None:
        while (fut := box.get()) is not None:
            loop.call_soon_threadsafe(fut.set_result, _sync_tool())

    thread = threading.Thread(target=worker, name="bench-queue-hop", daemon=True)
    thread.start()
    out = []
    try:
        for i in range(n + 200):  # the first 200: warm-up
            t = time.perf_counter()
            fut = loop.create_future()
            box.put(fut)
            await fut
            if i >= 200:
                out.append(time.perf_counter() - t)
    finally:
        box.put(None)
        thread.join()
    return out


async def _async_tool() -> dict[str, str]:
    return {"id": "x"}


def _sync_tool() -> dict[str, str]:
    return {"id": "x"}


def _undo(r: Any) -> Compensation:
    return Compensation(handler="bench.refund", kwargs={"id": r["id"]})


async def reversible(wal: FileWAL, n: int, sync_tool: bool) -> list[float]:
    fwd = _sync_tool if sync_tool else _async_tool
    out = []
    async with saga_scope(wal, name="bench-rev") as saga:
        for _ in range(200):  # warm-up
            await saga.execute("cache.put", REV, fwd)
        for _ in range(n):
            t = time.perf_counter()
            await saga.execute("cache.put", REV, fwd)
            out.append(time.perf_counter() - t)
    return out


async def compensable(wal: FileWAL, n: int, floor_path: Path) -> tuple[list[float], list[float]]:
    """``n`` COMPENSABLE steps, and after each one a bare ``write`` + ``fdatasync`` of one
    line on a file next to the WAL: the step and its floor see the disk at the same moments
    (a shared disk's sync time moves by several times from one second to the next, so a
    floor measured in a loop of its own, before or after, compares the step with another
    disk). Returns (step times, floor times)."""
    out: list[float] = []
    floor: list[float] = []
    fd = os.open(floor_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        async with saga_scope(wal, name="bench-comp") as saga:
            for _ in range(20):  # warm-up: the saga's first steps, the flusher's first batches
                await saga.execute("stripe.charge", COMP, _async_tool, _undo)
            for _ in range(n):
                t = time.perf_counter()
                await saga.execute("stripe.charge", COMP, _async_tool, _undo)
                t1 = time.perf_counter()
                out.append(t1 - t)
                os.write(fd, LINE)
                os.fdatasync(fd)
                floor.append(time.perf_counter() - t1)
    finally:
        os.close(fd)
    return out, floor


class GCClock:
    """CPU time the cyclic garbage collector spends (``gc.callbacks``; the collector runs in
    the thread that allocated, holding the interpreter lock, so it is the step's CPU too)."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.collections = 0
        self._t = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.thread_time()
        else:
            self.cpu += time.thread_time() - self._t
            self.collections += 1

    def __enter__(self) -> GCClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def _sealer_cpu(wal: BaseWAL) -> float | None:
    """CPU seconds the WAL's sealer process used so far (FileWAL(sealer="process")), from
    /proc; None without one."""
    pid = getattr(wal, "sealer_pid", None)
    if pid is None:
        return None
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def throughput(wal: BaseWAL, concurrency: int, steps_per_saga: int) -> dict[str, float]:
    lat: list[float] = []

    async def one() -> None:
        async with saga_scope(wal, name="bench-tp") as saga:
            for _ in range(steps_per_saga):
                t = time.perf_counter()
                await saga.execute("stripe.charge", COMP, _async_tool, _undo)
                lat.append(time.perf_counter() - t)

    before = wal.stats().batches
    sealer0 = _sealer_cpu(wal)
    with GCClock() as gc_clock:
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    sealer1 = _sealer_cpu(wal)
    steps = concurrency * steps_per_saga
    extra: dict[str, float] = {}
    if sealer0 is not None and sealer1 is not None:
        # the sealer process's CPU per step (clock ticks: coarse on a short pass)
        extra["sealer_cpu_us_per_step"] = round((sealer1 - sealer0) / steps * 1e6, 1)
    return {
        "concurrency": concurrency,
        "steps": steps,
        "steps_per_s": round(steps / dt),
        # the process's CPU (every thread) per step: the ceiling on steps/s, whatever the load
        "cpu_us_per_step": round(cpu / steps * 1e6, 1),
        "p50_us": round(pct(lat, 0.5) * 1e6, 1),
        "p99_us": round(pct(lat, 0.99) * 1e6, 1),
        "syncs": wal.stats().batches - before,
        # the garbage collector's part of that CPU, and its collections per 1,000 steps
        "gc_cpu_share": round(gc_clock.cpu / cpu, 3) if cpu > 0 else 0.0,
        "gc_per_1000_steps": round(gc_clock.collections / steps * 1000, 1),
        **extra,
    }


async def sweep(wal: BaseWAL, quick: bool, repeats: int,
                also: dict[str, tuple[BaseWAL, tuple[int, ...]]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Steps/s at each concurrency, ``repeats`` interleaved passes, the median pass kept.
    ``also``: more WALs, each measured at its concurrencies right after ``wal`` at the same
    one (interleaved, so both see the machine at the same moments). Returns the rows by
    name (``wal``'s under "")."""
    wals: dict[str, tuple[BaseWAL, tuple[int, ...]]] = {"": (wal, CONCURRENCY), **(also or {})}
    passes: dict[tuple[str, int], list[dict[str, Any]]] = {
        (name, c): [] for name, (_, cs) in wals.items() for c in cs
    }
    for _ in range(repeats):
        for c in CONCURRENCY:
            per = max(20, (400 if quick else 1500) // c) if c > 1 else (100 if quick else 300)
            for name, (w, cs) in wals.items():
                if c in cs:
                    passes[(name, c)].append(await throughput(w, c, per))
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in wals}
    for (name, _c), runs in passes.items():
        runs = sorted(runs, key=lambda r: r["steps_per_s"])
        mid = dict(runs[len(runs) // 2])
        mid["steps_per_s_all"] = [r["steps_per_s"] for r in passes[(name, _c)]]
        out[name].append(mid)
    return out


def open_redis(url: str) -> BaseWAL:
    from agent_saga import RedisWAL

    return RedisWAL(url, key=f"bench-core-{os.getpid()}-{time.monotonic_ns()}", max_pending=1_000_000,
                    max_batch=1000)


async def run(quick: bool, backends: list[str], redis_url: str | None) -> dict[str, Any]:
    rounds = 3 if quick else 5
    n_fast = 2000 if quick else 10000
    n_durable = 100 if quick else 300
    repeats = 1 if quick else 3
    tmp = Path(tempfile.mkdtemp(prefix="agent-saga-bench-", dir=os.environ.get("BENCH_DIR")))
    floor_fdatasync: list[float] = []
    floor_steps: list[float] = []  # one write + fdatasync after each COMPENSABLE step
    floor_fsync: list[float] = []
    rev_async: list[float] = []
    rev_sync: list[float] = []
    hop: list[float] = []
    qhop: list[float] = []
    comp: list[float] = []
    ratios: list[float] = []
    tp: dict[str, list[dict[str, Any]]] = {}
    wal = FileWAL(tmp / "bench.wal", max_pending=1_000_000)
    try:
        for _ in range(rounds):  # interleave floor and measured rounds
            floor_fdatasync += bare_sync(tmp / "floor.log", n_durable, os.fdatasync)
            c, f = await compensable(wal, n_durable, tmp / "floor-steps.log")
            floor_steps += f
            comp += c
            ratios.append(pct(c, 0.5) / pct(f, 0.5))
            floor_fsync += bare_sync(tmp / "floor2.log", n_durable // 2, os.fsync)
            rev_async += await reversible(wal, n_fast, sync_tool=False)
            rev_sync += await reversible(wal, n_fast // 4, sync_tool=True)
            hop += await thread_hop(n_fast // 4)
            qhop += await queue_hop(n_fast // 4)
        await wal.barrier()
        if "file" in backends:
            pwal = FileWAL(tmp / "bench-process.wal", max_pending=1_000_000, sealer="process")
            try:
                await throughput(pwal, 64, 20)  # warm-up: the sealer's first batches
                rows = await sweep(wal, quick, repeats, {"file_process": (pwal, PROCESS_CONCURRENCY)})
            finally:
                pwal.close()
            tp["file"], tp["file_process"] = rows[""], rows["file_process"]
    finally:
        wal.close()
    if "redis" in backends:
        proc, workdir = None, None
        if redis_url is None:
            redis_url, proc, workdir = start_redis("bench-core-redis-")
        rwal = open_redis(redis_url)
        try:
            tp["redis"] = (await sweep(rwal, quick, repeats))[""]
        finally:
            rwal.close()
            if proc is not None:
                proc.kill()
                proc.wait()
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
    floor = statistics.median(floor_steps)
    comp_p50 = pct(comp, 0.5)
    ratio = statistics.median(ratios)
    targets: dict[str, bool] = {
        "reversible_async_p50_le_5us": pct(rev_async, 0.5) * 1e6 <= 5,
        "reversible_sync_p50_le_80us": pct(rev_sync, 0.5) * 1e6 <= 80,
        "compensable_p50_le_3.0x_floor": ratio <= 3.0,
    }
    for name, need in (("file", 25000), ("file_process", 25000), ("redis", 20000)):
        if name in tp:
            by = {t["concurrency"]: t["steps_per_s"] for t in tp[name]}
            targets[f"{name}_throughput_256_ge_{need}"] = by[256] >= need
            targets[f"{name}_throughput_256_ge_64"] = by[256] >= by[64]
    ratios_process: dict[str, float] = {}
    if "file_process" in tp:
        thread_by = {t["concurrency"]: t for t in tp["file"]}
        for t in tp["file_process"]:
            c = t["concurrency"]
            ratios_process[f"steps_per_s_{c}"] = round(t["steps_per_s"] / thread_by[c]["steps_per_s"], 2)
            ratios_process[f"parent_cpu_per_step_{c}"] = round(t["cpu_us_per_step"] / thread_by[c]["cpu_us_per_step"], 2)
    return {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg": [round(x, 2) for x in os.getloadavg()]},
        "floor_write_fdatasync_us": summary_us(floor_fdatasync),
        "floor_write_fdatasync_between_steps_us": summary_us(floor_steps),
        "floor_write_fsync_us": summary_us(floor_fsync),
        "reversible_async_us": summary_us(rev_async),
        "reversible_sync_us": summary_us(rev_sync),
        "floor_thread_hop_us": summary_us(hop),
        "reversible_sync_p50_over_thread_hop_p50": round(pct(rev_sync, 0.5) / pct(hop, 0.5), 2),
        "floor_queue_hop_us": summary_us(qhop),
        "reversible_sync_p50_over_queue_hop_p50": round(pct(rev_sync, 0.5) / pct(qhop, 0.5), 2),
        "compensable_us": summary_us(comp),
        "compensable_p50_over_floor_p50": round(ratio, 2),
        "compensable_p50_over_pooled_floor_p50": round(comp_p50 / floor, 2),
        "compensable_p50_over_back_to_back_floor_p50": round(comp_p50 / statistics.median(floor_fdatasync), 2),
        "throughput": tp,
        # FileWAL(sealer="process") over the thread-mode FileWAL, same concurrency, same run
        "file_process_over_file": ratios_process,
        "targets": targets,
    }


def print_table(r: dict[str, Any]) -> None:
    def row(name: str, s: dict[str, float], note: str = "") -> None:
        print(f"  {name:34} {s['p50']:>10.1f} {s['p95']:>10.1f} {s['p99']:>10.1f}  {note}")

    print(f"agent-saga core benchmark — Python {r['machine']['python']}, {r['machine']['cpus']} CPUs")
    print(f"  {'latency (µs)':34} {'p50':>10} {'p95':>10} {'p99':>10}")
    row("floor: write + fdatasync", r["floor_write_fdatasync_us"], "(back to back)")
    row("floor: write + fdatasync", r["floor_write_fdatasync_between_steps_us"],
        "(one after each COMPENSABLE step)")
    row("floor: write + fsync", r["floor_write_fsync_us"])
    row("REVERSIBLE step, async tool", r["reversible_async_us"], "target p50 ≤ 5 µs")
    row("floor: bare thread round trip", r["floor_thread_hop_us"], "(run_in_executor, 1 thread)")
    row("floor: bare queue round trip", r["floor_queue_hop_us"], "(SimpleQueue + call_soon_threadsafe)")
    row("REVERSIBLE step, sync tool", r["reversible_sync_us"],
        f"target p50 ≤ 80 µs; = {r['reversible_sync_p50_over_thread_hop_p50']} × thread hop, "
        f"{r['reversible_sync_p50_over_queue_hop_p50']} × queue hop")
    row("COMPENSABLE step (2 fences)", r["compensable_us"],
        f"= {r['compensable_p50_over_floor_p50']} × floor p50 (target ≤ 3.0)")
    for backend, rows in r["throughput"].items():
        print(f"\n  {backend + ': concurrent sagas':>24} {'steps/s':>10} {'CPU µs/step':>12} {'p50 µs':>10} "
              f"{'p99 µs':>10} {'batches':>8} {'GC share':>9}")
        for t in rows:
            sealer = f"  + sealer process {t['sealer_cpu_us_per_step']} µs/step" if "sealer_cpu_us_per_step" in t else ""
            print(f"  {t['concurrency']:>24} {t['steps_per_s']:>10} {t['cpu_us_per_step']:>12} {t['p50_us']:>10} "
                  f"{t['p99_us']:>10} {t['syncs']:>8} {t['gc_cpu_share']:>9.1%}{sealer}")
    print(f"\n  load average at the end: {r['machine']['loadavg']}")
    print("\n  targets: " + ", ".join(f"{k}={'met' if v else 'MISSED'}" for k, v in r["targets"].items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    ap.add_argument("--backends", default="file,redis", help="throughput over: file, redis (comma-separated)")
    ap.add_argument("--redis-url", help="an existing Redis (default: start a throwaway redis-server)")
    args = ap.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = set(backends) - {"file", "redis"}
    if bad:
        ap.error(f"--backends: unknown {sorted(bad)}; choose from file, redis")
    result = asyncio.run(run(args.quick, backends, args.redis_url))
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
