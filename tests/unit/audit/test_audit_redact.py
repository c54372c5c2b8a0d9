"""Redaction: payload and salt destroyed, the chain still verifies, a live writer is refused."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from agent_saga import ConfigurationError, FileWAL, WALError, verify_records
from agent_saga.audit import audit_root, redact_record, redact_records
from agent_saga.chain import header_hash
from agent_saga.records import canonical_json
from agent_saga.wal.file import iter_file_records
from fixtures.cli import cli
from fixtures.wal import records as _records


def _log(p: Path) -> None:
    wal = FileWAL(p)
    wal.append("SAGA_STARTED", "gdpr-1", None, {"name": "signup", "email": "ada@example.com"})
    wal.append("STEP_COMMITTED", "gdpr-1", "gdpr-1/0", {"amount": 4200, "iban": "DE00 1234"})
    wal.append("SAGA_STARTED", "other", None, {"name": "keep me"})
    wal.append("SAGA_COMPLETED", "gdpr-1", None, {})
    wal.barrier_sync()
    wal.close()


def test_redaction_destroys_payload_and_salt_and_the_chain_verifies(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    before = _records(p)
    root = audit_root(before)
    report = redact_record(p, 2, reason="ERASURE-77")
    assert report.redacted == (2,) and report.note_seq == 5
    after = _records(p)
    r2 = after[1]
    assert r2.redacted and r2.payload is None and r2.salt is None
    # What survives: existence, position, time, type, saga, step, and the digest.
    old = before[1]
    assert (r2.seq, r2.ts, r2.type, r2.saga, r2.step, r2.digest, r2.prev, r2.hash) == (
        old.seq, old.ts, old.type, old.saga, old.step, old.digest, old.prev, old.hash)
    assert header_hash(r2) == r2.hash
    raw = p.read_bytes()
    # The values as the payload held them (a bare "4200" can occur by chance in a hash or a
    # timestamp of another record; ":4200" and "DE00 1234" cannot).
    assert b"DE00 1234" not in raw and b":4200" not in raw and b'"amount"' not in raw
    assert old.salt is not None and old.salt.encode() not in raw
    assert b"ada@example.com" in raw  # only what was asked
    res = verify_records(iter_file_records(p))
    assert res.ok and res.records == 5
    assert audit_root(after[:4]) == root  # a redaction never changes the tree
    note = after[-1]
    assert note.type == "REDACTION" and note.saga == "wal" and note.payload == {"seqs": [2], "reason": "ERASURE-77"}
    assert cli("verify", "--wal-path", str(p)).returncode == 0


def test_without_the_salt_a_small_payload_cannot_be_guessed_back(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    digest = _records(p)[1].digest
    redact_record(p, 2)
    # Every candidate amount, hashed the only way possible without the salt, misses.
    for amount in range(0, 10_000):
        cand = canonical_json({"amount": amount, "iban": "DE00 1234"})
        assert hashlib.sha256(cand.encode()).hexdigest() != digest


def test_refused_while_a_writer_holds_the_file(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    wal = FileWAL(p)
    try:
        with pytest.raises(ConfigurationError, match="stop the writer first"):
            redact_record(p, 2)
        r = cli("redact", "--wal-path", str(p), "--seq", "2")
        assert r.returncode == 2 and "stop the writer first" in r.stderr
    finally:
        wal.close()
    assert not _records(p)[1].redacted
    redact_record(p, 2)  # once stopped, fine
    # And the writer can reopen and continue the chain after it.
    wal = FileWAL(p)
    wal.append("SAGA_STARTED", "later", None, {})
    wal.barrier_sync()
    wal.close()
    assert verify_records(iter_file_records(p)).ok


def test_writer_lock_is_held_during_the_rewrite(tmp_path: Path) -> None:
    # A FileWAL that opens while the redaction holds the lock is refused, not interleaved.
    import fcntl

    from agent_saga.audit import redaction

    p = tmp_path / "a.wal"
    _log(p)
    fd = redaction._lock(str(p))
    try:
        with pytest.raises(ConfigurationError, match="already open for writing"):
            FileWAL(p)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "seqs, match",
    [([99], "no record with seq 99"), ([5], "no record with seq 5"), ([], "at least one")],
)
def test_bad_targets_are_refused_and_nothing_changes(tmp_path: Path, seqs: list[int], match: str) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    raw = p.read_bytes()
    with pytest.raises(ConfigurationError, match=match):
        redact_records(p, seqs)
    assert p.read_bytes() == raw


def test_wal_records_are_never_redacted(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    redact_record(p, 2)  # writes the REDACTION note, seq 5
    raw = p.read_bytes()
    with pytest.raises(ConfigurationError, match="never redacted"):
        redact_record(p, 5)
    assert p.read_bytes() == raw


def test_redacting_twice_is_a_no_op(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    redact_record(p, 2)
    raw = p.read_bytes()
    report = redact_record(p, 2)
    assert report.redacted == () and report.already == (2,) and report.note_seq is None
    assert p.read_bytes() == raw


def test_a_broken_log_is_not_rewritten(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    p.write_bytes(p.read_bytes().replace(b"keep me", b"keep it"))
    raw = p.read_bytes()
    with pytest.raises(WALError, match="does not verify"):
        redact_record(p, 2)
    assert p.read_bytes() == raw


def test_a_torn_tail_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    with open(p, "ab") as f:
        f.write(b'{"v":1,"seq"')
    with pytest.raises(ConfigurationError, match="torn fragment"):
        redact_record(p, 2)


def test_file_mode_is_kept_and_no_temp_file_is_left(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    os.chmod(p, 0o640)
    redact_records(p, [1, 2], note=False)
    assert stat.S_IMODE(p.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["a.wal"]
    assert len(_records(p)) == 4  # note=False: no REDACTION record


def test_cli_redacts_a_whole_saga(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    r = cli("redact", "--wal-path", str(p), "--saga", "gdpr-1", "--reason", "T-9")
    assert r.returncode == 0 and "seq 1, 2, 4" in r.stdout, r.stdout + r.stderr
    recs = _records(p)
    assert [x.redacted for x in recs] == [True, True, False, True, False]
    assert recs[-1].payload == {"seqs": [1, 2, 4], "reason": "T-9"}
    out = json.loads(cli("verify", "--wal-path", str(p), "--json").stdout)
    assert out["ok"] is True
    r = cli("redact", "--wal-path", str(p), "--saga", "nobody")
    assert r.returncode == 2 and "no record" in r.stderr


async def test_redaction_and_compaction_compose(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    redact_record(p, 3)  # the open saga 'other'
    wal = FileWAL(p)
    await wal.compact()  # drops gdpr-1 (completed), keeps 'other' and the wal notes
    wal.close()
    recs = _records(p)
    assert [r.saga for r in recs] == ["other", "wal", "wal"]
    assert recs[0].redacted
    assert verify_records(iter_file_records(p)).ok
