"""A signed checkpoint pins every record it signed: records deleted inside its range and
explained away by a compaction attestation forged after it are caught by the real
``agent-saga verify-checkpoint`` (with and without ``--strict``), as is a rewrite of the
records before an earlier, genuine compaction gap (the Merkle root)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from agent_saga import FileWAL
from agent_saga.chain import seal
from agent_saga.records import GENESIS, Record, decode_line, encode_line
from fixtures.cli import cli
from fixtures.forgery import forge_deletion


def _write_log(p: Path) -> None:
    """A paid saga awaiting a human's decision (denied), and an unresolved transfer."""
    wal = FileWAL(p)
    wal.append("SAGA_STARTED", "pay-1", None, {"name": "pay"})  # 1
    wal.append("APPROVAL_REQUESTED", "pay-1", "pay-1/0", {"approvers": ["cfo@corp"]})  # 2
    wal.append("APPROVAL_DECIDED", "pay-1", "pay-1/0", {"decision": "deny", "by": "cfo@corp"})  # 3
    wal.append("SAGA_STARTED", "xfer-9", None, {"name": "transfer"})  # 4
    wal.append("STEP_INTENT", "xfer-9", "xfer-9/0", {"tool": "wire", "semantics": "COMPENSABLE"})  # 5
    wal.append("STEP_COMMITTED", "xfer-9", "xfer-9/0", {"result": {"id": "w-1"}})  # 6
    wal.append("SAGA_STARTED", "ok-1", None, {"name": "pay"})  # 7
    wal.append("SAGA_COMPLETED", "ok-1", None, {})  # 8
    wal.barrier_sync()
    wal.close()


def _lines(p: Path) -> list[bytes]:
    return p.read_bytes().splitlines(keepends=True)


def _forge(p: Path, drop: set[int], tail: list[tuple[str, str, str | None, dict]]) -> None:
    """Rewrite ``p`` as an attacker with write access would (``forge_deletion``)."""
    recs = [decode_line(line, f"line {i}") for i, line in enumerate(_lines(p), 1)]
    kept, appended = forge_deletion(recs, drop, tail)
    p.write_bytes(b"".join([encode_line(r) for r in kept] + appended))


def _checkpoint(tmp_path: Path, p: Path) -> tuple[Path, Path]:
    key = tmp_path / "cp.key"
    assert cli("keygen", "checkpoint", "--out", str(key)).returncode == 0
    cpf = tmp_path / "cp.json"
    r = cli("checkpoint", "--wal-path", str(p), "--key", str(key), "--out", str(cpf))
    assert r.returncode == 0, r.stderr
    return cpf, Path(f"{key}.pub")


def _verify_cp(p: Path, cpf: Path, pub: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("verify-checkpoint", "--wal-path", str(p), "--checkpoint", str(cpf), "--pubkey", str(pub), *extra)


def test_deleting_signed_records_behind_a_forged_attestation_is_caught(tmp_path: Path) -> None:
    p = tmp_path / "agent-saga.wal"
    _write_log(p)
    cpf, pub = _checkpoint(tmp_path, p)
    assert cli("certify", "--wal-path", str(p)).returncode == 1  # xfer-9 is unresolved
    assert _verify_cp(p, cpf, pub, "--strict").returncode == 0
    # The attack: the denial and the whole unresolved saga go, an attestation "explains"
    # the gaps, and the decision is re-appended as an approval naming the same human.
    _forge(p, {3, 4, 5, 6}, [("APPROVAL_DECIDED", "pay-1", "pay-1/0", {"decision": "approve", "by": "cfo@corp"})])
    assert cli("verify", "--wal-path", str(p)).returncode == 0  # the chain alone is fooled...
    assert cli("certify", "--wal-path", str(p)).returncode == 0  # ...and so is certify
    for extra in ((), ("--strict",)):
        r = _verify_cp(p, cpf, pub, *extra, "--json")
        assert r.returncode == 1, r.stdout + r.stderr
        reason = json.loads(r.stdout)["reason"]
        assert "the checkpoint signed 8" in reason and "gaps at 3..6" in reason, reason
        assert "compaction attested at seq 9, written after the checkpoint" in reason, reason
    r = _verify_cp(p, cpf, pub)
    assert r.returncode == 1 and r.stdout.startswith("FAILED") and "pins every record it signed" in r.stdout


def test_deleting_the_checkpointed_head_behind_a_forged_attestation_is_caught(tmp_path: Path) -> None:
    p = tmp_path / "agent-saga.wal"
    _write_log(p)
    cpf, pub = _checkpoint(tmp_path, p)
    _forge(p, {7, 8}, [])  # the run ends at the head with its true hash: nothing to compare
    assert cli("verify", "--wal-path", str(p)).returncode == 0
    r = _verify_cp(p, cpf, pub, "--strict")
    assert r.returncode == 1 and "record seq 8, the checkpointed head, is missing" in r.stdout, r.stdout
    assert "compaction attested at seq 9" in r.stdout


def test_a_genuine_compaction_after_the_checkpoint_needs_a_new_checkpoint(tmp_path: Path) -> None:
    p = tmp_path / "agent-saga.wal"
    _write_log(p)
    cpf, pub = _checkpoint(tmp_path, p)

    async def compact() -> None:
        wal = FileWAL(p)
        await wal.compact()  # removes the resolved saga ok-1 (7..8: the checkpointed head)
        wal.close()

    asyncio.run(compact())
    r = _verify_cp(p, cpf, pub)
    assert r.returncode == 1 and "verify against a checkpoint taken after that compaction" in r.stdout
    newer = tmp_path / "cp-2.json"
    assert cli("checkpoint", "--wal-path", str(p), "--key", str(tmp_path / "cp.key"), "--out", str(newer)).returncode == 0
    assert _verify_cp(p, newer, pub).returncode == 0


def test_rewriting_records_before_a_signed_compaction_gap_is_caught(tmp_path: Path) -> None:
    """Records before a compaction gap are not linked to the ones after it (the gap's link
    is the attestation's): only the signed Merkle root pins them."""
    p = tmp_path / "agent-saga.wal"
    wal = FileWAL(p)
    wal.append("SAGA_STARTED", "pay-1", None, {"name": "pay"})  # 1
    wal.append("APPROVAL_DECIDED", "pay-1", "pay-1/0", {"decision": "deny", "by": "cfo@corp"})  # 2
    wal.append("SAGA_STARTED", "ok-1", None, {})  # 3
    wal.append("SAGA_COMPLETED", "ok-1", None, {})  # 4
    wal.append("SAGA_STARTED", "ok-2", None, {})  # 5
    wal.barrier_sync()
    wal.close()

    async def compact() -> None:
        w = FileWAL(p)
        await w.compact()  # 3..4 leave; the attestation is seq 6
        w.close()

    asyncio.run(compact())
    cpf, pub = _checkpoint(tmp_path, p)
    assert _verify_cp(p, cpf, pub).returncode == 0
    lines = _lines(p)
    first = decode_line(lines[0], "line 1")
    forged = Record("APPROVAL_DECIDED", "pay-1", "pay-1/0", {"decision": "approve", "by": "cfo@corp"}, 2, first.ts + 1)
    canonical = seal(forged, first.hash)
    p.write_bytes(lines[0] + encode_line(forged, canonical) + b"".join(lines[2:]))
    assert first.prev == GENESIS
    assert cli("verify", "--wal-path", str(p)).returncode == 0  # the chain cannot see it
    r = _verify_cp(p, cpf, pub, "--strict")
    assert r.returncode == 1 and "are not the ones signed: their Merkle root" in r.stdout, r.stdout
