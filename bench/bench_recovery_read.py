"""Recovery read benchmark: what checking every record (digest + chain) costs a sweep.

Recovery acts only on records it has verified, and still reads the log once per sweep.
Measured in one run, over the same FileWAL file, rounds interleaved:

  floor      decode every line (``records.decode_line``), no check: what a reader that
             trusts the log would pay
  verified   ``PathSource.read_new()`` from the start: decode, digest and chain check of
             every record (``chain.ChainVerifier``), as the first sweep reads
  sweep      a daemon's whole first sweep (``dry_run``): the verified read, the scan and
             the plan of every orphan
  next       a later sweep after ``--append`` more records: it reads and checks only those

Absolute times on a shared machine are noise: the ratios to the floor of the same round
(median over rounds) are the result. Prints a table, or JSON with ``--json``.

    python bench/bench_recovery_read.py [--sagas 20000] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
from agent_saga import FileWAL
from agent_saga.recovery import PathSource, RecoveryDaemon
from agent_saga.wal import iter_file_records


def build_log(path: Path, sagas: int) -> int:
    """``sagas`` completed two-step sagas (6 records each) and a few live ones."""
    wal = FileWAL(path, sync=False)
    _common.append_completed_sagas(wal, sagas)
    for i in range(10):
        wal.append("SAGA_STARTED", f"live-{i}", None, {"name": None, "tags": []})
        wal.append("SAGA_LEASE", f"live-{i}", None, {"lease_seconds": 3600})
    wal.barrier_sync()
    wal.close()
    return sagas * 6 + 20


def append(path: Path, n: int, start: int) -> None:
    wal = FileWAL(path, sync=False)
    for i in range(n):
        wal.append("SAGA_STARTED", f"late-{start + i}", None, {"name": None, "tags": []})
    wal.barrier_sync()
    wal.close()


def floor(path: Path) -> float:
    t0 = time.perf_counter()
    n = sum(1 for _ in iter_file_records(path))
    assert n
    return time.perf_counter() - t0


async def verified(path: Path) -> float:
    src = PathSource(path)
    t0 = time.perf_counter()
    read = await src.read_new()
    dt = time.perf_counter() - t0
    assert read.from_start and read.records
    return dt


async def sweeps(path: Path, appended: int, start: int) -> tuple[float, float]:
    daemon = RecoveryDaemon(str(path), lease_grace=0)
    try:
        t0 = time.perf_counter()
        rep = await daemon.sweep(dry_run=True)
        first = time.perf_counter() - t0
        assert rep.ok and rep.live == 10, rep.halted
        append(path, appended, start)
        t0 = time.perf_counter()
        rep = await daemon.sweep(dry_run=True)
        nxt = time.perf_counter() - t0
        assert rep.ok and rep.records_read == appended, (rep.records_read, rep.halted)
        return first, nxt
    finally:
        await daemon.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sagas", type=int, default=20000)
    ap.add_argument("--append", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows: dict[str, list[float]] = {"floor": [], "verified": [], "sweep": [], "next": []}
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as d:
        base = Path(d) / "base.wal"
        records = build_log(base, a.sagas)
        for r in range(a.rounds):
            path = Path(d) / f"round-{r}.wal"
            path.write_bytes(base.read_bytes())
            rows["floor"].append(floor(path))
            rows["verified"].append(asyncio.run(verified(path)))
            first, nxt = asyncio.run(sweeps(path, a.append, r * a.append))
            rows["sweep"].append(first)
            rows["next"].append(nxt)
    ratio = {k: statistics.median(v / f for v, f in zip(rows[k], rows["floor"], strict=True)) for k in rows}
    out: dict[str, Any] = {
        "machine": platform.platform(), "python": sys.version.split()[0], "records": records,
        "appended": a.append, "rounds": a.rounds,
        "median_seconds": {k: round(statistics.median(v), 4) for k, v in rows.items()},
        "ratio_to_floor": {k: round(v, 2) for k, v in ratio.items()},
        "verified_records_per_s": round(records / statistics.median(rows["verified"])),
    }
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{records} records, {a.rounds} rounds ({out['machine']}, Python {out['python']})")
    print(f"{'':10} {'median s':>10} {'x floor':>8}")
    for k in rows:
        print(f"{k:10} {out['median_seconds'][k]:>10} {out['ratio_to_floor'][k]:>8}")
    print(f"verified read: {out['verified_records_per_s']} records/s; a later sweep read {a.append} records")


if __name__ == "__main__":
    main()
