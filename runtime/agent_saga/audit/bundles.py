"""WORM audit bundles: the log's exact lines, a manifest, and checksums ``sha256sum -c`` reads.

    DIR/records.ndjson   every complete line of the log, byte for byte, in order
    DIR/manifest.json    format, source, counts, first/last seq, chain head, the SHA-256 of
                         records.ndjson, the Merkle audit root, broken flag, the rule in prose
    DIR/SHA256SUMS       "<sha256>  records.ndjson" and "<sha256>  manifest.json"

Invariants:
- A bundle is written once: into a fresh temp directory beside ``DIR``, each file fsynced
  and made read-only (0444), then renamed to ``DIR`` (which must not exist or be empty).
  A crash leaves no half bundle under ``DIR``.
- The chain is verified on the bundle's own copy, so the manifest describes exactly the
  bytes shipped. A broken chain is refused unless ``allow_broken``, and then the manifest
  says ``"broken": true`` and where: a broken log is never laundered into an authoritative
  looking artifact.
- A torn final fragment of the source (an unacknowledged write) is not exported.
- Re-checking needs only ``sha256sum -c SHA256SUMS`` and the rule in the manifest (a
  reference script in plain Python is docs/verify_bundle.py); ``verify_bundle`` is ours.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..chain import VerifyResult, verify_records
from ..errors import ConfigurationError, WALCorrupt, WALError
from ..records import Record
from ..wal.file import iter_file_records
from .merkle import MerkleTree, leaf_hash

BUNDLE_FORMAT = "agent-saga.audit-bundle/v1"
RECORDS = "records.ndjson"
MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"

RULE = [
    "This bundle is evidence only if every step below holds. No agent-saga code is needed.",
    "1. Integrity: `sha256sum -c SHA256SUMS` passes, and records_sha256 in this manifest is the "
    "SHA-256 of records.ndjson. Record the SHA-256 of SHA256SUMS (or this manifest) somewhere "
    "the bundle's author cannot change it.",
    "2. records.ndjson holds one JSON object per line, each line ending in a newline, in log "
    "order. Fields: v (1), seq, ts (microseconds since the epoch), type, saga, step (or null), "
    "payload (object or null), salt (hex or null), digest, prev, hash (64 hex each), optional "
    "redacted (true) and unhashed stamps such as gseq, which the rule ignores.",
    "3. canonical(payload) is the payload as JSON with object keys sorted at every level, ',' "
    "and ':' separators, no whitespace, non-ASCII characters written as UTF-8 rather than \\u "
    "escapes, and 'null' for a null payload (Python: json.dumps(p, sort_keys=True, "
    "separators=(',', ':'), ensure_ascii=False)).",
    "4. Content: unless the record has redacted=true, salt is not null and digest = "
    "hex(SHA-256(bytes of hex salt || UTF-8 canonical(payload))). A redacted record has payload "
    "and salt null; its digest is taken as written (its contents were erased on purpose).",
    "5. Header: hash = hex(SHA-256(UTF-8 of v, seq, ts, type, saga, step or '', digest, prev "
    "joined by '\\n', numbers in decimal)).",
    "6. Order: seq starts at 1 and rises by one, and prev is the hash of the record before "
    "(64 zeros before seq 1). A jump in seq (including a first record above 1) is accepted only "
    "where COMPACTION records of saga 'wal' anywhere in the file list, in payload.removed, runs "
    "[first, last, last_hash] that together cover every missing sequence, and a run ends at the "
    "last missing sequence with last_hash equal to the prev of the record after the jump. A "
    "COMPACTION payload's runs are ascending, end before its own seq, and payload.count is the "
    "number of sequences they cover.",
    "7. This manifest: records, first_seq, last_seq and head (the hash of the last record) "
    "match records.ndjson; audit_root is the RFC 6962 Merkle root over leaves "
    "SHA-256(0x00 || 32 bytes of each record's hash), nodes SHA-256(0x01 || left || right).",
    "8. If broken is true the chain does NOT verify: the bundle only preserves a damaged log, "
    "and broken_at says where the first failure is.",
    "A chain cannot show records cut off its end: compare head and last_seq with a checkpoint "
    "or an earlier published manifest.",
]


@dataclass(frozen=True, slots=True)
class BundleResult:
    """The outcome of ``verify_bundle``. ``ok`` only if intact, consistent and not broken.

    ``labelled_broken`` is True for an intact bundle of a broken log, exported on purpose
    with ``allow_broken``: faithful, but not evidence that the log was intact.
    """

    ok: bool
    problems: tuple[str, ...]
    chain: VerifyResult | None
    manifest: dict[str, Any] = field(default_factory=dict)
    labelled_broken: bool = False

    def describe(self) -> str:
        """One line for a human: what was checked and what was found."""
        if self.ok:
            assert self.chain is not None
            return (f"OK: bundle intact; {self.chain.records} records, chain intact, head "
                    f"{self.chain.head[:16]}… (seq {self.chain.last_seq})")
        if self.labelled_broken and not self.problems:
            assert self.chain is not None
            return f"LABELLED BROKEN: the bundle is intact, but the log it preserves is not: {self.chain.describe()}"
        return "FAILED: " + "; ".join(self.problems)


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _copy_complete_lines(src: str, dst: str) -> tuple[str, int]:
    try:
        fin = open(src, "rb")
    except FileNotFoundError:
        raise ConfigurationError(f"WAL file {src!r} does not exist; check --wal-path") from None
    h = hashlib.sha256()
    size = 0
    with fin, open(dst, "xb") as out:
        for line in fin:
            if not line.endswith(b"\n"):
                break  # a torn final fragment was never acknowledged
            out.write(line)
            h.update(line)
            size += len(line)
        out.flush()
        os.fsync(out.fileno())
    return h.hexdigest(), size


def _relative(location: str | None, path: str) -> str | None:
    if location is None:
        return None
    return location.replace(path, RECORDS, 1)


def _scan(path: str) -> tuple[VerifyResult, int | None, list[bytes]]:
    leaves: list[bytes] = []
    first: list[int] = []

    def watch(items: Iterable[tuple[str, Record | WALCorrupt]]) -> Iterator[tuple[str, Record | WALCorrupt]]:
        for loc, item in items:
            if isinstance(item, Record):
                if not first:
                    first.append(item.seq)
                try:
                    leaves.append(leaf_hash(item.hash))
                except ValueError:  # not hex: verify_records names the record
                    leaves.append(b"")
            yield loc, item

    result = verify_records(watch(iter_file_records(path)))
    return result, (first[0] if first else None), leaves


def _write_readonly(path: str, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def export_bundle(
    wal_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    allow_broken: bool = False,
    created: _dt.datetime | None = None,
) -> dict[str, Any]:
    """Write a WORM bundle of the FileWAL file ``wal_path`` to ``out_dir``; return its manifest.

    Raises ``ConfigurationError`` if ``out_dir`` exists and is not empty or the log is
    missing; ``WALError`` if the chain is broken and ``allow_broken`` is False (nothing is
    left behind).
    """
    src = os.fspath(wal_path)
    out = os.path.abspath(os.fspath(out_dir))
    if os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ConfigurationError(f"{out!r} exists and is not an empty directory; a bundle is written once, to a new place")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out)}.partial-{time.time_ns()}")
    os.mkdir(tmp, 0o755)
    try:
        records_path = os.path.join(tmp, RECORDS)
        digest, size = _copy_complete_lines(src, records_path)
        result, first_seq, leaves = _scan(records_path)
        if not result.ok and not allow_broken:
            raise WALError(
                f"refusing to export a broken chain: {_relative(result.location, records_path)} "
                f"(seq {result.first_bad_seq}): {result.reason}. Pass --allow-broken to preserve "
                f"it anyway; the bundle is then labelled broken"
            )
        when = (created or _dt.datetime.now(_dt.UTC)).astimezone(_dt.UTC)
        manifest: dict[str, Any] = {
            "format": BUNDLE_FORMAT,
            "created": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "created_by": "agent-saga",
            "source": os.path.abspath(src),
            "records_file": RECORDS,
            "records_sha256": digest,
            "records_bytes": size,
            "records": result.records,
            "first_seq": first_seq,
            "last_seq": result.last_seq,
            "head": result.head,
            "attested_missing": result.attested,
            "broken": not result.ok,
            "broken_at": None if result.ok else {
                "seq": result.first_bad_seq,
                "location": _relative(result.location, records_path),
                "reason": result.reason,
            },
            "audit_root": None if not result.ok else {
                "tree_size": len(leaves), "root": MerkleTree(leaves).root.hex(),
            },
            "rule": RULE,
        }
        manifest_bytes = (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
        _write_readonly(os.path.join(tmp, MANIFEST), manifest_bytes)
        sums = (f"{digest}  {RECORDS}\n"
                f"{hashlib.sha256(manifest_bytes).hexdigest()}  {MANIFEST}\n").encode()
        _write_readonly(os.path.join(tmp, SUMS), sums)
        for name in (RECORDS, MANIFEST, SUMS):
            os.chmod(os.path.join(tmp, name), 0o444)
        _fsync_dir(tmp)
        os.rename(tmp, out)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


_BOM = b"\xef\xbb\xbf"


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def form_problem(lines: Iterable[bytes], name: str, *, json_lines: bool = False, json_doc: bool = False) -> str | None:
    """Why a bundle file (its lines, as read in binary) is not in the form an export
    writes, or None: a UTF-8 byte order mark, a CR (CRLF line endings), or, for JSON
    (``json_lines``: one document a line; ``json_doc``: the whole file), a key repeated in
    one object. Each is refused, not tolerated: a file re-saved or converted is not the
    file exported, and JSON parsers disagree on which of two values of one key counts (a
    reader could be shown a value other than the one verified)."""
    doc: list[bytes] = []
    for i, raw in enumerate(lines, 1):
        if raw.startswith(_BOM):
            return (f"{name} line {i} starts with a UTF-8 byte order mark (BOM): bundle files have none; "
                    f"the file was re-saved or converted after export")
        if b"\r" in raw:
            return (f"{name} line {i} has a CR (CRLF line endings): bundle files end lines with LF only; "
                    f"the file was converted after export")
        if json_doc:
            doc.append(raw)
        elif json_lines and raw.strip():
            why = _duplicate_key(raw, f"{name} line {i}")
            if why is not None:
                return why
    return _duplicate_key(b"".join(doc), name) if json_doc else None


def _duplicate_key(text: bytes, where: str) -> str | None:
    try:
        json.loads(text, object_pairs_hook=_unique)
    except _DuplicateKey as exc:
        return (f"{where} repeats the key {exc.key!r} in one object: JSON parsers disagree on which value "
                f"counts, so a reader could see a value other than the one verified")
    except ValueError:
        pass  # not JSON at all: the chain or manifest check says so
    return None


def verify_bundle(bundle_dir: str | os.PathLike[str]) -> BundleResult:
    """Re-check a bundle by the rule in its manifest: checksums, chain, manifest fields.

    Never raises for a bad bundle: every problem found is listed (files first, then the
    chain, then the manifest's claims). The reference re-implementation without our code
    is docs/verify_bundle.py; the two agree.
    """
    d = os.fspath(bundle_dir)
    problems: list[str] = []
    try:
        with open(os.path.join(d, MANIFEST), "rb") as f:
            raw = f.read()
        why = form_problem(raw.splitlines(keepends=True), MANIFEST, json_doc=True)
        if why is not None:
            return BundleResult(False, (why,), None)
        manifest = json.loads(raw)
        if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"format is not {BUNDLE_FORMAT!r}")
    except (OSError, ValueError) as exc:
        return BundleResult(False, (f"{MANIFEST} is missing or unreadable: {exc}",), None)
    for name, lines in ((SUMS, False), (RECORDS, True)):
        try:
            with open(os.path.join(d, name), "rb") as f:
                why = form_problem(f, name, json_lines=lines)
        except OSError:
            continue  # missing: said below
        if why is not None:
            problems.append(why)
    listed: dict[str, str] = {}
    try:
        with open(os.path.join(d, SUMS), encoding="utf-8") as f:
            for line in f:
                want, _, name = line.rstrip("\n").partition("  ")
                listed[name.lstrip("*")] = want
    except OSError as exc:
        problems.append(f"{SUMS} is missing or unreadable: {exc}")
    for name in (RECORDS, MANIFEST):
        if listed and name not in listed:
            problems.append(f"{SUMS} does not list {name}")
    for name, want in listed.items():
        try:
            got = _sha256_file(os.path.join(d, name))
        except OSError:
            problems.append(f"{name} is listed in {SUMS} but missing")
            continue
        if got != want:
            problems.append(f"{name} does not match its SHA-256 in {SUMS} (altered)")
    records_path = os.path.join(d, RECORDS)
    if not os.path.exists(records_path):
        return BundleResult(False, (*problems, f"{RECORDS} is missing"), None, manifest)
    if _sha256_file(records_path) != manifest.get("records_sha256"):
        problems.append(f"{RECORDS} does not match records_sha256 in the manifest (altered)")
    with open(records_path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                problems.append(f"{RECORDS} does not end with a newline (truncated mid-record)")
    result, first_seq, leaves = _scan(records_path)
    broken = manifest.get("broken")
    if broken is True:
        at = manifest.get("broken_at") or {}
        if result.ok:
            problems.append("the manifest labels the chain broken, but it verifies")
        elif at.get("seq") != result.first_bad_seq:
            problems.append(f"the manifest says the chain breaks at seq {at.get('seq')}, it breaks "
                            f"at seq {result.first_bad_seq}")
        return BundleResult(False, tuple(problems), result, manifest, labelled_broken=True)
    if broken is not False:
        problems.append("the manifest has no broken flag")
    if not result.ok:
        problems.append(f"the chain does not verify: {_relative(result.location, records_path)} "
                        f"(seq {result.first_bad_seq}): {result.reason}")
    else:
        claims = {"records": result.records, "first_seq": first_seq, "last_seq": result.last_seq,
                  "head": result.head}
        for key, have in claims.items():
            if manifest.get(key) != have:
                problems.append(f"manifest {key} is {manifest.get(key)!r}, the records say {have!r}")
        root = {"tree_size": len(leaves), "root": MerkleTree(leaves).root.hex()}
        if manifest.get("audit_root") != root:
            problems.append("manifest audit_root does not match the records' Merkle root")
    return BundleResult(not problems, tuple(problems), result, manifest)
