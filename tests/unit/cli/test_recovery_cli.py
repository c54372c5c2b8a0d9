"""``agent-saga recover``: one sweep from the command line, and the escalation queue."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import recovery_support as rs
from agent_saga.cli import main
from recovery_support import desc, status, write_orphan


@pytest.fixture(autouse=True)
def _calls() -> None:
    rs.CALLS.clear()

def test_dry_run_then_recover_then_nothing_left(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}], lease=0.05)
    args = ["recover", "--wal-path", str(wal), "--import", "recovery_support", "--lease-grace", "0"]

    time.sleep(0.1)  # the 50 ms lease runs out
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "PLANNED" in out and "COMPENSATE via test.recovery.refund" in out and rs.CALLS == []
    assert main(args) == 0
    assert "ROLLED_BACK" in capsys.readouterr().out and status(wal, "s") == "ROLLED_BACK"
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["orphans"] == 0
    assert len(rs.CALLS) == 1

def test_escalations_are_listed_and_resolved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"sem": "IRREVERSIBLE", "tool": "sms.send"}], lease=0.05)

    time.sleep(0.1)
    assert main(["recover", "--wal-path", str(wal), "--lease-grace", "0"]) == 1  # a human is needed
    capsys.readouterr()
    assert main(["recover", "--wal-path", str(wal), "--escalations"]) == 1
    out = capsys.readouterr().out
    assert "IRREVERSIBLE" in out and "sms.send" in out and "OPEN" in out
    esc_id = out.split()[0]
    assert main(["recover", "--wal-path", str(wal), "--resolve-escalation", esc_id, "--by", "ops@corp"]) == 0
    capsys.readouterr()
    assert main(["recover", "--wal-path", str(wal), "--escalations"]) == 0
    assert "no open escalations" in capsys.readouterr().out

def test_a_handler_module_that_does_not_import_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"comp": desc("c0")}])
    assert main(["recover", "--wal-path", str(wal), "--import", "no_such_handlers_module"]) == 2
    assert "no_such_handlers_module" in capsys.readouterr().err
