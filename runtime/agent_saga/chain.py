"""The hash chain: every record commits to its predecessor through a salted content digest.

    digest = SHA-256( salt_bytes || canonical_json(payload) )          (hex)
    hash   = SHA-256( "v\\nseq\\nts\\ntype\\nsaga\\nstep\\ndigest\\nprev" as UTF-8 )  (hex)
    prev   = hash of the previous record, or 64 zeros for the first one

The chain hashes the digest, never the payload, so a redaction may destroy payload and
salt (GDPR erasure) and the chain still verifies; the salt is what stops a redacted
``{"amount": 4200}`` from being recovered by guessing. The header fields are joined by
newlines, which none of them can contain (see ``records``), so the rule can be re-checked
in any language with a SHA-256 and string joins.

``verify_records`` names the first record that stops adding up and why.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import WALCorrupt
from .records import GENESIS, SCHEMA_VERSION, Record, canonical_json

SALT_BYTES = 16


def content_digest(salt_hex: str, canonical_payload: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt_hex) + canonical_payload.encode("utf-8")).hexdigest()


def header_hash(rec: Record) -> str:
    text = "\n".join(
        (
            str(SCHEMA_VERSION),
            str(rec.seq),
            str(rec.ts),
            rec.type,
            rec.saga,
            rec.step or "",
            rec.digest,
            rec.prev,
        )
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def seal(rec: Record, prev: str, salt: bytes | None = None) -> str:
    """Fill salt, digest, prev and hash of ``rec``; return its canonical payload text.

    ``salt`` (``SALT_BYTES`` random bytes) may be passed in so a writer can draw the salts
    of a whole batch with one ``os.urandom`` call.
    """
    canonical = "null" if rec.payload is None else canonical_json(rec.payload)
    rec.salt = (os.urandom(SALT_BYTES) if salt is None else salt).hex()
    rec.digest = content_digest(rec.salt, canonical)
    rec.prev = prev
    rec.hash = header_hash(rec)
    return canonical


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The outcome of checking a chain. ``ok`` is True only if every record adds up."""

    ok: bool
    records: int
    head: str  # hash of the last good record
    last_seq: int
    first_bad_seq: int | None = None
    location: str | None = None
    reason: str | None = None

    def describe(self) -> str:
        if self.ok:
            return f"OK: {self.records} records, chain intact, head {self.head[:16]}… (seq {self.last_seq})"
        return f"BROKEN at {self.location} (seq {self.first_bad_seq}): {self.reason}"


def check_record(rec: Record, prev_hash: str, expected_seq: int | None) -> str | None:
    """Return why ``rec`` does not follow ``prev_hash``/``expected_seq``, or None if it does."""
    if expected_seq is not None and rec.seq != expected_seq:
        if rec.seq < expected_seq:
            return f"sequence {rec.seq} repeats or goes backwards (expected {expected_seq}): records reordered or duplicated"
        return f"sequence jumps from {expected_seq - 1} to {rec.seq}: records {expected_seq}..{rec.seq - 1} are missing"
    if rec.prev != prev_hash:
        return "prev does not match the hash of the record before it: a record was inserted, removed or reordered"
    if rec.redacted:
        if rec.payload is not None or rec.salt is not None:
            return "record is marked redacted but still carries payload or salt"
    else:
        if rec.salt is None:
            return "salt is missing on a record that is not redacted"
        canonical = "null" if rec.payload is None else canonical_json(rec.payload)
        try:
            digest = content_digest(rec.salt, canonical)
        except ValueError:
            return "salt is not hexadecimal"
        if digest != rec.digest:
            return "payload does not match its digest: the record's contents were altered"
    if header_hash(rec) != rec.hash:
        return "hash does not match the record's header: seq, ts, type, saga, step or digest was altered"
    return None


def verify_records(items: Iterable[tuple[str, Record | WALCorrupt]]) -> VerifyResult:
    """Check a chain given ``(location, record-or-decode-error)`` pairs in log order."""
    prev = GENESIS
    expected: int | None = 1  # a log starts at seq 1; compaction attestations (later) explain gaps
    count = 0
    last_seq = 0
    for location, item in items:
        if isinstance(item, WALCorrupt):
            return VerifyResult(False, count, prev, last_seq, last_seq + 1, location, item.message)
        reason = check_record(item, prev, expected)
        if reason is not None:
            return VerifyResult(False, count, prev, last_seq, item.seq, location, reason)
        prev = item.hash
        expected = item.seq + 1
        last_seq = item.seq
        count += 1
    return VerifyResult(True, count, prev, last_seq)
