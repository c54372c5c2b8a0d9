"""Approvals: what checking a decision's signature adds to an approval.

    .venv/bin/python bench/bench_approvals.py [--n 2000] [--json]

The agent reads a decision document, and with trusted keys checks its Ed25519 signature
(``Decision.from_doc`` -> ``Decision.seal`` -> ``TrustedKeys.problem``, against the digest
of its own call's rendered action) before it acts. Rendering that action
(``render_action``, once per request) is measured on a row of its own.
Measured per decision: reading an unsigned decision (the baseline), reading and checking
a signed one (the difference is what signing adds), and a bare Ed25519 verify of the same
bytes (the primitive's own cost, measured in the same run: on a shared machine the ratio
is the stable number, the absolute time moves with the load).

Targets:
    signature check added to an approval                 <= 100 µs p50
    read+check p50 / (unsigned read + bare verify) p50    <= 1.3 (our code around the primitive)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import _common  # bench/_common.py (benchmarks run as scripts from bench/)
from agent_saga.audit import generate_signing_key  # noqa: E402
from agent_saga.controls.approvals import Decision, DecisionSigner, TrustedKeys, render_action  # noqa: E402

RID = "af83c011" * 4
DIGEST = "sha256:" + "ab" * 32
DEADLINE = 1_800_000_900.0
TOOL, ARGS = "wire.send", {"amount": 80000, "to": "acct_9", "memo": "invoice 2026-07"}


measure = _common.measure_us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        priv, pub = generate_signing_key(Path(d) / "k")
        Path(pub).write_text("Approver: risk@corp\n" + Path(pub).read_text())
        signer, trust = DecisionSigner.from_file(priv), TrustedKeys.from_path(pub)
    plain = Decision("Approved", "risk@corp", 1_800_000_010.0, DIGEST, "verified by phone", "cli:h:1").to_doc(
        RID, "payments")
    rendered = render_action(TOOL, ARGS).digest
    signed = signer.sign(plain, expires_at=DEADLINE, tool=TOOL, action_digest=rendered)

    def unsigned_read() -> None:
        Decision.from_doc(plain)

    def signed_check() -> None:
        d = Decision.from_doc(signed)
        assert trust.problem(d.seal, request_id=RID, arguments_digest=DIGEST, deadline=DEADLINE, tool=TOOL,
                             action_digest=rendered, approver=d.approver) is None

    def render() -> None:
        render_action(TOOL, ARGS).digest  # noqa: B018 - the work measured

    seal = Decision.from_doc(signed).seal
    assert seal is not None
    key = trust._keys[seal.key_id]

    def bare_verify() -> None:
        key.verify(seal.signature, seal.message)

    for fn in (unsigned_read, signed_check, bare_verify, render):
        measure(fn, 200)  # warm up
    rows = []
    for name, fn in (("unsigned decision: read", unsigned_read), ("signed decision: read + verify", signed_check),
                     ("bare Ed25519 verify", bare_verify),
                     ("the call's action rendered (once per request)", render)):
        s = measure(fn, args.n)
        rows.append(_common.latency_row(name, s))
    by = {r["name"]: r for r in rows}
    added = by["signed decision: read + verify"]["p50_us"] - by["unsigned decision: read"]["p50_us"]
    ratio = by["signed decision: read + verify"]["p50_us"] / (
        by["unsigned decision: read"]["p50_us"] + by["bare Ed25519 verify"]["p50_us"])
    targets = {
        "signature_check_added_p50_us": {"value": round(added, 2), "target": 100.0, "ok": added <= 100.0},
        "check_over_read_plus_bare_verify_p50": {"value": round(ratio, 3), "target": 1.3, "ok": ratio <= 1.3},
    }
    result = {"bench": "approvals", "python": sys.version.split()[0], "rows": rows, "targets": targets}
    return _common.report(result, as_json=args.json)

if __name__ == "__main__":
    sys.exit(main())
