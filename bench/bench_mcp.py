"""The MCP proxy: what ``agent-saga mcp`` adds to a ``tools/call``, against a direct call.

    .venv/bin/python bench/bench_mcp.py [--n 2000] [--json]

Targets:
    REVERSIBLE tools/call through the proxy adds <= 150 µs p50 over a direct call
    COMPENSABLE adds <= 2.5 x a bare fsync p50 over a direct call (FileWAL)

Measured in the same run: one client (JSON-RPC lines over pipes, one call at a time)
calls a minimal stdio server (bench/_mcp_echo.py, answers at once) directly, and through
the proxy in front of the same server (policy: ``echo`` REVERSIBLE, ``charge``
COMPENSABLE with ``refund`` as its inverse by ``$.id``; FileWAL with fsync); the floor is
a bare ``write`` + ``fdatasync`` of one line in the WAL's directory. Rounds interleave
(direct, REVERSIBLE, COMPENSABLE, fsync, ...) so load on the machine hits all alike.
"Added" is the difference of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import _common  # noqa: E402

HERE = Path(__file__).resolve().parent
ECHO = [sys.executable, str(HERE / "_mcp_echo.py")]
POLICY = {"mode": "enforce", "tools": {
    "echo": {"semantics": "REVERSIBLE"},
    "charge": {"semantics": "COMPENSABLE", "compensate": {"tool": "refund", "args": {"charge": "$.id"}}},
    "refund": {"semantics": "IRREVERSIBLE"}}}


class Client:
    """A JSON-RPC line client on a child process's pipes."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.n = 0
        self.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "bench", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdout is not None
        self.n += 1
        self.send({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        resp: dict[str, Any] = json.loads(self.proc.stdout.readline())
        if "error" in resp:
            raise RuntimeError(resp["error"])
        return resp

    def timed(self, tool: str, n: int) -> list[float]:
        out = []
        clock = time.perf_counter_ns
        params = {"name": tool, "arguments": {"amount": 12}}
        for _ in range(n):
            t = clock()
            self.call("tools/call", params)
            out.append((clock() - t) / 1000)
        return out

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def fsyncs(path: Path, n: int) -> list[float]:
    out = []
    clock = time.perf_counter_ns
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for _ in range(n):
            t = clock()
            os.write(fd, b'{"bench": "one WAL-sized line of about a hundred bytes, like a STEP_COMMITTED"}\n')
            os.fdatasync(fd)
            out.append((clock() - t) / 1000)
    finally:
        os.close(fd)
    return out


def stats(us: list[float]) -> dict[str, float]:
    return {"p50_us": round(_common.pct(us, 0.5), 1), "p90_us": round(_common.pct(us, 0.9), 1),
            "p99_us": round(_common.pct(us, 0.99), 1)}


def run(n: int, rounds: int = 5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        policy = Path(d) / "policy.json"
        policy.write_text(json.dumps(POLICY))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
        proxy_argv = [sys.executable, "-m", "agent_saga.cli", "mcp", "--policy", str(policy),
                      "--wal", str(Path(d) / "proxy.wal"), "--name", "echo", "--", *ECHO]
        direct, proxied = Client(ECHO), Client(proxy_argv, env=env)
        try:
            warm = max(200, n // 10)
            direct.timed("echo", warm)
            proxied.timed("echo", warm)
            proxied.timed("charge", warm // 4)
            fsyncs(Path(d) / "floor", warm // 4)
            a: list[float] = []
            b: list[float] = []
            c: list[float] = []
            f: list[float] = []
            comp = max(100, n // 4)
            for _ in range(rounds):
                a += direct.timed("echo", n // rounds)
                b += proxied.timed("echo", n // rounds)
                c += proxied.timed("charge", comp // rounds)
                f += fsyncs(Path(d) / "floor", comp // rounds)
        finally:
            direct.close()
            proxied.close()
    da, rb, cc, ff = stats(a), stats(b), stats(c), stats(f)
    added_rev = round(rb["p50_us"] - da["p50_us"], 1)
    added_comp = round(cc["p50_us"] - da["p50_us"], 1)
    ratio = round(added_comp / ff["p50_us"], 2) if ff["p50_us"] else float("inf")
    return {
        "bench": "mcp", "python": sys.version.split()[0], "calls": n, "compensable_calls": comp,
        "direct": da, "proxy_reversible": rb, "proxy_compensable": cc, "bare_fsync": ff,
        "added_reversible_p50_us": added_rev, "added_compensable_p50_us": added_comp,
        "compensable_added_over_fsync": ratio,
        "targets": {
            "reversible_added_p50_us": {"value": added_rev, "target": 150.0, "ok": added_rev <= 150.0},
            "compensable_added_over_fsync_p50": {"value": ratio, "target": 2.5, "ok": ratio <= 2.5},
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(args.n)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'':36} {'p50 µs':>9} {'p90 µs':>9} {'p99 µs':>9}")
    for label, k in (("direct tools/call", "direct"), ("through the proxy, REVERSIBLE", "proxy_reversible"),
                     ("through the proxy, COMPENSABLE", "proxy_compensable"), ("bare write + fdatasync", "bare_fsync")):
        s = result[k]
        print(f"{label:36} {s['p50_us']:>9.1f} {s['p90_us']:>9.1f} {s['p99_us']:>9.1f}")
    t = result["targets"]
    print(f"REVERSIBLE adds {result['added_reversible_p50_us']} µs p50 (goal <= 150)"
          f"{'  OK' if t['reversible_added_p50_us']['ok'] else '  MISSED'}; COMPENSABLE adds "
          f"{result['added_compensable_p50_us']} µs = {result['compensable_added_over_fsync']} x a bare fsync "
          f"(goal <= 2.5){'  OK' if t['compensable_added_over_fsync_p50']['ok'] else '  MISSED'}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
