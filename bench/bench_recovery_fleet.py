"""Recovery fleet benchmark: orphaned sagas resolved per second by 1 and by 3 daemon processes.

One RedisWAL (a throwaway redis-server, or ``--redis-url``) holds ``--sagas`` orphaned
sagas, written by ``--writers`` agent writers that "died" after one COMPENSABLE step
each (intent + committed, no terminal record). Then, for each fleet size in
``--replicas`` (default 1 and 3), on a fresh copy of that log:

  - that many real daemon processes start (``RecoveryDaemon`` over the RedisWAL, a
    shared ``RedisLedger`` and ``RedisClaimLock``), each reads the log once (a dry-run
    sweep: what a daemon already running had read when the agents died), and waits;
  - all are released at the same instant; each sweeps until no saga is in flight;
  - the wall time from the release to the last daemon's exit gives sagas/s; every
    daemon reports its peak RSS (``ru_maxrss``) and what it did.

Also reported: the fleet's CPU time per saga (every daemon's, summed). It does not
depend on how loaded the machine is, so it shows what replicas duplicate: with no
duplicated work, 3 replicas cost the CPU per saga 1 does.

And the floor, measured before each fleet in the same run: one bare round trip (a PING
on the asyncio client the daemons use); each fleet's time per saga is also given in those
round trips, which carries across machines and loads better than sagas/s. Round trips to
Redis per saga are counted in the daemons (every request the clients send: a pipeline
or a script is one).

Checked, not assumed: every saga is resolved exactly once (the ledger holds one done
entry per step, the handler was called once per step in total, no saga left in flight).

The fleet's ratio (3 replicas / 1 replica, same run, same machine) is the result;
absolute rates on a shared machine are noise. Prints a table, or JSON with ``--json``.

Before the release each daemon reads the log (``_refresh``: what a daemon already running
had read); its RSS then is ``scan_rss_mb``. ``--baseline DIR`` measures another version's
``runtime/`` first on a copy of the same log (old vs new in one run, ``over_baseline``);
``--progress DIR`` has every daemon write how far it got after each sweep (a long run).

    python bench/bench_recovery_fleet.py [--sagas 5000] [--replicas 1,3] [--json]
    python bench/bench_recovery_fleet.py --sagas 100000 --replicas 3     # the memory bound
    git archive main runtime | tar -x -C /tmp/base && \
        python bench/bench_recovery_fleet.py --baseline /tmp/base/runtime --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

DAEMON = r"""
import asyncio, json, os, resource, sys, time
if os.environ.get("BENCH_FLEET_PARSER") == "python":
    sys.modules["hiredis"] = None  # redis-py's own RESP parser, as without the hiredis package
from agent_saga.recovery import RecoveryDaemon, RedisClaimLock, RedisLedger
from agent_saga.wal import RedisWAL

def count_round_trips():
    # Count every request sent to Redis (a pipeline or a script is one round trip).
    import redis.asyncio.connection as aconn
    import redis.connection as sconn
    trips = {"async": 0, "sync": 0}
    def wrap(cls, kind, is_async):
        orig = cls.send_packed_command
        if is_async:
            async def send(self, command, check_health=True):
                trips[kind] += 1
                return await orig(self, command, check_health)
        else:
            def send(self, command, check_health=True):
                trips[kind] += 1
                return orig(self, command, check_health)
        cls.send_packed_command = send
    wrap(aconn.AbstractConnection, "async", True)
    wrap(sconn.AbstractConnection, "sync", False)
    return trips

TRIPS = count_round_trips()
PROGRESS = None
# Replicas split the orphans (RecoveryDaemon(shard=True)) where this version can.
import inspect
SHARD = os.environ.get("BENCH_FLEET_SHARD") != "0" and "shard" in inspect.signature(RecoveryDaemon).parameters
WAIT = float(os.environ.get("BENCH_FLEET_WAIT") or 0) or None  # --sweep-wait
HAND = "in_hand" in inspect.signature(RecoveryDaemon).parameters  # an older version holds concurrency sagas

async def main():
    url, key, go, ready, conc, hand = sys.argv[1:7]
    global PROGRESS
    PROGRESS = os.environ.get("BENCH_FLEET_PROGRESS") and os.path.join(
        os.environ["BENCH_FLEET_PROGRESS"], os.path.basename(ready) + ".json")
    wal = RedisWAL(url, key=key, max_pending=1_000_000)
    d = RecoveryDaemon(wal, ledger=RedisLedger(url, namespace=key), lock=RedisClaimLock(url, namespace=key),
                       imports=["_fleet_handlers"], clock=lambda: time.time() + 3600,
                       concurrency=int(conc), compensation_timeout=None,
                       **({"shard": True} if SHARD else {}),
                       **({"in_hand": int(hand)} if HAND and int(hand) > int(conc) else {}))
    await d._refresh()  # the log as a running daemon had read it
    if SHARD:
        await d.join()  # a running replica is in the membership
    with open(ready + ".tmp", "w") as f:  # the RSS of holding every orphan read, before any is resolved
        f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    os.rename(ready + ".tmp", ready)
    if go == "-":  # --scan-only: the memory of holding every orphan is all that is measured
        await d.close()
        wal.close()
        return
    parent = os.getppid()
    while not os.path.exists(go):
        if os.getppid() != parent:
            sys.exit(3)  # the benchmark is gone: do not wait for it forever
        await asyncio.sleep(0.002)
    trips0 = dict(TRIPS)
    t0 = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = ru0.ru_utime + ru0.ru_stime
    out = {"recovered": 0, "calls": 0, "sweeps": 0, "statuses": {}, "records_read": 0}
    reads0 = d._reads_done
    while True:
        # As run(interval) sweeps (recoveryd): a sweep reports what ended within WAIT
        # seconds and the rest goes on, so no report holds a whole share's results.
        rep = await d.sweep(wait=WAIT)
        if rep.halted:
            print(json.dumps({"error": rep.halted})); sys.exit(2)
        out["sweeps"] += 1
        if rep.error:  # a store that did not answer in time (a loaded machine): the next sweep resumes
            out["sweep_errors"] = out.get("sweep_errors", 0) + 1
            if out["sweep_errors"] > 100:
                print(json.dumps({"error": rep.error})); sys.exit(2)
        out["recovered"] += rep.recovered
        out["records_read"] += rep.records_read
        out["calls"] += rep.compensations_run
        for r in rep.results:
            out["statuses"][r.status] = out["statuses"].get(r.status, 0) + 1
        if PROGRESS:  # how far a long run got, and its memory, while it runs
            with open(PROGRESS + ".tmp", "w") as f:
                json.dump({"recovered": out["recovered"], "in_flight": rep.in_flight,
                           "seconds": round(time.monotonic() - t0, 1),
                           "maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}, f)
            os.rename(PROGRESS + ".tmp", PROGRESS)
        if rep.in_flight == 0 and not d._background and not d._late:
            break
        if not rep.recovered:
            await asyncio.sleep(0.05)  # the rest is claimed by others: a short interval, not a spin
    out["seconds"] = time.monotonic() - t0
    out["log_reads"] = d._reads_done - reads0  # reads of what is new (each shared by the claims waiting)
    out["round_trips"] = {k: TRIPS[k] - trips0[k] for k in TRIPS}
    await d.close()
    wal.close()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["maxrss_mb"] = round(ru.ru_maxrss / 1024, 1)
    out["cpu_s"] = round(ru.ru_utime + ru.ru_stime - cpu0, 2)
    print(json.dumps(out))

asyncio.run(main())
"""


def build(url: str, key: str, sagas: int, writers: int) -> None:
    """``sagas`` orphans: started, one COMPENSABLE step committed, owner gone."""
    from agent_saga.wal import RedisWAL

    wals = [RedisWAL(url, key=key, writer=f"agent-{w}", max_pending=1_000_000, max_batch=1000)
            for w in range(writers)]
    for i in range(sagas):
        if i and i % 10_000 == 0:
            print(f"built {i} orphans", file=sys.stderr, flush=True)
        wal = wals[i % len(wals)]
        s = f"orphan-{i:08d}"
        step = f"{s}/0"
        wal.append("SAGA_STARTED", s, None, {"name": "checkout", "tags": []})
        wal.append("STEP_INTENT", s, step, {"tool": "pay.charge", "semantics": "COMPENSABLE",
                                            "policy_args": {"amount": 100}, "idempotency_key": f"k-{i}"})
        wal.append("STEP_COMMITTED", s, step, {"compensation": {
            "handler": "bench.fleet.refund", "kwargs": {"charge_id": f"ch_{i}"}, "description": ""}})
    for wal in wals:
        wal.barrier_sync(timeout=600)
        wal.close()


def copy_log(url: str, src: str, dst: str) -> None:
    """Copy every key of the log ``src`` to ``dst`` on the server (DUMP/RESTORE)."""
    import redis

    r = redis.Redis.from_url(url)
    for k in r.scan_iter(match=f"{src}:*", count=1000):
        dumped = r.dump(k)
        assert dumped is not None, k  # listed by SCAN a moment ago
        r.restore(dst + k.decode()[len(src):], 0, dumped)


def server_cpu(url: str) -> float:
    """CPU seconds the Redis server has used (user + system, INFO CPU)."""
    import redis

    info = redis.Redis.from_url(url).info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def round_trip_floor(url: str, n: int = 2000) -> float:
    """The floor: µs per bare round trip (PING, one at a time) of the asyncio client the
    daemons use for claims and the ledger, measured in this run, on this machine."""
    import asyncio

    import redis.asyncio as aredis

    async def go() -> float:
        client = aredis.Redis.from_url(url)
        await client.ping()
        t = time.perf_counter()
        for _ in range(n):
            await client.ping()
        dt = time.perf_counter() - t
        await client.aclose()
        return dt / n * 1e6

    return asyncio.run(go())


def check(url: str, key: str, sagas: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    import redis

    r = redis.Redis.from_url(url)
    done = r.hlen(f"{{{key}}}:recovery:done")
    calls = sum(x["calls"] for x in results)
    recovered = sum(x["recovered"] for x in results)
    # Handler calls started, per step, as the ledger journaled them before each call: a
    # saga whose first attempt stopped after its call (a store that did not answer) and
    # was finished from the ledger has one call but none in a report's count.
    attempts = [int(v) for v in r.hvals(f"{{{key}}}:recovery:attempts")]
    return {"ledger_done": done, "handler_calls": calls, "recovered": recovered,
            "calls_started": sum(attempts), "most_calls_per_step": max(attempts, default=0),
            "exactly_once": done == sagas and recovered == sagas and sum(attempts) == sagas
            and max(attempts, default=0) == 1 and calls <= sagas}


def run_fleet(url: str, key: str, sagas: int, replicas: int, concurrency: int, in_hand: int | None = None,
              py_spy: str | None = None, scan_only: bool = False, runtime: Path | None = None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    go = tmp / "go"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(runtime or REPO / "runtime"),
                                                       os.environ.get("PYTHONPATH", "")]))
    if py_spy:
        os.makedirs(py_spy, exist_ok=True)
    # Each daemon's stderr goes to a file: a pipe read only after another daemon exits fills
    # up with its log lines and stops it mid-run (the fleet then runs one replica at a time).
    errs_of = [open(tmp / f"stderr-{i}", "w+") for i in range(replicas)]  # noqa: SIM115 - closed below
    procs = [
        subprocess.Popen([*(["py-spy", "record", "-r", "200", "-f", "raw", "-o",
                             os.path.join(py_spy, f"daemon-{replicas}-{i}.txt"), "--"] if py_spy else []),
                          sys.executable, "-c", DAEMON, url, key, "-" if scan_only else str(go),
                          str(tmp / f"ready-{i}"),
                          str(concurrency), str(in_hand or 4 * concurrency)], env=env, stdout=subprocess.PIPE,
                         stderr=errs_of[i], text=True)
        for i in range(replicas)
    ]

    def stderr_of(i: int) -> str:
        errs_of[i].seek(0)
        return errs_of[i].read()[-2000:]

    deadline = time.monotonic() + 1800
    while not all((tmp / f"ready-{i}").exists() for i in range(replicas)):
        gone = any(p.poll() is not None and not (tmp / f"ready-{i}").exists() for i, p in enumerate(procs))
        if gone or time.monotonic() > deadline:
            errs = [stderr_of(i) for i, p in enumerate(procs) if p.poll() is not None]
            sys.exit(f"a daemon exited before it was ready: {errs}")
        time.sleep(0.01)
    scan_rss = max(int((tmp / f"ready-{i}").read_text()) for i in range(replicas))
    if scan_only:
        for p in procs:
            p.communicate(timeout=600)
        return {"replicas": replicas, "runtime": "baseline" if runtime is not None else "this tree",
                "scan_rss_mb": round(scan_rss / 1024, 1)}
    server0 = server_cpu(url)
    t0 = time.monotonic()
    go.write_text("go")
    outs = [(p.communicate(timeout=3600)[0], stderr_of(i)) for i, p in enumerate(procs)]
    wall = time.monotonic() - t0
    for f in errs_of:
        f.close()
    server_s = server_cpu(url) - server0
    results = []
    for p, (out, err) in zip(procs, outs, strict=True):
        lines = [x for x in out.strip().splitlines() if x.startswith("{")]
        if p.returncode != 0 or not lines:
            sys.exit(f"a daemon failed (exit {p.returncode}): {out[-2000:]} {err[-2000:]}")
        results.append(json.loads(lines[-1]))
    return {
        "replicas": replicas,
        "runtime": "baseline" if runtime is not None else "this tree",
        "seconds": round(wall, 2),
        "sagas_per_s": round(sagas / wall),
        "peak_rss_mb": max(x["maxrss_mb"] for x in results),
        # a daemon's RSS once it holds every orphan of the log (read, verified, planned)
        "scan_rss_mb": round(scan_rss / 1024, 1),
        # CPU of the whole fleet per saga: what replicas duplicate shows here, whatever the load
        "cpu_ms_per_saga": round(sum(x["cpu_s"] for x in results) / sagas * 1000, 2),
        # the Redis server's own CPU per saga (INFO CPU), on the same cores as the fleet
        "redis_cpu_ms_per_saga": round(server_s / sagas * 1000, 2),
        # Requests to Redis per saga, the whole fleet's (claims and ledger: the asyncio
        # client; log reads and writes: the WAL's synchronous one)
        "round_trips_per_saga": {k: round(sum(x["round_trips"][k] for x in results) / sagas, 2)
                                 for k in ("async", "sync")},
        # records every replica read and verified, per saga resolved (the fleet's), and its reads of the log
        "records_read_per_saga": round(sum(x.get("records_read", 0) for x in results) / sagas, 2),
        "log_reads_per_saga": round(sum(x.get("log_reads", 0) for x in results) / sagas, 3),
        # sweeps stopped early by a store that did not answer in time (resumed by the next)
        "sweep_errors": sum(x.get("sweep_errors", 0) for x in results),
        "daemons": results,
        "check": check(url, key, sagas, results),
    }


def _has_hiredis() -> bool:
    try:
        import hiredis  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sagas", type=int, default=5000, help="orphaned sagas (100000 for the memory bound)")
    ap.add_argument("--writers", type=int, default=8, help="agent writers that left them")
    ap.add_argument("--replicas", default="1,3", help="fleet sizes to measure, comma-separated")
    ap.add_argument("--concurrency", type=int, default=8, help="compensations each daemon runs at once")
    ap.add_argument("--in-hand", type=int, default=None,
                    help="sagas each daemon holds at once (RecoveryDaemon(in_hand=), recoveryd --in-hand; "
                         "default 4 x --concurrency)")
    ap.add_argument("--redis-url", help="an existing Redis (default: start a throwaway redis-server)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--parser", choices=["default", "python"], default="default",
                    help="python: the daemons use redis-py's pure-Python RESP parser even if hiredis is installed")
    ap.add_argument("--scan-only", action="store_true",
                    help="only read the log into each daemon and report its RSS (the memory of N orphans held)")
    ap.add_argument("--no-shard", action="store_true",
                    help="replicas do not split the orphans (every one races for every saga; claims decide)")
    ap.add_argument("--sweep-wait", type=float, default=None, metavar="SECONDS",
                    help="each sweep waits at most this long for its resolutions, the rest going on "
                         "(as recoveryd's run(interval) does: no report holds a whole share's results); "
                         "default: every sweep waits for all it started")
    ap.add_argument("--py-spy", metavar="DIR", help="profile every daemon with py-spy (raw stacks into DIR)")
    ap.add_argument("--progress", metavar="DIR",
                    help="each daemon writes how far it got (recovered, in flight, peak RSS) to DIR after every sweep")
    ap.add_argument("--baseline", metavar="DIR", type=Path,
                    help="another version's runtime/ directory (e.g. `git archive main runtime | tar -x -C DIR`): "
                         "each fleet size is measured with it first, then with this tree, on copies of one log")
    args = ap.parse_args()
    # A SIGTERM (a timeout, ^C from a wrapper) still runs the cleanup below: no stray server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.parser == "python":
        os.environ["BENCH_FLEET_PARSER"] = "python"
    if args.sweep_wait:
        os.environ["BENCH_FLEET_WAIT"] = str(args.sweep_wait)
    if args.no_shard:
        os.environ["BENCH_FLEET_SHARD"] = "0"
    if args.progress:
        os.makedirs(args.progress, exist_ok=True)
        os.environ["BENCH_FLEET_PROGRESS"] = os.path.abspath(args.progress)
    sys.path.insert(0, str(REPO / "runtime"))
    proc = None
    url = args.redis_url
    workdir = None
    if url is None:
        url, proc, workdir = _common.start_redis("bench-fleet-redis-")
    try:
        base = f"bench-fleet-{os.getpid()}"
        t = time.monotonic()
        build(url, base, args.sagas, args.writers)
        build_s = time.monotonic() - t
        fleets = []
        floors = []
        runtimes: list[Path | None] = [args.baseline, None] if args.baseline else [None]
        for n in [int(x) for x in args.replicas.split(",") if x.strip()]:
            for runtime in runtimes:
                key = f"{base}-r{n}" + ("-base" if runtime is not None else "")
                copy_log(url, base, key)
                floors.append(round_trip_floor(url))
                fleets.append(run_fleet(url, key, args.sagas, n, args.concurrency, args.in_hand, args.py_spy,
                                        args.scan_only, runtime=runtime))
                fleet = fleets[-1]
                if args.scan_only:
                    continue
                # The saga's wall time in bare round trips of this run: comparable across loads.
                fleet["round_trip_us"] = round(floors[-1], 1)
                fleet["saga_time_in_round_trips"] = round(1e6 / fleet["sagas_per_s"] / floors[-1], 2)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    by = {f["replicas"]: f["sagas_per_s"] for f in fleets if "sagas_per_s" in f and f["runtime"] == "this tree"}
    base_by = {f["replicas"]: f["sagas_per_s"] for f in fleets if "sagas_per_s" in f and f["runtime"] == "baseline"}
    result: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "loadavg": [round(x, 2) for x in os.getloadavg()]},
        "parser": "python" if args.parser == "python" else ("hiredis" if _has_hiredis() else "python"),
        "sagas": args.sagas, "writers": args.writers, "concurrency": args.concurrency,
        "in_hand": args.in_hand or 4 * args.concurrency,
        "shard": not args.no_shard,
        "build_seconds": round(build_s, 1), "fleets": fleets,
    }
    if args.scan_only:
        result["targets"] = {}
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    targets: dict[str, bool] = {"exactly_once": all(f["check"]["exactly_once"] for f in fleets)}
    if 3 in by:
        targets["three_replicas_ge_1000_per_s"] = by[3] >= 1000
    if 1 in by and 3 in by:
        result["three_over_one"] = round(by[3] / by[1], 2)
        targets["three_replicas_ge_2.5x_one"] = by[3] >= 2.5 * by[1]
    if base_by:
        result["over_baseline"] = {n: round(by[n] / base_by[n], 2) for n in by if n in base_by}
    result["targets"] = targets
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(f"agent-saga recovery fleet — {args.sagas} orphans from {args.writers} writers, "
          f"daemon concurrency {args.concurrency}, load {result['machine']['loadavg']}")
    print(f"  {'runtime':>9} {'replicas':>8} {'seconds':>9} {'sagas/s':>9} {'saga/bare RT':>12} {'CPU ms/saga':>12} "
          f"{'trips/saga':>11} {'peak RSS MB':>12}  statuses")
    for f in fleets:
        st: dict[str, int] = {}
        for d in f["daemons"]:
            for k, v in d["statuses"].items():
                st[k] = st.get(k, 0) + v
        trips = sum(f["round_trips_per_saga"].values())
        print(f"  {f['runtime']:>9} {f['replicas']:>8} {f['seconds']:>9} {f['sagas_per_s']:>9} {f['saga_time_in_round_trips']:>12} "
              f"{f['cpu_ms_per_saga']:>12} {trips:>11.2f} {f['peak_rss_mb']:>12}  {st}")
    if "three_over_one" in result:
        print(f"  3 replicas / 1 replica: {result['three_over_one']}×")
    if "over_baseline" in result:
        print(f"  this tree / baseline, sagas/s by replicas: {result['over_baseline']}")
    print("  targets: " + ", ".join(f"{k}={'met' if v else 'MISSED'}" for k, v in targets.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
