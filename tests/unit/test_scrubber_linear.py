"""The secret scrubber is linear in its input: 1 MB adversarial strings (shapes that made its
regular expressions backtrack quadratically: "://a.a.a...", "eyJ-eyJ-...", long runs of
key-like characters, as values, free text, header ids and dict keys) cost a bounded
multiple of a plain linear scan of the same input, measured in the same process as CPU
time (a ratio, never a wall-clock limit).

Each shape runs in a child process that first times the plain scan, then caps its own CPU
time (RLIMIT_CPU) at the bound plus a second: a quadratic scan, which would take hours
on 1 MB, is stopped there and reported instead of hanging the suite."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MB = 1 << 20
#: scrub CPU time / the plain scan's. Linear today: about 10-65 for this payload (the
#: string sits in it six times, and each is scanned by a dozen regular expressions, some
#: strings twice); the quadratic scans this guards against cost thousands of times the
#: plain scan at 80 KB already, and grow with the square of the size.
BOUND = 150

CHILD = r"""
import json, math, re, resource, sys, time
from agent_saga.scrubber import redact_text, scrub_id, scrub_payload, secret_kind, why_secret

shape, size, bound = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
unit = {
    "url-dots": "a.", "url-plus": "a+", "url-colons": "a:", "jwt-dash": "eyJ-", "jwt-dots": "eyJaaaa.",
    "key-chars": "ab_", "alnum": "a", "pem-words": "A ", "bearer": "bearer ", "stripe-prefix": "sk_",
    "phrase": "password=x ", "url-at": "x://a@",
}[shape]
head = {"url-dots": "://", "url-plus": "x://", "url-colons": "://", "pem-words": "-----BEGIN "}.get(shape, "")
s = head + unit * ((size - len(head)) // len(unit))

start = time.process_time()
plain = len(re.findall(r".", s, re.S))  # the plain linear scan: one step per character
base = time.process_time() - start
used = resource.getrusage(resource.RUSAGE_SELF)
cap = math.ceil(used.ru_utime + used.ru_stime + bound * base) + 1
resource.setrlimit(resource.RLIMIT_CPU, (cap, resource.getrlimit(resource.RLIMIT_CPU)[1]))

start = time.process_time()
payload = {"arguments": {"note": s, "q": s, "session_key": s, s: 1, "nested": [s]}, "reason": s}
scrub_payload(payload, "STEP_INTENT", "s-1")
redact_text(s)
secret_kind(s)
why_secret("value", s)
scrub_id(s)
spent = time.process_time() - start
print(json.dumps({"plain": plain, "base": base, "scrub": spent, "ratio": spent / base}))
"""

SHAPES = ["url-dots", "url-plus", "url-colons", "url-at", "jwt-dash", "jwt-dots", "key-chars", "alnum",
          "pem-words", "bearer", "stripe-prefix", "phrase"]


@pytest.mark.parametrize("shape", SHAPES)
def test_scrubbing_1mb_of_an_adversarial_shape_is_linear(shape: str) -> None:
    r = subprocess.run([sys.executable, "-c", CHILD, shape, str(MB), str(BOUND)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (
        f"{shape}: the scrub was stopped past {BOUND}x the plain scan's CPU time "
        f"(exit {r.returncode}: {r.stderr[-500:]})"
    )
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["plain"] >= MB - 16
    assert out["ratio"] <= BOUND, out
