"""Passkey approvals and predictive pre-execution: what each check costs around its primitive.

    .venv/bin/python bench/bench_passkey_speculation.py [--n 2000] [--json]

Passkey: ``PasskeyVerifier.verify`` (keyring lookup, challenge digest, Ed25519 verify,
expiry, replay memory) against a bare Ed25519 verify of the same 32 bytes, measured in
the same run. Speculation: ``Speculator.redeem`` of a held result (HMAC-SHA256 over the
lease, the arguments digest, the lookup) against a bare HMAC-SHA256 of the same bytes.
On a shared machine the ratios are the stable numbers; absolute times move with the load.

Targets:
    passkey verify p50 / bare Ed25519 verify p50      <= 2.5 (it also stats the keyring file on every
                                                      check, so a revocation applies at once)
    speculation redeem p50 / bare HMAC p50            <= 15 (our bookkeeping around one HMAC)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import _common  # bench/_common.py (benchmarks run as scripts from bench/)
from agent_saga.clocks import ManualClock  # noqa: E402
from agent_saga.controls.approvals import (  # noqa: E402
    ActionChallenge,
    ApproverKeyring,
    PasskeyVerifier,
    sign_challenge,
)
from agent_saga.speculation import Speculator  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

measure, row = _common.measure_us, _common.latency_row


def passkey_rows(n: int, d: str) -> list[dict[str, Any]]:
    key = Ed25519PrivateKey.generate()
    ring = ApproverKeyring(Path(d) / "keyring.json")
    ring.enrol(key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo),
               approver="risk@corp", by="bench", now=0.0)
    verifier = PasskeyVerifier(ring)
    pairs = []
    for i in range(n + 200):
        c = ActionChallenge.issue(request_id=f"{i:032x}", tool="wire.send", arguments_digest="sha256:" + "ab" * 32,
                                  saga_id=f"s-{i}", step_id=f"s-{i}/0", expires_at=1e10)
        pairs.append((c, sign_challenge(key, c)))
    it = iter(pairs)

    def verify() -> None:
        c, a = next(it)
        verifier.verify(a, c, approver="risk@corp", now=1.0)

    c0, a0 = pairs[0]
    public, digest = key.public_key(), c0.digest

    def bare() -> None:
        public.verify(a0.signature, digest)

    measure(verify, 200)
    measure(bare, 200)
    return [row("passkey verify (full check)", measure(verify, n)), row("bare Ed25519 verify", measure(bare, n))]


def speculation_rows(n: int) -> list[dict[str, Any]]:
    spec = Speculator(ttl=1e9, clock=ManualClock())
    args = {"q": "refund policy", "limit": 5}
    loop = asyncio.new_event_loop()
    leases = [loop.run_until_complete(spec.speculate("intent-7", "search_docs", lambda **kw: kw, args,
                                                      semantics="REVERSIBLE")) for _ in range(n + 200)]
    it = iter(leases)

    def redeem() -> None:
        coro = spec.redeem(next(it), intent="intent-7", tool="search_docs", args=args)
        try:
            coro.send(None)
        except StopIteration:
            return
        raise AssertionError("redeem awaited something")

    key, body = os.urandom(32), json.dumps(leases[0].body(), sort_keys=True).encode()

    def bare() -> None:
        hmac.new(key, body, hashlib.sha256).hexdigest()

    measure(redeem, 200)
    measure(bare, 200)
    out = [row("speculation redeem", measure(redeem, n)), row("bare HMAC-SHA256", measure(bare, n))]
    loop.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rows = passkey_rows(args.n, d) + speculation_rows(args.n)
    by = {r["name"]: r["p50_us"] for r in rows}
    pk = by["passkey verify (full check)"] / by["bare Ed25519 verify"]
    sp = by["speculation redeem"] / by["bare HMAC-SHA256"]
    targets = {
        "passkey_over_bare_verify_p50": {"value": round(pk, 3), "target": 2.5, "ok": pk <= 2.5},
        "redeem_over_bare_hmac_p50": {"value": round(sp, 3), "target": 15.0, "ok": sp <= 15.0},
    }
    result = {"bench": "passkey_speculation", "python": sys.version.split()[0], "load": os.getloadavg()[0],
              "rows": rows, "targets": targets}
    return _common.report(result, as_json=args.json, width=30)

if __name__ == "__main__":
    sys.exit(main())
