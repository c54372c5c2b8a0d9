"""The writer's fast paths give exactly what the documented rules give.

The flusher seals records through shortcuts (the digest hashed from the salt bytes, the
header hash from one f-string, canonical JSON through the C encoder directly, step ids of
a hint-free saga spared the secret-shape scan). These tests recompute every record the
long way, from the formula in ``agent_saga.chain``'s docstring, so a shortcut that drifts
from the on-disk format (and from what older readers verify) fails here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from agent_saga import scrubber
from agent_saga.chain import seal
from agent_saga.records import SCHEMA_VERSION, Record, canonical_json
from agent_saga.scrubber import scrub_id

_REFERENCE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

PAYLOADS: list[Any] = [
    {"tool": "stripe.charge", "semantics": "COMPENSABLE", "policy_args": None, "idempotency_key": "ab" * 32},
    {"compensation": {"handler": "stripe.refund", "kwargs": {"amount": 4200, "at": 1.5, "é": "ü\n\"x"}}},
    {"z": [1, -0.0, 1e300, True, None, {"b": 2, "a": [{}]}], "a": ""},
    None,
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_sealed_record_matches_the_documented_formula(payload: Any) -> None:
    rec = Record("STEP_INTENT", "s-1", "s-1/0", payload, seq=7, ts=1764470000123456)
    canonical = seal(rec, "ab" * 32, bytes(range(16)))
    want = "null" if payload is None else _REFERENCE.encode(payload)
    assert canonical == want
    assert rec.salt == bytes(range(16)).hex()
    assert rec.digest == hashlib.sha256(bytes.fromhex(rec.salt) + want.encode("utf-8")).hexdigest()
    header = "\n".join(
        (str(SCHEMA_VERSION), "7", "1764470000123456", "STEP_INTENT", "s-1", "s-1/0", rec.digest, "ab" * 32)
    )
    assert rec.hash == hashlib.sha256(header.encode("utf-8")).hexdigest()


def test_canonical_json_fails_as_the_public_encoder_does() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    for bad in ({"n": float("nan")}, {"o": object()}, cyclic):
        with pytest.raises((TypeError, ValueError)) as ours:
            canonical_json(bad)
        with pytest.raises((TypeError, ValueError)) as public:
            _REFERENCE.encode(bad)
        assert (type(ours.value), str(ours.value)) == (type(public.value), str(public.value))
    assert canonical_json({"self": {}}) == '{"self":{}}'  # a failed call leaves no state behind


IDS = [
    "checkout-0123456789ab/17",  # hint-free saga: the fast path
    "sk_live_4eC39HqLyjWDarjtT1zdp7dc/3",  # a saga id with a secret shape
    "ghp_" + "a1B2" * 9 + "/0",
    "svc-eyJhbGciOi.eyJzdWIiOi.sig/2",  # a JWT-shaped saga id
    "db-sk_x/4",  # a hint, no shape: the full check says clean
    "node:/5",  # ends in ":": the full check runs
    "checkout/١٢",  # non-ASCII digits are not an index
    "AKIAIOSFODNN7EXAMPLE",  # no "/" at all
]


@pytest.mark.parametrize("value", IDS)
def test_scrub_id_agrees_with_the_full_shape_check(value: str) -> None:
    assert scrub_id(value) == scrubber._scrub_id.__wrapped__(value)  # the uncached full check


def test_a_step_of_a_secret_shaped_saga_is_still_redacted_keeping_its_index() -> None:
    sid = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
    assert scrub_id(f"{sid}/3") == f"{scrub_id(sid)}/3"
    assert scrub_id(sid).startswith("redacted-")
