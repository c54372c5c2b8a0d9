"""Debugger benchmark: how soon `agent-saga ui` shows the first page of a large log.

One FileWAL file of ``--records`` records (completed two-step sagas, 6 records each) is
written once; then, in the same run:

  raw_scan     read every line of the file, nothing decoded: the floor of any reader
  decode_scan  ``iter_file_records``: decode every line, no chain check
  listening    spawn ``python -m agent_saga.ui --port 0`` until it prints its address:
               interpreter start and ``import agent_saga`` (the same for every command)
  first_page   the same process until ``/api/sagas`` answers a page of runs (and that
               minus ``listening``: what the index adds)
  indexed      the same process until ``/api/status`` says indexed (every record read,
               decoded, its digest and chain link checked)
  open_last    ``/api/saga`` of the last saga once indexed (read back by byte offset)
  sidebar      ``/api/sagas`` once indexed: the first page of runs, and a search by id
  peak_rss     the server's peak resident memory once indexed (VmHWM), and the file size

Absolute times on a shared machine are noise; the ratios to the raw scan of the same run
are the result. Prints JSON.

    python bench/bench_ui.py [--records 1000000] [--keep PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import _common
from agent_saga import FileWAL
from agent_saga.wal import iter_file_records


def build_log(path: Path, records: int) -> int:
    """Completed two-step sagas, 6 records each, until ``records`` are written."""
    wal = FileWAL(path, sync=False, max_pending=1_000_000)
    n = _common.append_completed_sagas(wal, -(-records // 6), tags=["bench"])
    wal.barrier_sync()
    wal.close()
    return n


def raw_scan(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        n = sum(1 for _ in f)
    assert n
    return time.perf_counter() - t0


def decode_scan(path: Path) -> float:
    t0 = time.perf_counter()
    n = sum(1 for _ in iter_file_records(path))
    assert n
    return time.perf_counter() - t0


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def serve(path: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "agent_saga.ui", "--wal-path", str(path), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        listening = time.perf_counter() - t0
        base = line.split(" at ", 1)[1].split()[0]
        while True:
            page = _get(base + "api/sagas?limit=50")
            if page["sagas"]:
                first_page = time.perf_counter() - t0
                break
            time.sleep(0.005)
        while True:
            status = _get(base + "api/status")
            if status["indexed"]:
                indexed = time.perf_counter() - t0
                break
            time.sleep(0.05)
        assert status["verified"], status
        last = _get(base + f"api/sagas?offset={status['sagas'] - 1}&limit=1")["sagas"][0]["saga_id"]
        t1 = time.perf_counter()
        saga = _get(base + f"api/saga?id={last}")
        open_last = time.perf_counter() - t1
        assert saga["status"] == "COMPLETED" and len(saga["steps"]) == 2
        t1 = time.perf_counter()
        _get(base + "api/sagas?limit=50")
        sidebar = time.perf_counter() - t1
        t1 = time.perf_counter()
        found = _get(base + f"api/sagas?limit=50&q={last}")
        search = time.perf_counter() - t1
        assert found["total"] == 1
        rss = 0
        for row in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if row.startswith("VmHWM:"):
                rss = int(row.split()[1]) * 1024
        return {"listening_s": listening, "first_page_s": first_page,
                "first_page_after_listening_s": first_page - listening, "first_page_sagas": len(page["sagas"]),
                "records_when_first_page": page["counts"], "indexed_s": indexed,
                "index_seconds_in_server": status["index_seconds"], "open_last_saga_s": open_last,
                "sidebar_page_indexed_s": sidebar, "search_indexed_s": search,
                "peak_rss_bytes": rss, "sagas": status["sagas"], "records": status["records"]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keep", help="write (or reuse) the log at this path instead of a temp file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "big.wal"
        t0 = time.perf_counter()
        written = build_log(path, args.records) if not path.exists() else None
        build_s = time.perf_counter() - t0
        raw = raw_scan(path)
        decoded = decode_scan(path)
        ui = serve(path)
        out = {
            "bench": "ui", "python": platform.python_version(), "cpus": os.cpu_count(),
            "records": ui["records"], "file_bytes": path.stat().st_size, "build_s": build_s if written else None,
            "raw_scan_s": raw, "decode_scan_s": decoded, **ui,
            "ratios": {"first_page_to_raw_scan": ui["first_page_s"] / raw,
                       "indexed_to_raw_scan": ui["indexed_s"] / raw,
                       "indexed_to_decode_scan": ui["indexed_s"] / decoded,
                       "peak_rss_to_file_bytes": ui["peak_rss_bytes"] / path.stat().st_size},
        }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
