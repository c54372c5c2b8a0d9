"""WAL benchmark: the durable step (append + barrier) of FileWAL, RedisWAL, PostgresWAL and
SinkWAL over PostgresAsyncSink (`postgres-async`), each next to its floor measured in the
same run, under 1..256 concurrent writers.

    PYTHONPATH=tests python bench/bench_wal.py       # all three, table (servers from tests/fixtures)
    python bench/bench_wal.py --json                 # machine-readable
    python bench/bench_wal.py --backends redis --concurrency 1,64 --rounds 7
    python bench/bench_wal.py --redis-url redis://h:6379/0 --postgres-dsn postgresql://...

Floors (what the step cannot beat on this machine, right now):
  file      bare write + fdatasync of one record-sized line on the same disk
  redis     bare PING round trip (asyncio client on the benchmark's loop, and sync client);
            a pipeline of N XADDs (N = concurrency) for the throughput floor
  postgres  bare INSERT + COMMIT (autocommit, one row of the WAL's shape into a copy of
            its table; asyncio connection on the loop, and sync)
  postgres-async  the same floors as postgres (the same table and server)

Shared machines are noisy (other builds run here), so absolute times are not the result:
floor and measured rounds are interleaved, a ratio is computed per round from the same
round's floor, and the median over rounds is reported. Without --redis-url /
--postgres-dsn the servers are started from tests/fixtures (Redis without persistence,
PostgreSQL with fsync and synchronous_commit off, as in the integration tests); pass
--redis-aof or --pg-synchronous-commit on to measure those durability classes instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

from agent_saga import FileWAL  # noqa: E402
from agent_saga.chain import seal  # noqa: E402
from agent_saga.records import Record, encode_line  # noqa: E402

PAYLOAD = {"tool": "stripe.charge", "semantics": "COMPENSABLE", "amount": 4200, "currency": "eur",
           "customer": "cus_0123456789", "compensation": {"handler": "stripe.refund",
                                                          "kwargs": {"charge_id": "ch_0123456789abcdef"}}}


def _line() -> bytes:
    rec = Record("STEP_COMMITTED", "s-bench", "s-bench/0", PAYLOAD, 1, time.time_ns() // 1000)
    return encode_line(rec, seal(rec, "0" * 64))


LINE = _line()


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


# ---------------------------------------------------------------------------- drivers


async def measure_steps(wal: Any, conc: int, ops: int) -> tuple[list[float], float]:
    """``conc`` coroutines doing append + barrier; per-step latencies and records/s."""
    per = max(1, ops // conc)
    lat: list[float] = []

    async def agent(a: int) -> None:
        for k in range(per):
            t0 = time.perf_counter()
            await wal.barrier(wal.append("STEP_COMMITTED", f"s-{a}", f"s-{a}/{k}", PAYLOAD))
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(agent(a) for a in range(conc)))
    return lat, conc * per / (time.perf_counter() - t0)


async def measure_calls(fn: Callable[[], Awaitable[Any]] | Callable[[], Any], n: int, is_async: bool) -> list[float]:
    lat: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        if is_async:
            await fn()
        else:
            fn()
        lat.append(time.perf_counter() - t0)
    return lat


class Backend:
    name = "?"
    target: tuple[str, float] | None = None  # (floor name, max ratio of step p50 at c=1)

    async def open(self) -> Any: ...
    async def floors(self, conc: int, n: int) -> dict[str, float]:  # name -> p50 seconds
        raise NotImplementedError

    def floor_rate(self, conc: int, floors: dict[str, float]) -> float | None: return None
    async def close(self) -> None: ...


class FileBackend(Backend):
    name = "file"
    target = ("fsync", 0.0)  # reported, no target in the issue

    def __init__(self, directory: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="bench-wal-", dir=directory)
        self.n = 0

    async def open(self) -> Any:
        self.n += 1
        return FileWAL(os.path.join(self.dir, f"w{self.n}.wal"))

    async def floors(self, conc: int, n: int) -> dict[str, float]:
        fd = os.open(os.path.join(self.dir, "floor.bin"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            def write_sync() -> None:
                os.write(fd, LINE)
                os.fdatasync(fd)

            lat = await measure_calls(write_sync, n, False)
        finally:
            os.close(fd)
        return {"fsync": pct(lat, 0.5)}

    def floor_rate(self, conc: int, floors: dict[str, float]) -> float | None:
        return conc / floors["fsync"]  # one fsync per batch of `conc` at best

    async def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisBackend(Backend):
    name = "redis"
    target = ("ping_async", 3.0)

    def __init__(self, url: str) -> None:
        import redis
        import redis.asyncio

        self.url = url
        self.key = f"bench-{uuid.uuid4().hex[:6]}:wal"
        self.sync = redis.Redis.from_url(url)
        self.aio = redis.asyncio.Redis.from_url(url)

    async def open(self) -> Any:
        from agent_saga.wal import RedisWAL

        return RedisWAL(self.url, key=self.key)

    async def floors(self, conc: int, n: int) -> dict[str, float]:
        ping_a = await measure_calls(self.aio.ping, n, True)
        ping_s = await measure_calls(self.sync.ping, n, False)
        stream = f"{self.key}:floor"

        async def xadds() -> Any:
            pipe = self.aio.pipeline(transaction=False)
            for _ in range(conc):
                pipe.xadd(stream, {"r": LINE})
            return await pipe.execute()

        xa = await measure_calls(xadds, max(20, n // max(1, conc // 4)), True)
        self.sync.delete(stream)
        return {"ping_async": pct(ping_a, 0.5), "ping_sync": pct(ping_s, 0.5), "xadd_pipeline": pct(xa, 0.5)}

    def floor_rate(self, conc: int, floors: dict[str, float]) -> float | None:
        return conc / floors["xadd_pipeline"]

    async def close(self) -> None:
        keys = list(self.sync.scan_iter(f"{self.key}*"))
        if keys:
            self.sync.delete(*keys)
        self.sync.close()
        await self.aio.aclose()


class PostgresBackend(Backend):
    name = "postgres"
    target = ("insert_async", 2.0)

    def __init__(self, dsn: str, synchronous_commit: str | None) -> None:
        import psycopg

        self.dsn = dsn
        self.sc = synchronous_commit
        self.table = f"bench_{uuid.uuid4().hex[:6]}"
        self.sync = psycopg.connect(dsn, autocommit=True)
        if self.sc:
            self.sync.execute(f"SET synchronous_commit TO {self.sc}")
        # The floor table has the WAL table's shape: the same row, without the WAL.
        self.sync.execute(
            f"CREATE TABLE {self.table}_floor (v smallint, writer text, seq bigserial, gseq bigint, "
            "ts bigint, type text, saga text, step text, payload text, salt text, digest text, "
            "prev text, hash text, redacted boolean, PRIMARY KEY (writer, seq))"
        )
        self.aio: Any = None
        rec = Record("STEP_COMMITTED", "s-bench", "s-bench/0", PAYLOAD, 1, 1)
        canonical = seal(rec, "0" * 64)
        self.row = (1, "floor", 0, rec.ts, rec.type, rec.saga, rec.step, canonical, rec.salt,
                    rec.digest, rec.prev, rec.hash, False)
        self.insert = (f"INSERT INTO {self.table}_floor (v, writer, gseq, ts, type, saga, step, payload, "
                       "salt, digest, prev, hash, redacted) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, "
                       "%s, %s, %s, %s)")

    async def open(self) -> Any:
        from agent_saga.wal import PostgresWAL

        return PostgresWAL(self.dsn, self.table, synchronous_commit=self.sc)

    async def floors(self, conc: int, n: int) -> dict[str, float]:
        import psycopg

        if self.aio is None:
            self.aio = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
            if self.sc:
                await self.aio.execute(f"SET synchronous_commit TO {self.sc}")
        ins_a = await measure_calls(lambda: self.aio.execute(self.insert, self.row), n, True)
        ins_s = await measure_calls(lambda: self.sync.execute(self.insert, self.row), n, False)
        return {"insert_async": pct(ins_a, 0.5), "insert_sync": pct(ins_s, 0.5)}

    def floor_rate(self, conc: int, floors: dict[str, float]) -> float | None:
        return None  # one INSERT+COMMIT per record is the naive rate: 1 / insert

    async def close(self) -> None:
        if self.aio is not None:
            await self.aio.close()
        for t in (self.table, f"{self.table}_floor"):
            self.sync.execute(f"DROP TABLE IF EXISTS {t}")
        self.sync.execute(f"DROP SEQUENCE IF EXISTS {self.table}_gseq")
        self.sync.close()


class PostgresAsyncBackend(PostgresBackend):
    name = "postgres-async"

    async def open(self) -> Any:
        from agent_saga.wal import PostgresAsyncSink, SinkWAL

        return SinkWAL(PostgresAsyncSink(self.dsn, self.table, synchronous_commit=self.sc))


# ---------------------------------------------------------------------------- servers


@contextlib.contextmanager
def servers(args: argparse.Namespace, want: set[str]) -> Iterator[dict[str, str]]:
    """URLs for Redis and PostgreSQL: given, or throwaway servers from tests/fixtures."""
    out: dict[str, str] = {}
    started: list[Any] = []
    try:
        if "redis" in want:
            if args.redis_url:
                out["redis"] = args.redis_url
            else:
                from fixtures.redis_server import RedisServer

                srv = RedisServer(appendonly=args.redis_aof).start()
                started.append(srv)
                out["redis"] = srv.url
        if want & {"postgres", "postgres-async"}:
            if args.postgres_dsn:
                out["postgres"] = args.postgres_dsn
            else:
                from fixtures.postgres_server import PostgresServer

                pg = PostgresServer().start()
                started.append(pg)
                out["postgres"] = pg.create_database()
        yield out
    finally:
        for s in reversed(started):
            with contextlib.suppress(Exception):
                s.close()


# ---------------------------------------------------------------------------- run


async def bench_backend(b: Backend, levels: list[int], rounds: int, ops: int, floor_n: int,
                        progress: Callable[[str], None]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    wal = await b.open()
    try:
        await measure_steps(wal, 8, 400)  # warm up: connections, prepared statements
        for conc in levels:
            per_round: list[dict[str, Any]] = []
            for r in range(rounds):
                floors = await b.floors(conc, floor_n)  # interleaved with the measured rounds
                lat, rate = await measure_steps(wal, conc, max(ops, conc * 4))
                per_round.append({"floors": floors, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                                  "rate": rate, "floor_rate": b.floor_rate(conc, floors)})
                progress(f"{b.name} c={conc} round {r + 1}/{rounds}: p50 {pct(lat, 0.5) * 1e6:.0f} us, "
                         f"{rate:,.0f} rec/s")
            med = statistics.median
            floor_names = list(per_round[0]["floors"])
            row = {
                "backend": b.name,
                "concurrency": conc,
                "p50_us": med(x["p50"] for x in per_round) * 1e6,
                "p99_us": med(x["p99"] for x in per_round) * 1e6,
                "records_per_s": med(x["rate"] for x in per_round),
                "floors_p50_us": {f: med(x["floors"][f] for x in per_round) * 1e6 for f in floor_names},
                # Ratio per round against the same round's floor, then the median.
                "ratios": {f: med(x["p50"] / x["floors"][f] for x in per_round) for f in floor_names},
            }
            frs = [x["floor_rate"] for x in per_round if x["floor_rate"]]
            if frs:
                row["floor_records_per_s"] = med(frs)
                row["rate_vs_floor"] = med(x["rate"] / x["floor_rate"] for x in per_round if x["floor_rate"])
            rows.append(row)
        st = wal.stats()
        progress(f"{b.name}: {st.durable_seq} records in {st.batches} batches; durability: {st.durability}")
    finally:
        with contextlib.suppress(Exception):
            wal.close()
        await b.close()
    return rows


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if r["backend"] == "redis" and r["concurrency"] == 1:
            out.append({"target": "RedisWAL durable step p50 <= 3 x bare Redis round trip (c=1)",
                        "ratio": r["ratios"]["ping_async"], "ok": r["ratios"]["ping_async"] <= 3.0,
                        "also_vs_sync_client_ping": r["ratios"]["ping_sync"]})
        if r["backend"] == "redis" and r["concurrency"] == 64:
            out.append({"target": "RedisWAL >= 20,000 records/s at 64 concurrent writers",
                        "records_per_s": r["records_per_s"], "ok": r["records_per_s"] >= 20_000})
        if r["backend"] == "postgres" and r["concurrency"] == 1:
            out.append({"target": "PostgresWAL durable step p50 <= 2 x bare INSERT+COMMIT (c=1)",
                        "ratio": r["ratios"]["insert_async"], "ok": r["ratios"]["insert_async"] <= 2.0,
                        "also_vs_sync_insert": r["ratios"]["insert_sync"]})
        if r["backend"] == "postgres-async" and r["concurrency"] == 1:
            out.append({"target": "SinkWAL(PostgresAsyncSink) durable step p50 <= 2.5 x bare INSERT+COMMIT (c=1)",
                        "ratio": r["ratios"]["insert_async"], "ok": r["ratios"]["insert_async"] <= 2.5,
                        "also_vs_sync_insert": r["ratios"]["insert_sync"]})
    return out


def table(rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> str:
    lines = [f"{'backend':14} {'conc':>4} {'p50 us':>8} {'p99 us':>8} {'rec/s':>9}  floors p50 us (step p50 / floor)"]
    for r in rows:
        fl = "  ".join(f"{k} {v:.0f} ({r['ratios'][k]:.2f}x)" for k, v in r["floors_p50_us"].items())
        rate = f"  rate {r['rate_vs_floor']:.2f}x of {r['floor_records_per_s']:,.0f}/s" if "rate_vs_floor" in r else ""
        lines.append(f"{r['backend']:14} {r['concurrency']:>4} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f} "
                     f"{r['records_per_s']:>9,.0f}  {fl}{rate}")
    for c in checks:
        val = f"{c['ratio']:.2f}x" if "ratio" in c else f"{c['records_per_s']:,.0f}/s"
        lines.append(f"{'PASS' if c['ok'] else 'MISS'}  {c['target']}: {val}")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    want = set(args.backends.split(","))
    levels = [int(x) for x in args.concurrency.split(",")]
    progress = (lambda m: print(m, file=sys.stderr)) if not args.quiet else (lambda m: None)
    rows: list[dict[str, Any]] = []
    with servers(args, want) as urls:
        makers: list[Callable[[], Backend]] = []
        if "file" in want:
            makers.append(lambda: FileBackend(args.dir))
        if "redis" in want:
            makers.append(lambda: RedisBackend(urls["redis"]))
        if "postgres" in want:
            makers.append(lambda: PostgresBackend(urls["postgres"], args.pg_synchronous_commit))
        if "postgres-async" in want:
            makers.append(lambda: PostgresAsyncBackend(urls["postgres"], args.pg_synchronous_commit))
        for make in makers:
            rows += await bench_backend(make(), levels, args.rounds, args.ops, args.floor_ops, progress)
    checks = verdicts(rows)
    return {
        "meta": {"python": platform.python_version(), "machine": platform.machine(),
                 "cpus": os.cpu_count(), "rounds": args.rounds, "ops_per_round": args.ops,
                 "redis_aof": args.redis_aof, "pg_synchronous_commit": args.pg_synchronous_commit,
                 "note": "ratios: step p50 / floor p50 of the same round, median over rounds"},
        "results": rows,
        "targets": checks,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="file,redis,postgres,postgres-async")
    p.add_argument("--concurrency", default="1,4,16,64,256")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", type=int, default=1500, help="steps per measured round (at least 4 x concurrency)")
    p.add_argument("--floor-ops", type=int, default=800, help="calls per floor measurement")
    p.add_argument("--dir", default=".", help="where FileWAL and the fsync floor write (same disk)")
    p.add_argument("--redis-url")
    p.add_argument("--postgres-dsn")
    p.add_argument("--redis-aof", action="store_true", help="start Redis with appendfsync always")
    p.add_argument("--pg-synchronous-commit", choices=["on", "off", "local", "remote_write", "remote_apply"])
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result["results"], result["targets"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
