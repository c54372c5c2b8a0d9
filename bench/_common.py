"""Shared by the benchmarks: percentiles, a throwaway redis-server on a free port, and the
cluster a benchmark drives."""

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


def measure_us(fn: Any, n: int) -> list[float]:
    """``n`` timings of ``fn()`` in microseconds."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def latency_row(name: str, samples: list[float]) -> dict[str, Any]:
    """``{name, n, p50_us, p95_us, p99_us}`` of ``samples`` (microseconds)."""
    return {"name": name, "n": len(samples), "p50_us": round(pct(samples, 0.5), 2),
            "p95_us": round(pct(samples, 0.95), 2), "p99_us": round(pct(samples, 0.99), 2)}


def report(result: dict[str, Any], *, as_json: bool, width: int = 36) -> int:
    """Print ``result`` (its latency ``rows`` and ``targets`` as a table unless
    ``as_json``, then the JSON); 0 if every target is met, else 1."""
    import json

    rows, targets = result["rows"], result["targets"]
    if not as_json:
        print(f"{'measurement':{width}} {'n':>7} {'p50 µs':>9} {'p95 µs':>9} {'p99 µs':>9}")
        for r in rows:
            print(f"{r['name']:{width}} {r['n']:>7} {r['p50_us']:>9.2f} {r['p95_us']:>9.2f} {r['p99_us']:>9.2f}")
        print()
        for name, t in targets.items():
            print(f"{name:{width}} {t['value']:>9} target <= {t['target']}  {'OK' if t['ok'] else 'MISSED'}")
        print()
    print(json.dumps(result, indent=None if as_json else 2))
    return 0 if all(t["ok"] for t in targets.values()) else 1


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


def kube_cluster(kubeconfig: str | None, work: Any) -> tuple[Any, Any]:
    """``(cluster, control plane)`` with this tree's CRDs installed: the cluster of
    ``kubeconfig`` (``--kubeconfig``; control plane ``None``), else the local control
    plane started under ``work`` (the caller stops it)."""
    from pathlib import Path

    from agent_saga_operator.testing import install_crds
    from fixtures.controlplane import ControlPlane, KubeCluster

    cp = None
    if kubeconfig:
        cluster = KubeCluster(kubeconfig=Path(kubeconfig), local=False)
    else:
        cp = ControlPlane(Path(work) / "kube")
        cp.start()
        cluster = cp.cluster()
    try:
        install_crds(cluster.kubectl, cluster.api_client())
    except BaseException:
        if cp is not None:
            cp.stop()
        raise
    return cluster, cp
