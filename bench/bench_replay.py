"""`agent-saga policy replay` against `agent-saga verify`, on the same log.

    .venv/bin/python bench/bench_replay.py                 # 1,000,000 recorded steps
    .venv/bin/python bench/bench_replay.py --steps 100000  # quicker

Writes a FileWAL of ``--steps`` gated steps (four per saga: SAGA_STARTED, then per step a
GATE_VERDICT, a STEP_INTENT with policy arguments and a STEP_COMMITTED, then
SAGA_COMPLETED; a tenth of the sagas tagged ``eu``), then runs, each in a process of its
own, interleaved over ``--rounds`` rounds:

    verify          agent-saga verify --wal-path LOG (decode every record, hash the chain)
    policy replay   agent-saga policy replay PROPOSED --current CURRENT --wal-path LOG --json
                    (every step evaluated twice by the gate's evaluate_call)
    limits replay   agent-saga limits replay budget.json --wal-path LOG --json

and reports each one's best wall time, its ratio to verify (the target: policy replay
<= 3x verify), and its peak RSS (the target: bounded, i.e. far below the log's size and
the same at any length). Absolute times on a shared machine are noise; the ratio is
measured in one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_saga.chain import seal
from agent_saga.records import GENESIS, Record, encode_line

STEPS_PER_SAGA = 4
TOOLS = ("payments.charge", "wire.send", "search_docs", "crm.update")

CURRENT = {"undeclaredTools": "Refuse", "tools": {
    "payments.charge": {"semantics": "COMPENSABLE", "compensate": {"handler": "payments.refund",
                                                                  "args": {"charge_id": "$.id"}}},
    "wire.send": {"semantics": "COMPENSABLE", "compensate": {"handler": "payments.wire_recall",
                                                            "args": {"wire": "$.wire"}}},
    "search_docs": {"semantics": "REVERSIBLE"}},
    "rules": [{"name": "large-amounts", "argExceeds": {"arg": "amount", "threshold": 10000}},
              {"name": "eu-paused", "tagged": "eu", "verdict": "Block"}]}
PROPOSED = json.loads(json.dumps(CURRENT))
PROPOSED["tools"]["wire.send"]["requireApproval"] = True
PROPOSED["rules"][0]["argExceeds"]["threshold"] = 25000

BUDGET = {"kind": "List", "items": [
    {"kind": "BudgetLimit", "metadata": {"name": "daily-spend", "namespace": "bench"},
     "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 5_000_000, "window": "24h",
              "tools": ["payments.charge"], "scope": {"byArgs": ["customer_id"]}}},
    {"kind": "BudgetLimit", "metadata": {"name": "velocity", "namespace": "bench"},
     "spec": {"kind": "Rate", "maxCalls": 600, "window": "60s", "scope": {"byTool": True}}}]}


def build_log(path: Path, steps: int) -> int:
    """A log of ``steps`` gated steps, sealed into one hash chain as a FileWAL writes it
    (``chain.seal``, ``records.encode_line``), without the writer's fsyncs: the bench
    measures reading. Returns the records written."""
    prev = GENESIS
    n = 0
    ts = int(time.time() * 1e6) - steps * 1000
    amounts = (120, 900, 15_000, 40, 2_500, 12_000, 75, 30_000)
    with open(path, "wb", buffering=1 << 20) as f:

        def put(type_: str, saga: str, step: str | None, payload: dict[str, Any]) -> None:
            nonlocal prev, n, ts
            n += 1
            ts += 250
            rec = Record(type_, saga, step, payload, seq=n, ts=ts)
            f.write(encode_line(rec, seal(rec, prev)))
            prev = rec.hash

        for i in range(steps // STEPS_PER_SAGA):
            s = f"bench-{i:08d}"
            put("SAGA_STARTED", s, None, {"name": "payment", "tags": ["eu"] if i % 10 == 3 else ["us"]})
            for j, tool in enumerate(TOOLS):
                step = f"{s}/{j}"
                sem = "REVERSIBLE" if tool in ("search_docs", "crm.update") else "COMPENSABLE"
                put("GATE_VERDICT", s, step, {"tool": tool, "semantics": sem, "verdict": "ALLOW", "allowed": True,
                                              "reason": "", "decided_by": "PreFlightGate", "stage": "allow",
                                              "detail": {}})
                put("STEP_INTENT", s, step, {"tool": tool, "semantics": sem, "policy_args": {
                    "amount": amounts[(i + j) % len(amounts)], "customer_id": f"cus-{i % 1000:04d}"}})
                put("STEP_COMMITTED", s, step, {"compensation": None})
            put("SAGA_COMPLETED", s, None, {"steps": STEPS_PER_SAGA})
    return n


#: Runs the CLI in a child and reports its wall time and peak RSS (KiB) as JSON on stderr.
#: The peak is the child's own VmHWM (ru_maxrss survives execve: it would report the
#: parent's size at the fork).
CHILD = """
import json, sys, time, io, contextlib
from agent_saga.cli import main
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
took = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"code": code, "s": took, "rss_kib": hwm}), file=sys.stderr)
"""


def run(argv: list[str]) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=3600)
    last = r.stderr.strip().splitlines()[-1]
    return dict(json.loads(last))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000, help="recorded steps in the log (default 1,000,000)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best of each is reported")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="agent-saga-bench-replay-"))
    log = tmp / "agent-saga.wal"
    cur, new, budget = tmp / "current.json", tmp / "proposed.json", tmp / "budget.json"
    cur.write_text(json.dumps(CURRENT))
    new.write_text(json.dumps(PROPOSED))
    budget.write_text(json.dumps(BUDGET))
    t0 = time.perf_counter()
    records = build_log(log, args.steps)
    built = time.perf_counter() - t0
    commands = {
        "verify": ["verify", "--wal-path", str(log)],
        "policy replay": ["policy", "replay", str(new), "--current", str(cur), "--wal-path", str(log), "--json"],
        "limits replay": ["limits", "replay", str(budget), "--wal-path", str(log), "--json"],
    }
    best: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for name, argv in commands.items():
            got = run(argv)
            if name not in best or got["s"] < best[name]["s"]:
                best[name] = got
    base = best["verify"]["s"]
    rows = [{"command": name, "exit": b["code"], "seconds": round(b["s"], 2),
             "ratio_to_verify": round(b["s"] / base, 2), "peak_rss_mib": round(b["rss_kib"] / 1024, 1)}
            for name, b in best.items()]
    size = log.stat().st_size / 2**20
    print(f"log: {args.steps:,} steps, {records:,} records, {size:,.0f} MiB (written in {built:.1f}s)")
    print(f"{'command':15} {'exit':>4} {'seconds':>8} {'x verify':>8} {'peak RSS MiB':>13}")
    for r in rows:
        print(f"{r['command']:15} {r['exit']:>4} {r['seconds']:>8} {r['ratio_to_verify']:>8} {r['peak_rss_mib']:>13}")
    print(json.dumps({"steps": args.steps, "records": records, "log_mib": round(size, 1), "rows": rows,
                      "target": "policy replay <= 3x verify"}))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
