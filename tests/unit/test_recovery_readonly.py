"""Recovery on a location it cannot write: a read-only bind mount (EROFS even for root).

Every case: a clear error naming the path and the fix, no traceback; the library's
``sweep()`` reports instead of raising; nothing is called that could not be journaled;
once the location is writable again the next run finishes the job, once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga.recovery import FileClaimLock, FileLedger, RecoveryDaemon
from fixtures.readonly import make_writable, read_only_mount
from verified_support import Env, Recoveryd, orphan_file, wait_for


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_recover_on_a_read_only_log_names_the_path_and_the_fix(env: Env) -> None:
    orphan_file(env.dir / "data" / "a.wal")
    with read_only_mount(env.dir / "data") as ro:
        wal = ro / "a.wal"
        # Default claims and journal live beside the log: the claims directory fails first.
        r = env.recover("--wal-path", str(wal))
        out = r.stdout + r.stderr
        assert r.returncode == 1, out
        assert "Traceback" not in out and "OSError" not in out
        assert f"recovery cannot write its claims directory '{wal}.recovery-claims': Read-only file system" in r.stderr
        assert "--claims DIR" in r.stderr
        # Claims and journal elsewhere: then the log itself, which recovery must write.
        elsewhere = ["--claims", str(env.dir / "claims"), "--ledger", str(env.dir / "journal.jsonl")]
        r = env.recover("--wal-path", str(wal), *elsewhere)
        out = r.stdout + r.stderr
        assert r.returncode == 1, out
        assert "Traceback" not in out
        assert f"recovery cannot write the log '{wal}': Read-only file system" in r.stderr
        assert "must be writable where recovery runs" in r.stderr
        # Planning reads only: it works on a read-only copy.
        r = env.recover("--wal-path", str(wal), "--dry-run")
        assert r.returncode == 0 and "PLANNED" in r.stdout, r.stdout + r.stderr
        assert env.calls() == []
    r = env.recover("--wal-path", str(env.dir / "data" / "a.wal"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["charge_id"] for c in env.calls()] == ["ch_1"]


async def test_sweep_reports_an_unwritable_journal_and_calls_nothing_until_it_is_writable(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.handle_in_process(monkeypatch)
    wal = orphan_file(env.dir / "a.wal")
    with read_only_mount(env.dir / "journal") as ro:
        daemon = RecoveryDaemon(
            str(wal), ledger=FileLedger(ro / "journal.jsonl"), lock=FileClaimLock(env.dir / "claims"), lease_grace=0,
        )
        try:
            rep = await daemon.sweep()  # never raises for one saga's failure
            assert rep.halted is None
            assert rep.error is not None and f"recovery cannot write its journal '{ro / 'journal.jsonl'}'" in rep.error
            assert "Read-only file system" in rep.error and [r.status for r in rep.results] == ["FAILED"]
            assert env.calls() == []  # journal before call: nothing ran that was not journaled
            make_writable(ro)
            rep = await daemon.sweep()
            assert rep.ok and rep.recovered == 1, rep.error
        finally:
            await daemon.close()
    assert [c["charge_id"] for c in env.calls()] == ["ch_1"]


async def test_sweep_reports_an_unwritable_claims_directory(env: Env) -> None:
    wal = orphan_file(env.dir / "a.wal")
    with read_only_mount(env.dir / "ro") as ro:
        daemon = RecoveryDaemon(str(wal), lock=FileClaimLock(ro / "claims"), lease_grace=0)
        try:
            rep = await daemon.sweep()
            assert rep.halted is None and rep.error is not None
            assert f"recovery cannot write its claims directory '{ro / 'claims'}': Read-only file system" in rep.error
            assert daemon.halted is None  # not sticky: the next sweep tries again
        finally:
            await daemon.close()
    assert env.calls() == []


def test_recoveryd_stays_up_unready_on_unwritable_claims_then_uses_the_claims_it_is_given(env: Env) -> None:
    wal = orphan_file(env.dir / "logs" / "a.wal")
    with read_only_mount(env.dir / "ro") as ro:
        d = Recoveryd(env, "--wal-path", str(wal), "--claims", str(ro / "claims"))
        try:
            status, body = wait_for(lambda: (s := d.get("/readyz"))[0] == 503 and "last sweep stopped" in s[1] and s,
                                    "recoveryd unready with the reason")
            assert f"recovery cannot write its claims directory '{ro / 'claims'}': Read-only file system" in body
            assert d.get("/livez")[0] == 200 and d.alive()
            assert d.metric("agent_saga_recovery_sweep_stopped") == 1
            assert d.metric("agent_saga_recovery_halted") == 0
            assert env.calls() == []
        finally:
            d.stop()
        assert d.proc.returncode == 0, d.output()
    claims = env.dir / "claims-elsewhere"
    d = Recoveryd(env, "--wal-path", str(wal), "--claims", str(claims))
    try:
        wait_for(lambda: env.calls(), "the refund")
        wait_for(lambda: d.get("/readyz")[0] == 200, "ready")
        assert d.metric("agent_saga_recovery_sweep_stopped") == 0
    finally:
        d.stop()
    assert [c["charge_id"] for c in env.calls()] == ["ch_1"]
    assert claims.is_dir() and not (env.dir / "logs" / "a.wal.recovery-claims").exists()


def test_recoveryd_takes_its_claims_and_journal_location_by_flag_or_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent_saga_recoveryd.config import parse_args

    c = parse_args(["--wal-path", "/data/a.wal", "--claims", "/var/claims", "--ledger", "/var/j.jsonl"])
    assert (c.claims, c.ledger) == ("/var/claims", "/var/j.jsonl")
    monkeypatch.setenv("AGENT_SAGA_RECOVERYD_CLAIMS", "/env/claims")
    monkeypatch.setenv("AGENT_SAGA_RECOVERYD_LEDGER", "/env/j.jsonl")
    c = parse_args(["--wal-path", "/data/a.wal"])
    assert (c.claims, c.ledger) == ("/env/claims", "/env/j.jsonl")
    with pytest.raises(SystemExit):  # claims in Redis and in a directory at once: refused
        parse_args(["--wal-path", "/data/a.wal", "--redis-url", "redis://r:6379/0"])
