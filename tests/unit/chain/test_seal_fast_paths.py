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
import os
from typing import Any

import pytest
from agent_saga import scrubber
from agent_saga.chain import header_hash, seal, seal_batch, verify_records
from agent_saga.records import (
    GENESIS,
    SCHEMA_VERSION,
    Record,
    canonical_json,
    decode_line,
    encode_line,
)
from agent_saga.scrubber import REDACTED, scrub_id

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


def _rejecting(rec: Record, exc: Exception) -> None:
    rec.payload = {"original_type": rec.type, "error": f"{type(exc).__name__}: {exc}"}
    rec.type = "RECORD_REJECTED"


def _varied_batch() -> list[Record]:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    stripe = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
    prepared = Record("ROUTING_DECISION", "wal", None, None)
    prepared.encode = lambda: '{"host":"a"}'
    stamped = Record("STEP_INTENT", "s-2", "s-2/0", {"i": 2})
    stamped.extra = {"gseq": 9}
    payloads: list[Any] = [*PAYLOADS, cyclic, {"after": "a cyclic payload"}, {"bad": float("nan")},
                           {"password": "hunter2-not-a-word"}, {"note": f"pay with {stripe}"}, {"o": object()}]
    recs = [Record("STEP_INTENT", "s-1", f"s-1/{i}" if i % 3 else None, p) for i, p in enumerate(payloads)]
    recs[4:4] = [prepared, stamped]
    for i, rec in enumerate(recs):
        rec.seq, rec.ts = i + 1, 1764470000123456 + i
    return recs


def test_seal_batch_lines_are_encode_line_of_each_sealed_record() -> None:
    """The lines a writer takes from ``seal_batch`` are ``encode_line`` of each record as
    sealed, newline aside: ordinary, prepared, stamped, scrubbed and rejected records,
    and the records after a payload the encoder failed on (its circular-reference marks
    are not carried into the next record's encoding)."""
    lines: list[str] = []
    sealed = seal_batch(_varied_batch(), GENESIS, _rejecting, lines)
    assert len(lines) == len(sealed) == 12
    prev = GENESIS
    for (rec, canonical), line in zip(sealed, lines, strict=True):
        assert line.encode() + b"\n" == encode_line(rec, canonical)
        if rec.type != "ROUTING_DECISION":  # the prepared one: its text as its producer built it
            assert canonical == ("null" if rec.payload is None else _REFERENCE.encode(rec.payload))
        assert rec.prev == prev and rec.hash == header_hash(rec)
        assert rec.digest == hashlib.sha256(bytes.fromhex(rec.salt or "") + canonical.encode()).hexdigest()
        prev = rec.hash
    types = [rec.type for rec, _ in sealed]
    assert types.count("RECORD_REJECTED") == 3  # the cyclic, the NaN and the object() payloads
    assert sealed[7][0].payload == {"after": "a cyclic payload"}
    assert '"gseq":9' in lines[5] and REDACTED in lines[9] and "sk_live_" not in lines[10]
    assert verify_records((str(i), decode_line(line, str(i))) for i, line in enumerate(lines)).ok


def test_seal_batch_with_and_without_lines_seals_the_same_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: bytes(i % 251 for i in range(n)))
    lines: list[str] = []
    one = seal_batch(_varied_batch(), GENESIS, _rejecting, lines)
    two = seal_batch(_varied_batch(), GENESIS, _rejecting)
    assert [(r.to_dict(), c) for r, c in one] == [(r.to_dict(), c) for r, c in two]
    assert [line.encode() + b"\n" for line in lines] == [encode_line(r, c) for r, c in two]


def test_a_payload_the_encoder_failed_on_leaves_no_mark_on_the_next_records() -> None:
    """One encoder serves a batch, and a failed call leaves the containers it was inside
    marked as being encoded: a later record holding one of them is still rejected for
    what is really wrong with it (not as circular), and the records after it encode."""
    bad: dict[str, Any] = {"o": object()}
    recs = [Record("STEP_INTENT", "s-1", None, p, seq=i + 1) for i, p in enumerate([bad, {"wrap": bad}, {"i": 3}])]
    errors: list[str] = []

    def reject(rec: Record, exc: Exception) -> None:
        errors.append(f"{type(exc).__name__}: {exc}")
        _rejecting(rec, exc)

    sealed = seal_batch(recs, GENESIS, reject)
    with pytest.raises(TypeError) as alone:
        canonical_json({"wrap": bad})
    assert errors == [f"TypeError: {alone.value}"] * 2
    assert sealed[2][1] == '{"i":3}'
