"""Signed checkpoints: truncation, rewrites and forged signatures are caught; redaction is not
mistaken for tampering; a compaction after a checkpoint is refused for the records it signed
(tests/unit/audit/test_audit_checkpoint_pinned.py has the forged-attestation attacks)."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from agent_saga import ConfigurationError, FileWAL, WALError
from agent_saga.audit import (
    Checkpoint,
    audit_root,
    build_disclosure,
    generate_signing_key,
    load_private_key,
    load_public_key,
    make_checkpoint,
    redact_records,
    verify_checkpoint,
    verify_disclosure,
)
from agent_saga.records import Record
from agent_saga.wal.file import iter_file_records
from fixtures.cli import cli


@pytest.fixture
def keys(tmp_path: Path) -> tuple:
    priv, pub = generate_signing_key(tmp_path / "signing.key")
    return load_private_key(priv), load_public_key(pub)


def _append(p: Path, *sagas: tuple[str, bool]) -> None:
    wal = FileWAL(p)
    for sid, done in sagas:
        wal.append("SAGA_STARTED", sid, None, {"name": "pay"})
        wal.append("STEP_COMMITTED", sid, f"{sid}/0", {"amount": 4200})
        if done:
            wal.append("SAGA_COMPLETED", sid, None, {})
    wal.barrier_sync()
    wal.close()


def _check(p: Path, cp: Checkpoint, pub, **kw):  # noqa: ANN001
    return verify_checkpoint(cp, pub, iter_file_records(p), **kw)


def test_checkpoint_verifies_and_survives_appends(tmp_path: Path, keys: tuple) -> None:
    priv, pub = keys
    p = tmp_path / "a.wal"
    _append(p, ("s-1", True), ("s-2", False))
    cp = make_checkpoint(iter_file_records(p), priv, log_id="pod-7")
    assert (cp.seq, cp.records, cp.log_id) == (5, 5, "pod-7")
    res = _check(p, cp, pub)
    assert res.ok and res.head_status == "present" and res.appended == 0, res.describe()
    _append(p, ("s-3", False))
    res = _check(p, cp, pub)
    assert res.ok and res.appended == 2
    # The checkpoint is also a signed tree head for disclosures.
    recs = [r for _, r in iter_file_records(p) if isinstance(r, Record)][: cp.tree_size]
    assert audit_root(recs).root == cp.root
    assert verify_disclosure(build_disclosure(recs, saga_id="s-1"), cp.root).ok


def test_truncated_tail_is_detected(tmp_path: Path, keys: tuple) -> None:
    priv, pub = keys
    p = tmp_path / "a.wal"
    _append(p, ("s-1", True), ("s-2", True))
    cp = make_checkpoint(iter_file_records(p), priv, log_id="x")
    lines = p.read_bytes().splitlines(keepends=True)
    p.write_bytes(b"".join(lines[:-2]))  # a plain chain still verifies...
    assert cli("verify", "--wal-path", str(p)).returncode == 0
    res = _check(p, cp, pub)  # ...the checkpoint does not
    assert not res.ok and "truncated" in (res.reason or "")


def test_truncate_and_reappend_is_detected(tmp_path: Path, keys: tuple) -> None:
    priv, pub = keys
    p = tmp_path / "a.wal"
    _append(p, ("s-1", True), ("s-2", True))
    cp = make_checkpoint(iter_file_records(p), priv, log_id="x")
    lines = p.read_bytes().splitlines(keepends=True)
    p.write_bytes(b"".join(lines[:3]))
    _append(p, ("forged", True))  # same length again, a valid chain, different records
    res = _check(p, cp, pub)
    assert not res.ok and "rewritten" in (res.reason or ""), res.describe()


def test_forged_or_altered_checkpoint_is_refused(tmp_path: Path, keys: tuple) -> None:
    priv, pub = keys
    p = tmp_path / "a.wal"
    _append(p, ("s-1", True), ("s-2", True))
    cp = make_checkpoint(iter_file_records(p), priv, log_id="x")
    d = cp.to_dict()
    for field, value in [("seq", 3), ("head", "0" * 64), ("log_id", "y"), ("root", "ab" * 32)]:
        res = _check(p, Checkpoint.from_dict({**d, field: value}), pub)
        assert not res.ok and "forged or altered" in (res.reason or ""), field
    sig = bytearray(base64.b64decode(d["signature"]))
    sig[0] ^= 1
    res = _check(p, Checkpoint.from_dict({**d, "signature": base64.b64encode(bytes(sig)).decode()}), pub)
    assert not res.ok
    other_priv, other_pub = generate_signing_key(tmp_path / "other.key")
    res = _check(p, cp, load_public_key(other_pub))
    assert not res.ok and "public key given" in (res.reason or "")
    # A checkpoint someone else signed, with their own key id inside, is still refused.
    forged = make_checkpoint(iter_file_records(p), load_private_key(other_priv), log_id="x")
    assert not _check(p, forged, pub).ok


def test_redaction_after_a_checkpoint_is_accepted(tmp_path: Path, keys: tuple) -> None:
    priv, pub = keys
    p = tmp_path / "a.wal"
    _append(p, ("s-1", True), ("s-2", True))
    cp = make_checkpoint(iter_file_records(p), priv, log_id="x")
    redact_records(p, [1, 2, 6], reason="T-1")  # 6 is the checkpointed record itself
    res = _check(p, cp, pub)
    assert res.ok and res.head_status == "present", res.describe()


async def test_compaction_after_a_checkpoint_is_refused_for_its_records(tmp_path: Path, keys: tuple) -> None:
    priv, pub = keys
    p = tmp_path / "a.wal"
    _append(p, ("s-1", False), ("s-2", True))
    cp = make_checkpoint(iter_file_records(p), priv, log_id="x")
    wal = FileWAL(p)
    await wal.compact()  # removes s-2, whose last record is the checkpointed head
    wal.close()
    for strict in (False, True):
        res = _check(p, cp, pub, strict=strict)
        assert not res.ok and "checkpointed head, is missing" in (res.reason or ""), res.describe()
    newer = make_checkpoint(iter_file_records(p), priv, log_id="x")  # taken after the compaction
    assert _check(p, newer, pub).ok


async def test_checkpointed_record_removed_mid_run(tmp_path: Path, keys: tuple) -> None:
    priv, pub = keys
    p = tmp_path / "a.wal"
    wal = FileWAL(p)
    wal.append("SAGA_STARTED", "s-1", None, {})
    wal.barrier_sync()
    wal.close()
    cp = make_checkpoint(iter_file_records(p), priv, log_id="x")
    wal = FileWAL(p)
    wal.append("SAGA_COMPLETED", "s-1", None, {})  # the same saga continues past the checkpoint
    await wal.compact()  # run 1..2 removed: the checkpointed seq 1 is inside it
    wal.close()
    for strict in (False, True):
        res = _check(p, cp, pub, strict=strict)
        assert not res.ok and "compaction attested at seq 3" in (res.reason or ""), res.describe()


def test_broken_log_is_neither_signed_nor_accepted(tmp_path: Path, keys: tuple) -> None:
    priv, pub = keys
    p = tmp_path / "a.wal"
    _append(p, ("s-1", True))
    cp = make_checkpoint(iter_file_records(p), priv, log_id="x")
    p.write_bytes(p.read_bytes().replace(b"4200", b"4201", 1))
    with pytest.raises(WALError, match="refusing to sign"):
        make_checkpoint(iter_file_records(p), priv, log_id="x")
    res = _check(p, cp, pub)
    assert not res.ok and "chain is broken" in (res.reason or "")
    empty = tmp_path / "empty.wal"
    empty.write_bytes(b"")
    with pytest.raises(WALError, match="empty"):
        make_checkpoint(iter_file_records(empty), priv, log_id="x")


def test_cli_keygen_checkpoint_verify(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _append(p, ("s-1", True), ("s-2", True))
    key = tmp_path / "ck"
    r = cli("keygen", "checkpoint", "--out", str(key))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and b"PUBLIC KEY" in (tmp_path / "ck.pub").read_bytes()
    assert cli("keygen", "checkpoint", "--out", str(key)).returncode == 2  # never overwrites a key
    cpf = tmp_path / "cp.json"
    r = cli("checkpoint", "--wal-path", str(p), "--key", str(key), "--out", str(cpf))
    assert r.returncode == 0, r.stderr
    assert json.loads(cpf.read_text())["log_id"] == "a.wal"
    r = cli("checkpoint", "--wal-path", str(p), "--key", str(key), "--out", str(cpf))
    assert r.returncode == 2 and "nothing was overwritten" in r.stderr
    r = cli("verify-checkpoint", "--wal-path", str(p), "--checkpoint", str(cpf), "--pubkey", f"{key}.pub")
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr
    # the checkpoint doubles as a signed root for verify-proof
    proof = tmp_path / "proof.json"
    assert cli("prove", "--wal-path", str(p), "--saga", "s-2", "--out", str(proof)).returncode == 0
    r = cli("verify-proof", str(proof), "--root", str(cpf), "--pubkey", f"{key}.pub")
    assert r.returncode == 0, r.stdout + r.stderr
    assert cli("verify-proof", str(proof), "--root", str(cpf)).returncode == 2  # needs --pubkey
    p.write_bytes(b"".join(p.read_bytes().splitlines(keepends=True)[:-1]))
    r = cli("verify-checkpoint", "--wal-path", str(p), "--checkpoint", str(cpf), "--pubkey", f"{key}.pub",
            "--json")
    assert r.returncode == 1 and "truncated" in json.loads(r.stdout)["reason"]
    d = json.loads(cpf.read_text())
    d["seq"] = 1
    os.chmod(cpf, 0o644)
    cpf.write_text(json.dumps(d))
    r = cli("verify-checkpoint", "--wal-path", str(p), "--checkpoint", str(cpf), "--pubkey", f"{key}.pub")
    assert r.returncode == 1 and "forged or altered" in r.stdout
    r = cli("verify-proof", str(proof), "--root", str(cpf), "--pubkey", f"{key}.pub")
    assert r.returncode == 1 and "refusing its root" in r.stderr


def test_not_a_checkpoint_or_not_a_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not an agent-saga checkpoint"):
        Checkpoint.from_dict({"format": "nope"})
    (tmp_path / "k.pub").write_text("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
    with pytest.raises((ConfigurationError, ValueError)):
        load_public_key(tmp_path / "k.pub")
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_private_key(tmp_path / "missing.key")
