"""Credential custody in the MCP proxy: what holding an upstream's credential adds to a call.

    .venv/bin/python bench/bench_mcp_custody.py [--n 20000] [--json]

Target:
    injecting the credential and masking the answer adds <= 5 µs p50 to a call

Measured in one process, on the proxy's own code: the per-call work of an HTTP upstream
call with custody — the client's headers without the ones the proxy sets, the credential
resolved (``MountedCredentials`` on a mounted-Secret directory: a file, cached 5 s) as a
header, and the upstream's answer (1 KiB of JSON, then 64 KiB) masked — against the
same call without custody (the headers passed as they are, nothing masked). Also: the
per-line mask of a stdio upstream. Each sample times a batch of 100 operations; the
rounds interleave both sides, so load on the machine hits both alike. "Added" is the
difference of the medians, also given as a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import _common  # noqa: E402
from agent_saga.credentials import MountedCredentials, set_credential_resolver  # noqa: E402
from agent_saga.mcp._custody import CredentialUse, Custody  # noqa: E402

BATCH = 100
HEADERS = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream"),
           ("MCP-Protocol-Version", "2025-06-18"), ("Mcp-Session-Id", "9ec5428c848848ab83b4c1fee80eb3cb")]


def answer(size: int) -> bytes:
    """A tools/call answer of about ``size`` bytes, as an upstream sends it."""
    text = ("results for the query: " * (size // 23 + 1))[: max(0, size - 120)]
    return json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": text}],
                                                             "structuredContent": {"id": "ch_1"}}}).encode()


def per_call(custody: Custody | None, body: bytes) -> Any:
    def plain() -> None:
        for _ in range(BATCH):
            [(k, v) for k, v in HEADERS]
            body.replace(b"\x00", b"\x00")  # the answer as it is (a copy of the same cost class as nothing)

    def held() -> None:
        assert custody is not None
        for _ in range(BATCH):
            names = custody.names()
            [(k, v) for k, v in HEADERS if k.lower() not in names] + custody.headers()
            custody.redact(body)

    return plain if custody is None else held


def per_line(custody: Custody, body: bytes) -> Any:
    def held() -> None:
        for _ in range(BATCH):
            custody.redact(body)
    return held


def sample(fn: Any, n: int) -> list[float]:
    """``n`` samples of ``fn`` (a batch), in µs per operation."""
    return [us / BATCH for us in _common.measure_us(fn, n)]


def run(n: int, rounds: int = 5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        secret = "hx" + os.urandom(16).hex()
        Path(d, "payments-token").write_text(secret + "\n")
        set_credential_resolver(MountedCredentials(d))
        custody = Custody([CredentialUse("payments-token", header="Authorization", scheme="Bearer")])
        custody.headers()  # resolved once: the cache is warm, as in a running proxy
        small, large = answer(1024), answer(64 * 1024)
        fns = {"no custody, 1 KiB answer": per_call(None, small),
               "custody, 1 KiB answer": per_call(custody, small),
               "no custody, 64 KiB answer": per_call(None, large),
               "custody, 64 KiB answer": per_call(custody, large),
               "stdio line mask, 1 KiB": per_line(custody, small)}
        samples: dict[str, list[float]] = {k: [] for k in fns}
        per_round = max(1, n // BATCH // rounds)
        for fn in fns.values():
            sample(fn, per_round)  # warm
        for _ in range(rounds):
            for name, fn in fns.items():
                samples[name] += sample(fn, per_round)
        set_credential_resolver(None)
    rows = [_common.latency_row(name, s) for name, s in samples.items()]
    p50 = {r["name"]: r["p50_us"] for r in rows}
    added = round(p50["custody, 1 KiB answer"] - p50["no custody, 1 KiB answer"], 2)
    added_large = round(p50["custody, 64 KiB answer"] - p50["no custody, 64 KiB answer"], 2)
    ratio = round(p50["custody, 1 KiB answer"] / p50["no custody, 1 KiB answer"], 1) \
        if p50["no custody, 1 KiB answer"] else float("inf")
    return {"bench": "mcp_custody", "python": sys.version.split()[0], "operations": n, "rows": rows,
            "added_p50_us_1kib": added, "added_p50_us_64kib": added_large, "ratio_1kib": ratio,
            "targets": {"custody_added_p50_us": {"value": added, "target": 5.0, "ok": added <= 5.0}},
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="operations per measurement (batches of 100)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    return _common.report(run(args.n), as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
