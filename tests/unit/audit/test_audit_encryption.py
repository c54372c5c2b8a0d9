"""Encryption at rest: verify without the key, loud failure without it, rotation by key id."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
from pathlib import Path

import pytest
from agent_saga import (
    ActionSemantics,
    Compensation,
    ConfigurationError,
    FileWAL,
    WALError,
    saga_scope,
    verify_records,
)
from agent_saga.audit import (
    AESGCMEncryptor,
    EncryptedWAL,
    Keyring,
    WALDecryptFailed,
    WALKeyMissing,
    decrypting,
    encryptor_from_env,
    export_bundle,
    key_usage,
    new_wal_key,
    redact_record,
    verify_bundle,
)
from agent_saga.audit.encryption import decrypt_record, is_envelope
from agent_saga.history import fold
from agent_saga.records import Record
from agent_saga.wal.file import iter_file_records
from fixtures.cli import cli as agent_saga_cli
from fixtures.wal import records as wal_records

K1 = "k1:" + base64.b64encode(b"\x01" * 32).decode()
K2 = "k2:" + base64.b64encode(b"\x02" * 32).decode()
K1_WRONG = "k1:" + base64.b64encode(b"\x03" * 32).decode()


def enc(value: str) -> AESGCMEncryptor:
    return encryptor_from_env({"AGENT_SAGA_WAL_KEY": value})


def cli(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENT_SAGA_WAL_KEY"}
    if key is not None:
        env["AGENT_SAGA_WAL_KEY"] = key
    return agent_saga_cli(*args, env=env)


def raw_records(p: Path) -> list[Record]:
    return wal_records(p, damaged="skip")


def _write(p: Path, key: str, sagas: range) -> None:
    wal = EncryptedWAL(FileWAL(p), enc(key))
    for i in sagas:
        wal.append("SAGA_STARTED", f"s-{i}", None, {"name": "pay", "iban": f"DE{i:04d}"})
        wal.append("STEP_COMMITTED", f"s-{i}", f"s-{i}/0", {"amount": 4200 + i})
    wal.barrier_sync()
    wal.close()


def test_payloads_are_envelopes_on_disk_and_verify_needs_no_key(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p, K1, range(3))
    raw = p.read_bytes()
    # The payloads' fields and values, not their digits alone: hex hashes and salts can
    # hold any four digits.
    assert b"DE0001" not in raw and b'"amount"' not in raw and b'"iban"' not in raw
    recs = raw_records(p)
    assert all(is_envelope(r.payload) and r.payload["kid"] == "k1" for r in recs)  # type: ignore[index]
    assert verify_records(iter_file_records(p)).ok
    r = cli("verify", "--wal-path", str(p))  # no key in the environment
    assert r.returncode == 0, r.stdout + r.stderr
    export_bundle(p, tmp_path / "bundle")
    assert verify_bundle(tmp_path / "bundle").ok
    plain = list(decrypting(recs, enc(K1)))
    assert plain[1].payload == {"amount": 4200}
    assert (plain[1].hash, plain[1].digest) == (recs[1].hash, recs[1].digest)


def test_a_reader_without_the_key_fails_loudly(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p, K1, range(2))
    with pytest.raises(WALKeyMissing) as e:
        list(decrypting(raw_records(p), None))
    assert e.value.seq == 1 and e.value.kid == "k1" and e.value.saga_id == "s-0"
    assert "AGENT_SAGA_WAL_KEY" in e.value.message
    # A recovery pass folds decrypted records: it halts rather than read envelopes as payloads.
    with pytest.raises(WALKeyMissing):
        fold(decrypting(raw_records(p), None))
    with pytest.raises(WALKeyMissing, match="no key with id 'k1'"):
        list(decrypting(raw_records(p), enc(K2)))


def test_a_wrong_key_or_an_altered_envelope_fails_authentication(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p, K1, range(2))
    recs = raw_records(p)
    with pytest.raises(WALDecryptFailed, match="does not authenticate"):
        list(decrypting(recs, enc(K1_WRONG)))
    # An envelope moved to another record (another saga, type or step) does not open there.
    moved = Record("STEP_COMMITTED", "s-1", "s-1/0", recs[1].payload, recs[3].seq)
    with pytest.raises(WALDecryptFailed):
        decrypt_record(moved, enc(K1))
    flipped = dict(recs[1].payload or {})
    ct = bytearray(base64.b64decode(flipped["ct"]))
    ct[0] ^= 1
    flipped["ct"] = base64.b64encode(bytes(ct)).decode()
    with pytest.raises(WALDecryptFailed):
        decrypt_record(Record(recs[1].type, recs[1].saga, recs[1].step, flipped, 2), enc(K1))


async def test_encrypted_wal_reads_back_in_plaintext(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    wal = EncryptedWAL(FileWAL(p), enc(K1))
    wal.append("SAGA_STARTED", "s", None, {"name": "x"})
    wal.append("SAGA_COMPLETED", "s", None, None)
    await wal.barrier()
    got = [r async for r in wal.read_all()]
    assert [r.payload for r in got] == [{"name": "x"}, None]
    assert [r.seq async for r in wal.read_since(1)] == [2]
    assert wal.stats().backend == "file"
    wal.close()


def test_key_rotation_new_writes_use_the_primary_old_records_read_by_kid(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p, K1, range(2))  # written under k1
    _write(p, f"{K2},{K1}", range(2, 4))  # rotated: k2 primary, k1 kept for reading
    recs = raw_records(p)
    assert key_usage(recs) == {"k1": 4, "k2": 4}
    assert [r.payload["kid"] for r in recs] == ["k1"] * 4 + ["k2"] * 4  # type: ignore[index]
    plain = list(decrypting(recs, enc(f"{K2},{K1}")))
    assert [r.payload for r in plain][-1] == {"amount": 4203}
    with pytest.raises(WALKeyMissing) as e:
        list(decrypting(recs, enc(K2)))  # k1 retired too early
    assert e.value.kid == "k1" and e.value.seq == 1
    assert verify_records(iter_file_records(p)).ok


async def test_old_key_can_retire_once_compaction_removed_its_records(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    wal = EncryptedWAL(FileWAL(p), enc(K1))
    wal.append("SAGA_STARTED", "old", None, {"x": 1})
    wal.append("SAGA_COMPLETED", "old", None, {})
    await wal.barrier()
    wal.close()
    wal = EncryptedWAL(FileWAL(p), enc(f"{K2},{K1}"))
    wal.append("SAGA_STARTED", "new", None, {"x": 2})
    report = await wal.compact()  # the attestation is written by the inner WAL, in plaintext
    wal.close()
    assert report.removed == 2
    recs = raw_records(p)
    assert key_usage(recs) == {"k2": 1}
    assert not is_envelope(recs[-1].payload) and recs[-1].type == "COMPACTION"
    assert verify_records(iter_file_records(p)).ok
    assert [r.payload for r in decrypting(recs, enc(K2))][0] == {"x": 2}


def test_redaction_destroys_the_ciphertext(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p, K1, range(1))
    ct = raw_records(p)[1].payload["ct"]  # type: ignore[index]
    redact_record(p, 2)
    assert ct.encode() not in p.read_bytes()
    recs = list(decrypting(raw_records(p), enc(K1)))  # a redacted record reads as redacted
    assert recs[1].redacted and recs[1].payload is None


def test_engine_runs_on_an_encrypted_wal(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    undone: list[str] = []
    wal = EncryptedWAL(FileWAL(p), enc(K1))

    async def run() -> None:
        with pytest.raises(RuntimeError):
            async with saga_scope(wal, saga_id="enc-1") as saga:
                await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE,
                                   forward=lambda: {"id": "ch_secret_7"},
                                   compensate=lambda r: Compensation(fn=lambda: undone.append(r["id"])))
                raise RuntimeError("roll back")

    asyncio.run(run())
    wal.close()
    assert undone == ["ch_secret_7"]
    assert b"stripe.charge" not in p.read_bytes()
    sagas = fold(decrypting(raw_records(p), enc(K1)))
    step = sagas["enc-1"].steps["enc-1/0"]
    assert (sagas["enc-1"].status, step.tool, step.state) == ("ROLLED_BACK", "stripe.charge", "COMPENSATED")


def test_an_encrypted_wal_without_a_key_refuses_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_SAGA_WAL_KEY", raising=False)
    with pytest.raises(WALKeyMissing, match="AGENT_SAGA_WAL_KEY is not set"):
        encryptor_from_env()
    inner = FileWAL(tmp_path / "x.wal")
    try:
        with pytest.raises(WALKeyMissing):
            EncryptedWAL(inner)  # never a silent fallback to plaintext
    finally:
        inner.close()
    monkeypatch.setenv("AGENT_SAGA_WAL_KEY", K1)
    wal = EncryptedWAL(FileWAL(tmp_path / "y.wal"))
    wal.append("SAGA_STARTED", "s", None, {"a": 1})
    wal.close()
    assert raw_records(tmp_path / "y.wal")[0].payload["kid"] == "k1"  # type: ignore[index]


def test_key_configuration_errors_never_echo_the_key() -> None:
    short = base64.b64encode(b"secret-material-16").decode()
    with pytest.raises(ConfigurationError, match="needs 32") as e:
        Keyring.parse(f"k:{short}")
    assert short not in str(e.value)
    with pytest.raises(ConfigurationError, match="appears twice"):
        Keyring.parse(f"{K1},{K1}")
    with pytest.raises(ConfigurationError, match="key id"):
        Keyring.parse("bad id!:" + K1.split(":")[1])
    ring = Keyring.parse(K1.split(":")[1])  # no kid: a fingerprint id
    assert ring.primary.startswith("k-") and "AQEB" not in repr(ring)
    assert isinstance(WALKeyMissing("x"), WALError)


def test_keygen_wal_makes_a_usable_key() -> None:
    r = cli("keygen", "wal", "--kid", "prod-2026")
    assert r.returncode == 0
    value = r.stdout.strip()
    assert value.startswith("prod-2026:")
    e = enc(value)
    env = e.encrypt({"a": 1}, b"aad")
    assert e.decrypt(env, b"aad") == {"a": 1}
    assert enc(new_wal_key()).keyring.primary.startswith("k-")


def test_recovery_without_the_key_halts_loudly_and_with_it_recovers(tmp_path: Path) -> None:
    import time

    from agent_saga import compensator
    from agent_saga.audit import certify
    from agent_saga.recovery import FileClaimLock, FileLedger, RecoveryDaemon

    refunded: list[str] = []

    @compensator("test_audit_encryption.refund")
    def refund(charge_id: str, idempotency_key: str | None = None) -> None:
        refunded.append(charge_id)

    p = tmp_path / "a.wal"
    wal = EncryptedWAL(FileWAL(p), enc(K1))  # a process that died after the charge committed
    wal.append("SAGA_STARTED", "s", None, {"name": "checkout"})
    wal.append("STEP_INTENT", "s", "s/0", {"tool": "stripe.charge", "semantics": "COMPENSABLE"})
    wal.append("STEP_COMMITTED", "s", "s/0", {"compensation": {
        "handler": "test_audit_encryption.refund", "kwargs": {"charge_id": "ch_1"}}})
    wal.barrier_sync()
    wal.close()
    assert not certify(decrypting(raw_records(p), enc(K1))).ok

    async def sweep(key: str):  # noqa: ANN202
        w = EncryptedWAL(FileWAL(p), enc(key))
        try:
            daemon = RecoveryDaemon(w, ledger=FileLedger(tmp_path / "ledger.jsonl"),
                                    lock=FileClaimLock(tmp_path / "claims"), lease_grace=0,
                                    clock=lambda: time.time() + 3600)  # every lease has expired
            return await daemon.sweep()
        finally:
            w.close()

    report = asyncio.run(sweep(K2))  # a daemon holding only another key
    assert report.halted and "no key with id 'k1'" in report.halted and not report.results
    assert refunded == [] and len(raw_records(p)) == 3  # nothing acted on, nothing written
    report = asyncio.run(sweep(K1))
    assert report.halted is None and refunded == ["ch_1"]
    assert is_envelope(raw_records(p)[-1].payload)  # the daemon's records are encrypted too
    assert verify_records(iter_file_records(p)).ok
    cert = certify(decrypting(raw_records(p), enc(K1)))
    assert cert.ok and cert.compensated == 1, cert.describe()
