"""Mesh benchmark: `RecordSet.load` + merge + `MeshView` verification of D device logs of N
records each, next to the floor measured in the same run: reading and decoding the same
lines (`iter_file_records`), and verifying each chain alone (`verify_records`).

    python bench/bench_mesh.py                      # table
    python bench/bench_mesh.py --json --devices 4 --records 5000 --rounds 5

Absolute times on a shared machine are noise: each round measures floor and merge back to
back, the ratio is per round, the median over rounds is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

from agent_saga.chain import seal, verify_records  # noqa: E402
from agent_saga.mesh import MeshView, RecordSet  # noqa: E402
from agent_saga.records import GENESIS, Record, encode_line  # noqa: E402
from agent_saga.wal import iter_file_records  # noqa: E402


def write_device(directory: Path, device: str, n: int, clock0: int) -> Path:
    prev = GENESIS
    lines = []
    for i in range(1, n + 1):
        saga = f"{device}-s{(i - 1) // 4}"
        rec = Record("STEP_COMMITTED", saga, f"{saga}/{i % 4}",
                     {"amount": i, "mesh": {"device": device, "lamport": clock0 + i}}, i, 1_764_000_000_000_000 + i)
        canonical = seal(rec, prev)
        prev = rec.hash
        lines.append(encode_line(rec, canonical))
    path = directory / f"{device}.wal"
    path.write_bytes(b"".join(lines))
    return path


def one_round(dirs: list[Path], out: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    for d in dirs:
        for f in sorted(d.glob("*.wal")):
            verify_records(iter_file_records(f))
    floor = time.perf_counter() - t0
    t0 = time.perf_counter()
    merged, damage = RecordSet.load(*dirs)
    view = MeshView(merged)
    assert view.ok and not damage
    merged.write(out)
    merge = time.perf_counter() - t0
    return {"floor_s": floor, "merge_s": merge, "ratio": merge / floor}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--records", type=int, default=5000, help="records per device")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mesh-") as tmp:
        root = Path(tmp)
        dirs = []
        for d in range(args.devices):
            dd = root / f"dev-{d}"
            dd.mkdir()
            write_device(dd, f"dev-{d}", args.records, d)
            dirs.append(dd)
        rounds = [one_round(dirs, root / f"out-{i}") for i in range(args.rounds)]
    total = args.devices * args.records
    med = statistics.median
    result: dict[str, Any] = {
        "meta": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg(),
                 "devices": args.devices, "records_per_device": args.records, "rounds": args.rounds,
                 "note": "ratio: load+merge+verify+write / (read+verify each chain alone), per round, median"},
        "merge_s": med(r["merge_s"] for r in rounds),
        "floor_s": med(r["floor_s"] for r in rounds),
        "merge_records_per_s": total / med(r["merge_s"] for r in rounds),
        "ratio_vs_floor": med(r["ratio"] for r in rounds),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{total} records of {args.devices} devices: merge+verify+write {result['merge_s'] * 1000:.0f} ms "
              f"({result['merge_records_per_s']:,.0f} records/s), {result['ratio_vs_floor']:.2f}x of reading "
              f"and verifying each chain alone ({result['floor_s'] * 1000:.0f} ms); load {result['meta']['load']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
