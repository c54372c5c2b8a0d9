"""The hash chain: every record commits to its predecessor through a salted content digest.

    digest = SHA-256( salt_bytes || canonical_json(payload) )          (hex)
    hash   = SHA-256( "v\\nseq\\nts\\ntype\\nsaga\\nstep\\ndigest\\nprev" as UTF-8 )  (hex)
    prev   = hash of the previous record, or 64 zeros for the first one

The chain hashes the digest, never the payload, so a redaction may destroy payload and
salt (GDPR erasure) and the chain still verifies; the salt is what stops a redacted
``{"amount": 4200}`` from being recovered by guessing. The header fields are joined by
newlines, which none of them can contain (see ``records``), so the rule can be re-checked
in any language with a SHA-256 and string joins.

``verify_records`` names the first record that stops adding up and why. A gap in ``seq``
is accepted only where a compaction attestation accounts for it (see below).
``ChainVerifier`` is the same check one record at a time: recovery checks every record
with it before acting on any, and keeps its state from one read of the log to the next.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from . import records as _records
from .errors import WALCorrupt
from .records import _BUILD, GENESIS, SCHEMA_VERSION, Record, canonical_json, line_text
from .scrubber import scrub_id, scrub_payload, texts_hinted

SALT_BYTES = 16
_sha256 = hashlib.sha256
_SALT_HEX = re.compile(f"[0-9a-f]{{{SALT_BYTES * 2}}}")


def content_digest(salt_hex: str, canonical_payload: str) -> str:
    """``sha256(salt || canonical payload)``: a payload's digest, hashed into the chain."""
    return hashlib.sha256(bytes.fromhex(salt_hex) + canonical_payload.encode("utf-8")).hexdigest()


def header_hash(rec: Record) -> str:
    """The hash of ``rec``'s header fields (its content digest included)."""
    return _sha256(
        f"{SCHEMA_VERSION}\n{rec.seq}\n{rec.ts}\n{rec.type}\n{rec.saga}\n{rec.step or ''}\n"
        f"{rec.digest}\n{rec.prev}".encode()
    ).hexdigest()


def seal(
    rec: Record,
    prev: str,
    salt: bytes | None = None,
    canonical: str | None = None,
    hinted: bool | None = None,
) -> str:
    """Fill salt, digest, prev and hash of ``rec``; return its canonical payload text.

    This is the record codec boundary every writer goes through, so it is where the secret
    scrubber runs (``agent_saga.scrubber``): a secret in the payload or the header ids is
    redacted before anything is hashed or written. The one exception is a record appended
    with ``append_prepared`` (``rec.encode``): its producer builds the canonical text from
    values it screened once (a route's host names) and scrubs the rest itself
    (``wal.prepared``), so the text is taken as it is. ``salt`` (``SALT_BYTES`` random
    bytes) may be passed in so a writer can draw the salts of a whole batch with one
    ``os.urandom`` call; ``canonical`` (the payload's canonical text) and ``hinted=False``
    (no credential hint in it) when the writer scanned a whole batch's texts at once
    (``seal_batch``).
    """
    saga = rec.saga = scrub_id(rec.saga)
    step = rec.step
    if step is not None:
        rec.step = scrub_id(step)
    encode = rec.encode
    if encode is not None:
        rec.encode = None  # once: a producer that raises gets its record rejected, not retried
        canonical = encode()
    else:
        payload = rec.payload
        if canonical is None:
            canonical = "null" if payload is None else canonical_json(payload)
        if payload is not None:
            scrubbed = scrub_payload(payload, rec.type, saga, canonical, hinted=hinted)
            if scrubbed is not payload:
                rec.payload = scrubbed
                canonical = canonical_json(scrubbed)
    if salt is None:
        salt = os.urandom(SALT_BYTES)
    rec.salt = salt.hex()
    digest = _sha256(salt)  # = content_digest(rec.salt, canonical), without the hex round trip
    digest.update(canonical.encode())
    rec.digest = digest.hexdigest()
    rec.prev = prev
    rec.hash = header_hash(rec)
    return canonical


def reject_record(rec: Record, exc: Exception) -> None:
    """Turn ``rec``, whose payload could not be encoded, into a ``RECORD_REJECTED`` record
    under the same seq: the chain keeps no gap and the log says what happened."""
    rec.payload = {"original_type": rec.type, "error": f"{type(exc).__name__}: {exc}"}
    rec.type = _records.ExtensionType.RECORD_REJECTED.value


_UNENCODABLE = "\x00unencodable"  # a marker no canonical JSON text equals (it starts with NUL)


def seal_batch(
    batch: Sequence[Record],
    prev: str,
    on_error: Callable[[Record, Exception], None],
    lines: list[str] | None = None,
) -> list[tuple[Record, str]]:
    """Seal ``batch`` in order onto ``prev``: ``seal`` for each record, with one
    ``os.urandom`` for every salt and one credential-hint scan of every payload's
    canonical text at once (the scrubber then walks each payload by key name only, unless
    the batch's text holds a hint: then every payload gets the full scan, as alone).

    A record appended with ``append_prepared`` is left out of the scan: its producer
    encodes and scrubs its text (``seal`` calls ``rec.encode``).

    A record whose payload cannot be encoded (``TypeError``/``ValueError``) is handed to
    ``on_error``, which must make it encodable (the writer turns it into a
    ``RECORD_REJECTED`` record under the same seq), then sealed as alone.

    ``lines``, when given, receives each sealed record's line (``line_text``: a writer
    then encodes the batch at once).
    """
    make = _BUILD  # the C encoder (see ``records.canonical_json``): one per batch, not per record
    enc = None if make is None else make()
    texts: list[str | None] = []  # None: encoded by its producer (``rec.encode``) in ``seal``
    for rec in batch:
        if rec.encode is not None:
            texts.append(None)
            continue
        payload = rec.payload
        if payload is None:
            texts.append("null")
        elif enc is None or payload.__class__ is not dict:
            try:
                texts.append(canonical_json(payload))
            except (TypeError, ValueError):
                texts.append(_UNENCODABLE)
        else:
            try:
                texts.append("".join(enc(payload, 0)))
            except (TypeError, ValueError):
                texts.append(_UNENCODABLE)
                enc = make()  # a failed call may leave its circular-check marks
    hinted = None if texts_hinted([t for t in texts if t is not None and t is not _UNENCODABLE]) else False
    salts = os.urandom(SALT_BYTES * len(batch))
    out: list[tuple[Record, str]] = []
    add = out.append
    line = lines.append if lines is not None else None
    for i, rec in enumerate(batch):
        text = texts[i]
        try:
            if text is _UNENCODABLE:
                canonical_json(rec.payload)  # raises the encoding error again
            canonical = seal(rec, prev, salts[i * SALT_BYTES : (i + 1) * SALT_BYTES], text, hinted)
        except (TypeError, ValueError) as exc:
            on_error(rec, exc)
            canonical = seal(rec, prev)
        if line is not None:
            line(line_text(rec, canonical))
        add((rec, canonical))
        prev = rec.hash
    return out


# ---------------------------------------------------------------------- attestations
#
# compact() removes the records of settled sagas. That leaves gaps in ``seq``, which look
# exactly like an attacker deleting records, so compaction writes a chained attestation:
# a ``COMPACTION`` record of the reserved saga ``wal`` whose payload is
#
#     {"removed": [[first, last, last_hash], ...],   maximal runs of removed sequences,
#                                                     ascending; last_hash = hash of `last`
#      "count":   n,                                  how many records left (sum of the runs)
#      "digest":  "<64 hex>",                         removal_digest() of their hashes
#      "kept":    k, "sagas": m}                      records kept, sagas removed (info)
#
# A gap (expected seq e, next record s > e) is accepted only when the runs of the log's
# attestations cover every sequence e..s-1 and a run ends at s-1 with last_hash equal to
# the next record's ``prev``: the chain is still checked across the gap. Attestations are
# never removed by a later compaction, so a gap once explained stays explained.

ATTESTATION_TYPE = _records.RecordType.COMPACTION.value
RESERVED_SAGA = "wal"  # the WAL's own records (attestations, torn-tail notes)


def removal_digest(hashes: Iterable[str]) -> str:
    """SHA-256 over the removed records' ``hash`` values (hex), in order, each + "\\n"."""
    h = hashlib.sha256()
    for x in hashes:
        h.update(x.encode("ascii") + b"\n")
    return h.hexdigest()


def is_attestation(rec: Record) -> bool:
    """Is ``rec`` a compaction attestation?"""
    return rec.type == ATTESTATION_TYPE and rec.saga == RESERVED_SAGA


def parse_attestation(rec: Record) -> list[tuple[int, int, str]] | str:
    """The removed runs ``(first, last, last_hash)`` an attestation names, or why it is malformed."""
    p = rec.payload
    if p is None:
        return []  # redacted: it explains nothing (its gaps then fail verification)
    runs = p.get("removed")
    if not isinstance(runs, list):
        return "compaction attestation has no 'removed' list"
    out: list[tuple[int, int, str]] = []
    total = 0
    floor = 0
    for run in runs:
        if (
            not isinstance(run, list)
            or len(run) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in run[:2])
            or not isinstance(run[2], str)
            or len(run[2]) != 64
        ):
            return f"compaction attestation has a malformed run {run!r}"
        first, last, last_hash = run
        if not floor < first <= last < rec.seq:
            return f"compaction attestation run {first}..{last} is out of order or not before the attestation"
        out.append((first, last, last_hash))
        total += last - first + 1
        floor = last
    if p.get("count") != total:
        return f"compaction attestation says count={p.get('count')!r} but its runs hold {total} sequences"
    return out


class _Attested:
    """The union of every run the attestations seen so far name."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int]] = []
        self.ends: dict[int, str] = {}
        self._merged: list[tuple[int, int]] | None = []

    def add(self, runs: list[tuple[int, int, str]]) -> None:
        for first, last, last_hash in runs:
            self.runs.append((first, last))
            self.ends[last] = last_hash
        self._merged = None

    def copy(self) -> _Attested:
        """An independent copy (runs are immutable tuples)."""
        new = _Attested()
        new.runs, new.ends, new._merged = list(self.runs), dict(self.ends), None
        return new

    def covers(self, first: int, last: int) -> bool:
        if self._merged is None:
            merged: list[tuple[int, int]] = []
            for a, b in sorted(self.runs):
                if merged and a <= merged[-1][1] + 1:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], b))
                else:
                    merged.append((a, b))
            self._merged = merged
        i = bisect.bisect_right(self._merged, (first, 1 << 62)) - 1
        return i >= 0 and self._merged[i][0] <= first and self._merged[i][1] >= last


@dataclass(frozen=True, slots=True)
class _Gap:
    first: int
    last: int
    link: str  # the prev of the record after the gap
    seq: int  # that record's seq
    location: str


# ---------------------------------------------------------------------- verification


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The outcome of checking a chain. ``ok`` is True only if every record adds up.

    ``attested`` counts the sequences missing from the log that compaction attestations
    account for (0 for a log never compacted).
    """

    ok: bool
    records: int
    head: str  # hash of the last good record
    last_seq: int
    first_bad_seq: int | None = None
    location: str | None = None
    reason: str | None = None
    attested: int = 0

    def describe(self) -> str:
        """One line for a human: intact, or the first problem."""
        if self.ok:
            tail = (
                f"; {self.attested} sequences removed by compaction, each attested"
                if self.attested
                else ""
            )
            return (
                f"OK: {self.records} records, chain intact, head {self.head[:16]}… "
                f"(seq {self.last_seq}){tail}"
            )
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
        if not isinstance(rec.salt, str) or not _SALT_HEX.fullmatch(rec.salt):
            # Exactly the writer's form: "AB.." decodes like "ab..", so any other spelling
            # would be an edit the digest cannot see.
            return f"salt is not {SALT_BYTES * 2} lowercase hex digits: the record was altered"
        try:
            canonical = "null" if rec.payload is None else canonical_json(rec.payload)
        except ValueError:
            return "payload holds a value JSON cannot carry (NaN or Infinity): the record was altered"
        try:
            digest = content_digest(rec.salt, canonical)
        except (TypeError, ValueError):
            return "salt is not hexadecimal"
        if digest != rec.digest:
            return "payload does not match its digest: the record's contents were altered"
    if header_hash(rec) != rec.hash:
        return "hash does not match the record's header: seq, ts, type, saga, step or digest was altered"
    return None


def _gap_problem(gap: _Gap, attested: _Attested) -> str | None:
    span = f"{gap.first}..{gap.last}" if gap.first != gap.last else str(gap.first)
    if not attested.covers(gap.first, gap.last):
        return (
            f"sequence jumps from {gap.first - 1} to {gap.seq}: records {span} are missing and "
            f"no compaction attestation accounts for them (records were deleted)"
        )
    if attested.ends.get(gap.last) != gap.link:
        return (
            f"records {span} are attested as removed by compaction, but prev does not match the "
            f"attested hash of record {gap.last}: a record was inserted, removed or altered"
        )
    return None


class ChainVerifier:
    """``verify_records`` one record at a time, for a reader that must check each record
    before it acts on it and keeps reading the same chain later (recovery).

    ``feed`` returns the failure (the first in log order, as ``verify_records`` reports it)
    or None. A record after a gap is checked for its own integrity at once, and its link
    across the gap as soon as an attestation accounts for the gap: until then
    ``unexplained()`` says what would be wrong if the log ended here. After a failure every
    later ``feed`` returns that failure.
    """

    __slots__ = ("_attested", "_gaps", "count", "expected", "failure", "last_seq", "prev")

    def __init__(self) -> None:
        self.prev = GENESIS  # hash of the last good record
        self.expected = 1  # a log starts at seq 1
        self.count = 0
        self.last_seq = 0
        self.failure: VerifyResult | None = None
        self._gaps: list[_Gap] = []
        self._attested = _Attested()

    def snapshot(self) -> ChainVerifier:
        """An independent copy of this verifier's state (cheap: no deep copy; gaps and
        results are immutable), for a reader that may have to forget a read."""
        new = ChainVerifier.__new__(ChainVerifier)
        new.prev, new.expected, new.count, new.last_seq = self.prev, self.expected, self.count, self.last_seq
        new.failure, new._gaps, new._attested = self.failure, list(self._gaps), self._attested.copy()
        return new

    @property
    def gaps(self) -> int:
        """How many gaps in ``seq`` the chain has shown so far (explained or not)."""
        return len(self._gaps)

    def unexplained(self) -> VerifyResult | None:
        """The failure of the first gap no attestation read so far accounts for, or None."""
        for gap in self._gaps:
            why = _gap_problem(gap, self._attested)
            if why is not None:
                return VerifyResult(False, self.count, self.prev, self.last_seq, gap.seq, gap.location, why)
        return None

    def _broken(self, seq: int, location: str, reason: str) -> VerifyResult:
        # An earlier gap that the attestations read so far do not explain comes first.
        self.failure = self.unexplained() or VerifyResult(
            False, self.count, self.prev, self.last_seq, seq, location, reason
        )
        return self.failure

    def feed(self, location: str, item: Record | WALCorrupt) -> VerifyResult | None:
        """Check the next record of the chain (or a record that could not be decoded)."""
        if self.failure is not None:
            return self.failure
        if isinstance(item, WALCorrupt):
            return self._broken(self.last_seq + 1, location, item.message)
        if item.seq > self.expected:
            reason = check_record(item, item.prev, None)  # its own integrity; the link later
            if reason is None:
                self._gaps.append(_Gap(self.expected, item.seq - 1, item.prev, item.seq, location))
        else:
            reason = check_record(item, self.prev, self.expected)
        if reason is not None:
            return self._broken(item.seq, location, reason)
        if is_attestation(item):
            runs = parse_attestation(item)
            if isinstance(runs, str):
                return self._broken(item.seq, location, runs)
            self._attested.add(runs)
        self.prev = item.hash
        self.expected = item.seq + 1
        self.last_seq = item.seq
        self.count += 1
        return None

    def result(self) -> VerifyResult:
        """The outcome if the chain ended here."""
        if self.failure is not None:
            return self.failure
        unexplained = self.unexplained()
        if unexplained is not None:
            return unexplained
        missing = sum(g.last - g.first + 1 for g in self._gaps)
        return VerifyResult(True, self.count, self.prev, self.last_seq, attested=missing)


def verify_records(items: Iterable[tuple[str, Record | WALCorrupt]]) -> VerifyResult:
    """Check a chain given ``(location, record-or-decode-error)`` pairs in log order.

    Gaps in ``seq`` are accepted only where compaction attestations (anywhere in the log)
    account for every missing sequence and the link across the gap (see above). The
    first problem in log order is reported.
    """
    verifier = ChainVerifier()
    for location, item in items:
        if verifier.feed(location, item) is not None:
            break
    return verifier.result()
