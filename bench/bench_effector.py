"""The effector sidecar's cost: ``agent-saga mcp --listen`` (Streamable HTTP, as the sidecar
of examples/k8s/effector/ runs it) holding an upstream's bearer token, against a direct call
to the same server with the token.

    .venv/bin/python bench/bench_effector.py [--n 2000] [--loop auto|asyncio] [--json]

Targets:
    REVERSIBLE tools/call through the proxy adds <= 150 µs p50 over a direct call
    COMPENSABLE adds <= 2.5 x a bare fsync p50 over a direct call (FileWAL)

Measured in the same run: one client (HTTP/1.1 keep-alive, one call at a time, the Accept
header MCP clients send) calls a minimal Streamable HTTP server (bench/_mcp_http_echo.py:
answers at once, 401 without its token) directly with the token; through a proxy holding the
token (``$AGENT_SAGA_MCP_UPSTREAMS`` + a credentials directory, as the sidecar's Secret
mount); and, to show what custody itself costs, through a proxy holding none in front of a
second server that needs none; and directly on a new connection per call (what each hop cost
before the proxy kept its connections alive on both sides). Policy: ``echo`` REVERSIBLE, ``charge`` COMPENSABLE with
``refund`` as its inverse by ``$.id``; FileWAL with fsync. The floor is a bare ``write`` +
``fdatasync`` of one line in the WAL's directory. Rounds interleave every kind, so load on
the machine hits all alike. "Added" is the difference of the medians. The proxy's CPU per
call (its user + system time over the timed calls, from ``/proc``) is printed too: load
distorts it less than the latencies. The proxies run on the event loop ``--loop`` picks
(``$AGENT_SAGA_MCP_LOOP``: ``auto``, uvloop's when it is installed, or ``asyncio``); the
report names the one they ran.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from bench_mcp import POLICY, fsyncs, stats  # noqa: E402

HERE = Path(__file__).resolve().parent
TOKEN = "bench-token-" + os.urandom(12).hex()


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used; NaN where ``/proc`` is not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(path: Path, proc: subprocess.Popen[bytes], what: str, pattern: str | None = None) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}")
        if path.exists():
            text = path.read_text()
            if pattern is None and text.strip():
                return int(text)
            if pattern is not None and pattern in text:
                return int(text.split(pattern, 1)[1].split(",", 1)[0])
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within 60 s")


class Client:
    """A Streamable HTTP MCP client on one keep-alive connection."""

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                        "MCP-Protocol-Version": "2025-06-18", "Host": f"127.0.0.1:{port}", **(headers or {})}
        self.n = 0
        _, sid = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
        self.headers["Mcp-Session-Id"] = sid or ""
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, msg: dict[str, Any]) -> tuple[Any, str | None]:
        self.conn.request("POST", "/mcp", json.dumps(msg).encode(), self.headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        if resp.status not in (200, 202):
            raise RuntimeError(f"HTTP {resp.status}: {raw[:200]!r}")
        if resp.getheader("Content-Type", "").startswith("text/event-stream"):
            data = [line[5:] for line in raw.decode().splitlines() if line.startswith("data:")]
            body = json.loads(data[-1]) if data else None
        else:
            body = json.loads(raw) if raw.strip() else None
        if isinstance(body, dict) and "error" in body:
            raise RuntimeError(body["error"])
        return body, resp.getheader("Mcp-Session-Id")

    def timed(self, tool: str, n: int, fresh: bool = False) -> list[float]:
        """``n`` calls of ``tool``; ``fresh``: each on a new connection."""
        out = []
        clock = time.perf_counter_ns
        for _ in range(n):
            self.n += 1
            msg = {"jsonrpc": "2.0", "id": self.n, "method": "tools/call",
                   "params": {"name": tool, "arguments": {"amount": 12}}}
            t = clock()
            if fresh:
                self.conn.close()
            self.post(msg)
            out.append((clock() - t) / 1000)
        return out

    def close(self) -> None:
        self.conn.request("DELETE", "/mcp", None, self.headers)
        self.conn.getresponse().read()
        self.conn.close()


def run(n: int, rounds: int = 5, loop: str = "auto") -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        policy = tmp / "policy.json"
        policy.write_text(json.dumps(POLICY))
        (tmp / "credentials").mkdir()
        (tmp / "credentials" / "echo-token").write_text(TOKEN + "\n")
        try:
            ports = {}
            for name, env in (("held", {"ECHO_TOKEN": TOKEN}), ("open", {})):
                procs.append(subprocess.Popen([sys.executable, str(HERE / "_mcp_http_echo.py"), str(tmp / f"{name}.port")],
                                              env={**os.environ, **env}))
                ports[name] = wait_for(tmp / f"{name}.port", procs[-1], f"the {name} server")
            (tmp / "upstreams.json").write_text(json.dumps({"echo": {
                "url": f"http://127.0.0.1:{ports['held']}/mcp", "credentials": [{"credentialRef": "echo-token"}]}}))
            base = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
            base["AGENT_SAGA_MCP_LOOP"] = loop
            proxies, proxy_pids = {}, {}
            loops: set[str] = set()
            for name, upstream, env in (
                    ("custody", ports["held"], {"AGENT_SAGA_MCP_UPSTREAMS": str(tmp / "upstreams.json"),
                                                "AGENT_SAGA_CREDENTIALS_DIR": str(tmp / "credentials")}),
                    ("bare", ports["open"], {})):
                log = tmp / f"{name}.log"
                with open(log, "w") as f:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "agent_saga.cli", "mcp", "--policy", str(policy), "--wal",
                         str(tmp / f"{name}.wal"), "--name", "echo", "--listen", "127.0.0.1:0",
                         "--upstream", f"http://127.0.0.1:{upstream}/mcp"], env={**base, **env}, stdout=f, stderr=f))
                proxies[name] = wait_for(log, procs[-1], f"the {name} proxy", "listening on 127.0.0.1:")
                proxy_pids[name] = procs[-1].pid
                loops |= {line.rsplit("event loop ", 1)[1].strip() for line in log.read_text().splitlines()
                         if "listening on" in line and "event loop " in line}
            direct = Client(ports["held"], {"Authorization": f"Bearer {TOKEN}"})
            held, bare = Client(proxies["custody"]), Client(proxies["bare"])
            samples: dict[str, list[float]] = {k: [] for k in ("direct", "fresh", "bare", "custody", "compensable", "fsync")}
            warm = max(200, n // 10)
            comp = max(100, n // 4)
            direct.timed("echo", warm)
            bare.timed("echo", warm)
            held.timed("echo", warm)
            held.timed("charge", warm // 4)
            fsyncs(tmp / "floor", warm // 4)
            cpu = {k: 0.0 for k in ("bare", "custody", "compensable")}
            pids = {"bare": proxy_pids["bare"], "custody": proxy_pids["custody"], "compensable": proxy_pids["custody"]}

            def through(kind: str, client: Client, tool: str, count: int) -> None:
                before = cpu_seconds(pids[kind])
                samples[kind] += client.timed(tool, count)
                cpu[kind] += cpu_seconds(pids[kind]) - before

            for _ in range(rounds):
                samples["direct"] += direct.timed("echo", n // rounds)
                samples["fresh"] += direct.timed("echo", n // rounds, fresh=True)
                through("bare", bare, "echo", n // rounds)
                through("custody", held, "echo", n // rounds)
                through("compensable", held, "charge", comp // rounds)
                samples["fsync"] += fsyncs(tmp / "floor", comp // rounds)
            for c in (direct, held, bare):
                c.close()
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=60)
    s = {k: stats(v) for k, v in samples.items()}
    d50 = s["direct"]["p50_us"]
    added = {k: round(s[k]["p50_us"] - d50, 1) for k in ("fresh", "bare", "custody", "compensable")}
    added_p99 = round(s["custody"]["p99_us"] - s["direct"]["p99_us"], 1)
    ratio = round(added["compensable"] / s["fsync"]["p50_us"], 2) if s["fsync"]["p50_us"] else float("inf")
    cpu_us = {k: round(v / len(samples[k]) * 1e6, 1) if v == v else None for k, v in cpu.items()}
    return {
        "bench": "effector", "python": sys.version.split()[0], "event_loop": ", ".join(sorted(loops)),
        "calls": n, "compensable_calls": comp,
        "proxy_cpu_per_call_us": cpu_us, "load_average": os.getloadavg(),
        **s, "added_p50_us": added, "added_reversible_p99_us": added_p99,
        "custody_p50_us": round(added["custody"] - added["bare"], 1),
        "wal_and_inverse_p50_us": round(added["compensable"] - added["custody"], 1),
        "compensable_added_over_fsync": ratio,
        "targets": {
            "reversible_added_p50_us": {"value": added["custody"], "target": 150.0, "ok": added["custody"] <= 150.0},
            "compensable_added_over_fsync_p50": {"value": ratio, "target": 2.5, "ok": ratio <= 2.5},
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--loop", choices=("auto", "asyncio"), default="auto",
                    help="the proxies' event loop: auto (uvloop when installed) or asyncio")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.n, loop=args.loop)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"the proxies ran on the event loop: {r['event_loop']}")
    print(f"{'':48} {'p50 µs':>9} {'p90 µs':>9} {'p99 µs':>9}")
    for label, k in (("direct tools/call (with the token)", "direct"),
                     ("direct, a new connection per call", "fresh"),
                     ("proxy, no credential held, REVERSIBLE", "bare"),
                     ("proxy holding the token, REVERSIBLE", "custody"),
                     ("proxy holding the token, COMPENSABLE", "compensable"),
                     ("bare write + fdatasync", "fsync")):
        print(f"{label:48} {r[k]['p50_us']:>9.1f} {r[k]['p90_us']:>9.1f} {r[k]['p99_us']:>9.1f}")
    t = r["targets"]
    print(f"REVERSIBLE adds {r['added_p50_us']['custody']} µs p50, {r['added_reversible_p99_us']} µs p99 (goal <= 150 "
          f"p50){'  OK' if t['reversible_added_p50_us']['ok'] else '  MISSED'}: the proxy's hop "
          f"{r['added_p50_us']['bare']} µs (a new connection per call would add {r['added_p50_us']['fresh']} µs)"
          f" + custody {r['custody_p50_us']} µs")
    print(f"COMPENSABLE adds {r['added_p50_us']['compensable']} µs = {r['compensable_added_over_fsync']} x a bare fsync "
          f"(goal <= 2.5){'  OK' if t['compensable_added_over_fsync_p50']['ok'] else '  MISSED'}: "
          f"WAL + inverse {r['wal_and_inverse_p50_us']} µs over REVERSIBLE")
    c = r["proxy_cpu_per_call_us"]
    print(f"the proxy's CPU per call (user + system): REVERSIBLE {c['custody']} µs ({c['bare']} µs holding no "
          f"credential), COMPENSABLE {c['compensable']} µs; load average {' '.join(f'{x:.1f}' for x in r['load_average'])}")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
