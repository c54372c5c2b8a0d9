"""Recovery acts only on records it has verified (FileWAL): each failure path run through
the real ``agent-saga recover`` process over a real file, counting real handler calls."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from agent_saga import FileWAL
from agent_saga.recovery import RecoveryDaemon
from verified_support import Env, comp, line_of, lines, orphan_file, write_orphan


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_an_untampered_orphan_is_refunded_once(env: Env) -> None:
    # The control for every test below: the same log, unedited, is acted on.
    wal = orphan_file(env.dir / "a.wal")
    r = env.recover("--wal-path", str(wal))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["charge_id"] for c in env.calls()] == ["ch_1"]


def test_edited_kwargs_halt_recovery_naming_the_record_and_nothing_is_called(env: Env) -> None:
    wal = orphan_file(env.dir / "a.wal")
    wal.write_bytes(wal.read_bytes().replace(b'"charge_id":"ch_1"', b'"charge_id":"ch_ATTACKER"'))
    assert env.cli("verify", "--wal-path", str(wal)).returncode == 1

    for args in (["--dry-run"], []):
        r = env.recover("--wal-path", str(wal), *args)
        assert r.returncode == 2, r.stdout + r.stderr
        out = r.stdout + r.stderr
        assert "HALTED" in out and "line 4" in out and "type STEP_COMMITTED" in out
        assert "payload does not match its digest" in out
        assert "Traceback" not in out
    assert env.calls() == []
    assert not (env.dir / "a.wal.recovery.jsonl").exists()  # nothing journaled either


def test_reordered_records_halt_recovery(env: Env) -> None:
    wal = orphan_file(env.dir / "a.wal")
    ls = lines(wal)
    i = line_of(wal, "STEP_INTENT")
    ls[i], ls[i + 1] = ls[i + 1], ls[i]  # the commit now comes before its intent
    wal.write_bytes(b"".join(ls))
    r = env.recover("--wal-path", str(wal))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "repeats or goes backwards" in r.stdout or "jumps" in r.stdout, r.stdout
    assert env.calls() == []


def test_a_deleted_record_is_a_gap_no_attestation_explains_and_halts(env: Env) -> None:
    wal = orphan_file(env.dir / "a.wal")
    ls = lines(wal)
    del ls[line_of(wal, "SAGA_LEASE")]  # a middle record
    wal.write_bytes(b"".join(ls))
    r = env.recover("--wal-path", str(wal))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "records 2 are missing and no compaction attestation accounts for them" in r.stdout, r.stdout
    assert env.calls() == []


def test_a_duplicated_record_halts_recovery(env: Env) -> None:
    wal = orphan_file(env.dir / "a.wal")
    wal.write_bytes(wal.read_bytes() + lines(wal)[line_of(wal, "STEP_COMMITTED")])
    r = env.recover("--wal-path", str(wal))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "sequence 4 repeats or goes backwards" in r.stdout, r.stdout
    assert env.calls() == []


async def test_a_record_appended_out_of_order_after_a_sweep_halts_instead_of_being_dropped(env: Env) -> None:
    # A live saga is read by a first sweep; then a copy of an old record (an earlier seq)
    # is appended. It used to be skipped without a word; now it stops the daemon.
    wal_path = env.dir / "a.wal"
    wal = FileWAL(wal_path)
    wal.append("SAGA_STARTED", "live", None, {"name": None, "tags": []})
    wal.append("SAGA_LEASE", "live", None, {"lease_seconds": 3600})
    wal.barrier_sync()
    wal.close()
    daemon = RecoveryDaemon(str(wal_path), lease_grace=0)
    try:
        first = await daemon.sweep()
        assert first.ok and first.live == 1
        wal_path.write_bytes(wal_path.read_bytes() + lines(wal_path)[0])
        second = await daemon.sweep()
        assert second.halted is not None and "sequence 1 repeats or goes backwards" in second.halted
        assert daemon.halted is not None
    finally:
        await daemon.close()


async def test_a_saga_whose_end_was_compacted_away_between_sweeps_is_not_rolled_back(env: Env, tmp_path: Path) -> None:
    # Sweep 1 reads saga "done" while its owner is alive. The owner then finishes it and
    # compacts the log, which removes every record of "done". The next sweep must not see
    # "done" as an orphan (it used to: its end was never read): records left the log, so
    # the daemon reads it whole again.
    wal_path = tmp_path / "a.wal"
    wal = FileWAL(wal_path)
    wal.append("SAGA_STARTED", "done", None, {"name": None, "tags": []})
    wal.append("SAGA_LEASE", "done", None, {"lease_seconds": 60})
    wal.append("STEP_INTENT", "done", "done/0", {"tool": "pay.charge", "semantics": "COMPENSABLE"})
    wal.append("STEP_COMMITTED", "done", "done/0", {"compensation": comp("ch_done")})
    wal.barrier_sync()
    wal.close()
    now = [time.time()]
    daemon = RecoveryDaemon(str(wal_path), lease_grace=0, clock=lambda: now[0])
    try:
        first = await daemon.sweep()
        assert first.ok and first.live == 1 and first.orphans == 0
        owner = FileWAL(wal_path)
        owner.append("SAGA_COMPLETED", "done", None, {"steps": 1})
        owner.barrier_sync()
        report = await owner.compact()
        owner.close()
        assert report.sagas_removed == 1
        now[0] += 3600  # every lease has run out
        second = await daemon.sweep()
        assert second.ok, second.halted or second.error
        assert second.in_flight == 0 and second.orphans == 0 and not second.results
    finally:
        await daemon.close()
    assert env.calls() == []


async def test_a_log_truncated_after_recovery_read_it_halts(tmp_path: Path) -> None:
    wal_path = tmp_path / "a.wal"
    wal = FileWAL(wal_path)
    for i in range(3):
        wal.append("SAGA_STARTED", f"s{i}", None, {"name": None, "tags": []})
        wal.append("SAGA_COMPLETED", f"s{i}", None, {"steps": 0})
    wal.barrier_sync()
    wal.close()
    older = tmp_path / "older.wal"
    older.write_bytes(b"".join(lines(wal_path)[:2]))  # an older copy: s0 only
    daemon = RecoveryDaemon(str(wal_path), lease_grace=0)
    try:
        assert (await daemon.sweep()).ok
        shutil.copy(older, tmp_path / "swap")
        (tmp_path / "swap").replace(wal_path)  # the log is replaced by its older copy
        rep = await daemon.sweep()
        assert rep.halted is not None
        assert "now ends at seq 2, but recovery already verified it up to seq 6" in rep.halted
    finally:
        await daemon.close()


async def test_a_log_replaced_by_another_valid_chain_halts(tmp_path: Path) -> None:
    wal_path = tmp_path / "a.wal"
    for path, name in ((wal_path, "real"), (tmp_path / "other.wal", "forged")):
        wal = FileWAL(path)
        wal.append("SAGA_STARTED", name, None, {"name": None, "tags": []})
        wal.append("SAGA_COMPLETED", name, None, {"steps": 0})
        wal.barrier_sync()
        wal.close()
    daemon = RecoveryDaemon(str(wal_path), lease_grace=0)
    try:
        assert (await daemon.sweep()).ok
        (tmp_path / "other.wal").replace(wal_path)  # a new inode: read whole, anchored to the old head
        rep = await daemon.sweep()
        assert rep.halted is not None and "is not the one recovery verified before" in rep.halted
    finally:
        await daemon.close()


# ------------------------------------------------------------------ unknown record types


def _with_unknown(path: Path, saga_id: str) -> None:
    wal = FileWAL(path)
    wal.append("STEP_TELEPORTED", saga_id, f"{saga_id}/0", {"where": "mars"})  # a newer writer's type
    wal.barrier_sync()
    wal.close()


def test_an_unknown_record_type_in_an_orphan_halts_recovery_naming_it(env: Env) -> None:
    wal = orphan_file(env.dir / "a.wal")
    _with_unknown(wal, "s1")
    for args in (["--dry-run"], []):
        r = env.recover("--wal-path", str(wal), *args)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "record type 'STEP_TELEPORTED' is not one this version of agent-saga knows" in r.stdout
        assert "seq 5" in r.stdout and "Upgrade agent-saga" in r.stdout
    assert env.calls() == []


def test_an_unknown_record_type_in_a_finished_saga_does_not_stop_recovery_of_others(env: Env) -> None:
    wal_path = env.dir / "a.wal"
    wal = FileWAL(wal_path)
    wal.append("SAGA_STARTED", "old", None, {"name": None, "tags": []})
    wal.append("STEP_TELEPORTED", "old", "old/0", {"where": "mars"})
    wal.append("SAGA_COMPLETED", "old", None, {"steps": 1})
    write_orphan(wal, "s1")
    wal.close()
    r = env.recover("--wal-path", str(wal_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["charge_id"] for c in env.calls()] == ["ch_1"]
    # Not ignored in silence: the report and the log say the log holds a type it cannot read.
    assert "records of types this version does not know (STEP_TELEPORTED)" in r.stdout
    assert "STEP_TELEPORTED, which this version of agent-saga does not know" in r.stderr


def test_verify_inspect_and_certify_report_unknown_record_types(env: Env) -> None:
    wal = orphan_file(env.dir / "a.wal")
    _with_unknown(wal, "s1")

    r = env.cli("verify", "--wal-path", str(wal))
    assert r.returncode == 0, r.stdout  # the chain is intact: unknown is not broken
    assert "STEP_TELEPORTED x1 (first at" in r.stdout and "line 5" in r.stdout and "saga s1" in r.stdout
    r = env.cli("verify", "--wal-path", str(wal), "--json")
    (entry,) = json.loads(r.stdout)["unknown_types"]
    assert entry["type"] == "STEP_TELEPORTED" and entry["count"] == 1 and entry["sagas"] == ["s1"]

    r = env.cli("inspect", "--wal-path", str(wal))
    assert r.returncode == 0
    assert "UNKNOWN RECORD TYPES: STEP_TELEPORTED (seq 5)" in r.stdout
    assert "does not know (STEP_TELEPORTED)" in r.stdout
    r = env.cli("inspect", "--wal-path", str(wal), "--json")
    (saga,) = json.loads(r.stdout)
    assert saga["unknown_records"] == [{"seq": 5, "type": "STEP_TELEPORTED", "step": "s1/0"}]

    r = env.cli("certify", "--wal-path", str(wal))
    assert r.returncode == 1
    assert "a record of type STEP_TELEPORTED (seq 5) is not one this version of agent-saga knows" in r.stdout
