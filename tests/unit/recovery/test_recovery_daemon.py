"""RecoveryDaemon over a FileWAL left by a dead owner: resolve, skip, escalate, never guess."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import recovery_support as rs
from agent_saga import FileWAL, verify_records
from agent_saga.history import COMPENSATED, ESCALATED, ROLLBACK_PARTIAL, ROLLED_BACK, fold
from agent_saga.recovery import (
    FileClaimLock,
    FileLedger,
    LedgerEntry,
    LedgerKind,
    RecoveryDaemon,
    quarantine_saga,
)
from agent_saga.wal.file import iter_file_records
from recovery_support import FUTURE, desc, key, records, status, write_orphan


@pytest.fixture(autouse=True)
def _calls() -> Iterator[None]:
    rs.CALLS.clear()
    rs.FAIL_NEXT.clear()
    yield
    rs.CALLS.clear()


def daemon(path: Path, **kw) -> RecoveryDaemon:  # type: ignore[no-untyped-def]
    kw.setdefault("clock", FUTURE)
    return RecoveryDaemon(path, **kw)


async def test_an_orphan_is_rolled_back_once_with_the_engines_keys(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}, {"comp": desc("c1")}])
    for _ in range(4):  # running the daemon four times issues one refund per charge
        d = daemon(wal)
        rep = await d.sweep()
        await d.close()
    assert rs.CALLS == [(key("s", 1), {"charge_id": "c1"}), (key("s", 0), {"charge_id": "c0"})]
    saga = fold(records(wal))["s"]
    assert saga.status == ROLLED_BACK and {s.state for s in saga.steps.values()} == {COMPENSATED}
    assert verify_records(iter_file_records(wal)).ok  # the daemon continued the dead owner's chain
    assert rep.orphans == 0 and rep.in_flight == 0


async def test_a_live_lease_is_never_touched(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}], lease=60)
    d = RecoveryDaemon(wal, lease_grace=0)  # the real clock: the lease runs for a minute
    rep = await d.sweep()
    assert (rep.live, rep.orphans, rep.results) == (1, 0, ())
    later = RecoveryDaemon(wal, lease_grace=0, clock=lambda: time.time() + 61)
    assert (await later.sweep()).recovered == 1
    assert len(rs.CALLS) == 1


async def test_the_daemon_reads_lease_expiry_from_the_one_clock(tmp_path: Path) -> None:
    from agent_saga import ManualClock

    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}], lease=60)
    clock = ManualClock(start=time.time())  # the lease was written on the real clock just now
    d = RecoveryDaemon(wal, lease_grace=0, clock=clock)
    assert (await d.sweep()).live == 1 and rs.CALLS == []
    clock.advance(61)  # no sleeping: the test moves the daemon's time past the lease
    assert (await d.sweep()).recovered == 1
    await d.close()
    assert len(rs.CALLS) == 1


async def test_a_log_held_by_its_live_owner_is_left_alone(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}])
    owner = FileWAL(wal)  # the owner came back and holds the writer lock
    try:
        rep = await daemon(wal, writer_wait=0.05).sweep()
        assert [r.status for r in rep.results] == ["WRITER_BUSY"]
        assert rs.CALLS == [] and status(wal, "s") == "IN_FLIGHT"
    finally:
        owner.close()


async def test_what_cannot_be_undone_is_escalated_never_reported_clean(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [
        {"comp": desc("c0")},
        {"sem": "IRREVERSIBLE", "tool": "sms.send"},
        {"comp": desc("c2", handler="nobody.imported.this")},
        {"state": "INTENT"},
    ])
    d = daemon(wal)
    rep = await d.sweep()
    (res,) = rep.results
    assert res.status == "ROLLBACK_PARTIAL" and len(res.escalations) == 3
    assert rs.CALLS == [(key("s", 0), {"charge_id": "c0"})]  # the one it could undo
    saga = fold(records(wal))["s"]
    assert saga.status == ROLLBACK_PARTIAL
    assert [saga.steps[f"s/{i}"].state for i in (1, 2, 3)] == [ESCALATED] * 3
    queue = await d.ledger.escalations()
    assert {(e.step_id, e.kind) for e in queue} == {
        ("s/1", "IRREVERSIBLE"), ("s/2", "HANDLER_NOT_REGISTERED"), ("s/3", "OUTCOME_UNKNOWN"),
    }
    assert "import the module" in next(e.reason for e in queue if e.step_id == "s/2")
    await daemon(wal).sweep()  # idempotent: no second queue entry
    assert len(await d.ledger.escalations()) == 3


async def test_a_failing_compensation_is_escalated(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}])
    rs.FAIL_NEXT.append("card network down")
    d = daemon(wal)
    (res,) = (await d.sweep()).results
    assert res.status == "ROLLBACK_PARTIAL"
    (esc,) = await d.ledger.escalations()
    assert esc.kind == "COMPENSATION_FAILED" and "card network down" in esc.reason
    assert [r.type for r in records(wal)][-3:] == ["COMPENSATION_FAILED", "ESCALATED", "SAGA_ROLLBACK_PARTIAL"]


async def test_an_interrupted_rollback_is_finished_not_restarted(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}, {"comp": desc("c1"), "state": "STARTED"}, {"comp": desc("c2"), "state": "DONE"}])
    await daemon(wal).sweep()
    # s/2 was compensated before the crash: never called again. s/1 was in doubt: called
    # again under the same key (the handler's idempotency absorbs a repeat).
    assert rs.CALLS == [(key("s", 1), {"charge_id": "c1"}), (key("s", 0), {"charge_id": "c0"})]
    assert status(wal, "s") == ROLLED_BACK


async def test_the_ledger_skips_work_a_killed_daemon_finished_but_did_not_log(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}, {"comp": desc("c1"), "state": "STARTED"}])
    ledger = FileLedger(f"{wal}.recovery.jsonl")
    ledger.record_sync(LedgerEntry(LedgerKind.DONE, key("s", 1), "s", "s/1", "dead-daemon"))
    res = (await daemon(wal).sweep()).results[0]
    assert rs.CALLS == [(key("s", 0), {"charge_id": "c0"})]
    assert res.skipped_by_ledger == 1 and res.status == "ROLLED_BACK"
    done = [r for r in records(wal) if r.type == "COMPENSATION_DONE" and r.step == "s/1"]
    assert done[0].payload["via"] == "ledger"


async def test_a_claim_held_by_another_daemon_is_a_conflict_not_a_second_run(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}])
    other = FileClaimLock(f"{wal}.recovery-claims", owner="other")
    claim = await other.acquire("s", 30)
    assert claim is not None
    rep = await daemon(wal).sweep()
    assert rep.claim_conflicts == 1 and rs.CALLS == []
    await other.release(claim)
    assert (await daemon(wal).sweep()).recovered == 1


class _Frozen:
    def __init__(self, answer: bool | Exception) -> None:
        self.answer = answer

    def is_quarantined(self, saga_id: str) -> bool:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_quarantined_sagas_are_skipped_by_record_or_by_source(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "q", [{"comp": desc("c0")}])
    write_orphan(wal, "s", [{"comp": desc("c1")}])
    w = FileWAL(wal)
    quarantine_saga(w, "q", reason="suspected duplicate charges", by="soc@corp")
    w.close()
    rep = await daemon(wal, quarantine=_Frozen(RuntimeError("switch store unreachable"))).sweep()
    assert rep.quarantined == 1 and [r.status for r in rep.results] == ["QUARANTINED"]  # fails closed
    rep = await daemon(wal, quarantine=_Frozen(False)).sweep()
    assert rep.quarantined == 1 and rep.recovered == 1
    assert rs.CALLS == [(key("s", 0), {"charge_id": "c1"})] and status(wal, "q") == "IN_FLIGHT"


async def test_a_torn_final_line_neither_hides_records_nor_stops_recovery(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}])
    with open(wal, "ab") as f:
        f.write(b'{"v":1,"seq":99,"ts":1,"type":"STEP_INT')  # power cut mid-write
    rep = await daemon(wal).sweep()
    assert rep.recovered == 1 and len(rs.CALLS) == 1
    assert verify_records(iter_file_records(wal)).ok
    assert list(tmp_path.glob("a.wal.torn-*"))  # the fragment is kept aside, not deleted


async def test_an_unparseable_record_halts_the_sweep_before_any_action(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}])
    lines = wal.read_bytes().splitlines(keepends=True)
    lines.insert(2, b'{"v":1,"seq":3,"garbage\n')
    wal.write_bytes(b"".join(lines))
    d = daemon(wal)
    rep = await d.sweep()
    assert rep.halted and "line 3" in rep.halted and rs.CALLS == []
    assert d.halted is not None
    assert (await d.sweep()).halted  # sticky until a human rebuilds it


async def test_an_unreadable_journal_halts(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}])
    Path(f"{wal}.recovery.jsonl").write_text('{"v":1,"kind":"done","token":\n')
    rep = await daemon(wal).sweep()
    assert rep.halted and "journal" in rep.halted and rs.CALLS == []


async def test_an_encrypted_log_without_its_key_halts(tmp_path: Path) -> None:
    from agent_saga.audit.encryption import AESGCMEncryptor, EncryptedWAL, Keyring, new_wal_key

    keyring = Keyring.parse(new_wal_key("k1"))
    wal = tmp_path / "a.wal"
    w = EncryptedWAL(FileWAL(wal), AESGCMEncryptor(keyring))
    w.append("SAGA_STARTED", "s", None, {"name": None})
    w.append("STEP_INTENT", "s", "s/0", {"tool": "pay.charge", "semantics": "COMPENSABLE"})
    w.append("STEP_COMMITTED", "s", "s/0", {"compensation": desc("c0")})
    w.barrier_sync()
    w.close()
    rep = await daemon(wal).sweep()
    assert rep.halted and "k1" in rep.halted and rs.CALLS == []
    rep = await daemon(wal, encryptor=AESGCMEncryptor(keyring), ledger=FileLedger(tmp_path / "l2")).sweep()
    assert rep.recovered == 1 and rs.CALLS == [(key("s", 0), {"charge_id": "c0"})]


async def test_dry_run_plans_and_writes_nothing(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}, {"sem": "IRREVERSIBLE"}])
    before = wal.read_bytes()
    rep = await daemon(wal).sweep(dry_run=True)
    (res,) = rep.results
    assert res.status == "PLANNED" and res.plan is not None
    assert [s.action.value for s in res.plan.steps] == ["ESCALATE", "COMPENSATE"]
    assert wal.read_bytes() == before and rs.CALLS == []


async def test_drain_takes_no_new_claim(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}])
    d = daemon(wal)
    d.drain()
    rep = await d.sweep()
    assert rep.drained and rep.results == () and rs.CALLS == []


async def test_compact_keeps_unresolved_recent_and_escalated_sagas(tmp_path: Path) -> None:
    wal = tmp_path / "a.wal"
    now = [time.time() + 3600]
    write_orphan(wal, "old", [{"comp": desc("c0")}])
    write_orphan(wal, "esc", [{"sem": "IRREVERSIBLE"}])
    d = RecoveryDaemon(wal, clock=lambda: now[0])
    await d.sweep()
    write_orphan(wal, "open", [{"comp": desc("c1")}], lease=7200)  # still live at `now`
    now[0] += 600
    report = await d.compact(grace_seconds=300)
    left = {r.saga for r in records(wal)}
    assert "old" not in left and {"esc", "open"} <= left
    assert report.sagas_removed == 1
    assert verify_records(iter_file_records(wal)).ok
    assert (await d.sweep()).in_flight == 1  # reads the swapped file, finds the live one


async def test_a_partial_rollback_by_the_owner_still_reaches_the_human_queue(tmp_path: Path) -> None:
    from agent_saga import ActionSemantics, Compensation, RollbackIncomplete, saga_scope

    wal = tmp_path / "a.wal"
    w = FileWAL(wal)
    with pytest.raises(RollbackIncomplete):
        async with saga_scope(w, saga_id="s") as saga:
            await saga.execute("pay.charge", ActionSemantics.COMPENSABLE, forward=lambda: {"id": "c0"},
                               compensate=lambda r: Compensation(handler="nobody.imported.this", kwargs={}))
            raise RuntimeError("give up")
    w.close()
    d = daemon(wal)
    rep = await d.sweep()
    assert rep.results == ()  # resolved by its owner: nothing for the daemon to run
    (esc,) = await d.ledger.escalations()
    assert (esc.saga_id, esc.step_id, esc.kind) == ("s", "s/0", "ESCALATED_BEFORE")
    assert "not registered" in esc.reason
    await daemon(wal).sweep()
    assert len(await d.ledger.escalations()) == 1


def test_a_handler_module_not_on_the_path_is_named_with_how_to_put_it_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_saga.errors import ConfigurationError
    from agent_saga.recovery.daemon import import_modules

    with pytest.raises(ConfigurationError, match=r"'no_such_pkg_q7' is not on this process's path: install it in "
                                                 r"this environment, or add the directory that holds it to PYTHONPATH"):
        import_modules(["no_such_pkg_q7.handlers"])
    # A module that is there but needs something missing: its own error, not a path hint.
    (tmp_path / "needs_dep_q7.py").write_text("import no_such_dep_q7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigurationError, match=r"No module named 'no_such_dep_q7'\)") as info:
        import_modules(["needs_dep_q7"])
    assert "is not on this process's path" not in str(info.value)
