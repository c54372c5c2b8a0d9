"""Shared by the benchmarks: percentiles and a throwaway redis-server on a free port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any


def append_completed_sagas(wal: Any, sagas: int, *, tags: list[str] | None = None, barrier_every: int = 10_000) -> int:
    """Append ``sagas`` completed two-step sagas (6 records each) to ``wal``; the records
    written. A barrier every ``barrier_every`` sagas keeps the queue under its bound."""
    for i in range(sagas):
        s = f"bench-{i:08d}"
        wal.append("SAGA_STARTED", s, None, {"name": "checkout", "tags": tags or []})
        for j in range(2):
            step = f"{s}/{j}"
            wal.append("STEP_INTENT", s, step, {"tool": "pay.charge", "semantics": "COMPENSABLE",
                                                "policy_args": {"amount": 100 * j}})
            wal.append("STEP_COMMITTED", s, step, {"compensation": {
                "handler": "pay.refund", "kwargs": {"charge_id": f"ch_{i}_{j}"}, "description": ""}})
        wal.append("SAGA_COMPLETED", s, None, {"steps": 2})
        if (i + 1) % barrier_every == 0:
            wal.barrier_sync()
    return sagas * 6


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (nearest rank)."""
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def start_redis(prefix: str = "bench-redis-") -> tuple[str, subprocess.Popen[bytes], str]:
    """Start redis-server (no persistence) on a free 127.0.0.1 port: (url, process, dir)."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not on PATH: apt-get install redis-server, or pass --redis-url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix=prefix)
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--daemonize", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    return f"redis://127.0.0.1:{port}/0", proc, workdir
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("redis-server did not start")
