"""``agent-saga halt | quarantine | resume | status`` over a file store, in this process
and from a real child process: an agent watching the same store obeys."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_saga.cli import main
from agent_saga.controls import FileSwitchStore, KillSwitch, Lever
from agent_saga.wal.file import iter_file_records
from fixtures.steps import req


def agent_switch(path: Path) -> KillSwitch:
    return KillSwitch(FileSwitchStore(path, poll=0, warn=False))


async def test_halt_and_resume_from_another_process_reach_the_agent(tmp_path: Path):
    path = tmp_path / "switch.json"
    ks = agent_switch(path)
    assert await ks.check(req("wire.send")) is None
    out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "halt", "--scope", "tool:wire.send",
                          "--reason", "fraud pattern", "--by", "soc@corp", "--ttl", "10m", "--store", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "engaged HALT tool:wire.send by soc@corp" in out.stdout and "file store reaches only" in out.stdout
    refusal = await ks.check(req("wire.send"))
    assert refusal is not None and "fraud pattern" in refusal.reason
    assert refusal.detail["lever"]["ttl"] == 600
    out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "resume", "--scope", "tool:wire.send",
                          "--by", "soc@corp", "--store", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert await ks.check(req("wire.send")) is None


async def test_drain_quarantine_status_and_the_wal_record(tmp_path: Path, capsys):
    path, wal = str(tmp_path / "switch.json"), str(tmp_path / "cli.wal")
    assert main(["halt", "--drain", "--reason", "deploying", "--by", "ci@corp", "--ttl", "600", "--store", path,
                 "--wal-path", wal]) == 0
    assert main(["quarantine", "saga-8f3c", "--reason", "suspected duplicate charges", "--by", "soc@corp",
                 "--store", path]) == 0
    capsys.readouterr()
    assert main(["status", "--switch-store", path, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)["kill_switch"]
    assert sorted((lv["action"], lv["scope"]) for lv in status["levers"]) == [
        ("Drain", "global"), ("Quarantine", "saga:saga-8f3c")]
    ks = agent_switch(Path(path))
    assert await ks.admission("new-saga", ()) is not None
    refusal = await ks.check(req("stripe.charge", saga="saga-8f3c"))
    assert refusal is not None and refusal.detail["quarantined"] is True
    (rec,) = [item for _, item in iter_file_records(wal)]
    assert rec.type == "KILL_SWITCH_ENGAGED" and rec.saga == "wal"
    assert rec.payload["lever"]["requestedBy"] == "ci@corp" and rec.payload["lever"]["reason"] == "deploying"
    assert main(["status", "--switch-store", path]) == 0
    text = capsys.readouterr().out
    assert "KILL SWITCH" in text and "DRAIN global by ci@corp" in text


def test_resume_leaves_operator_levers_and_says_how_to_lift_them(tmp_path: Path, capsys):
    path = tmp_path / "switch.json"
    store = FileSwitchStore(path, warn=False)
    store.engage(Lever.new("Halt", "tool:wire.send", reason="from a KillSwitch resource", by="soc@corp", now=0,
                           lever_id="payments/stop-wires"))
    assert main(["resume", "--scope", "tool:wire.send", "--by", "soc@corp", "--store", str(path)]) == 1
    out = capsys.readouterr().out
    assert "kubectl delete killswitch -n payments stop-wires" in out
    assert [lv.id for lv in store.levers()] == ["payments/stop-wires"]
    assert main(["resume", "--id", "payments/stop-wires", "--by", "soc@corp", "--store", str(path)]) == 0
    assert store.levers() == []


def test_the_cli_refuses_bad_levers(tmp_path: Path, capsys):
    path = str(tmp_path / "s.json")
    assert main(["halt", "--drain", "--scope", "tool:x", "--reason", "r", "--by", "b", "--store", path]) == 2
    assert "DRAIN starts no new sagas" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["halt", "--scope", "global", "--by", "b", "--store", path])  # --reason is required
    with pytest.raises(SystemExit):
        main(["halt", "--reason", "r", "--by", "b", "--ttl", "soon", "--store", path])


async def test_two_halts_on_one_scope_are_two_levers_resume_lifts_both_and_a_secret_reason_is_redacted(
        tmp_path: Path, capsys):
    path = str(tmp_path / "switch.json")
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    for who in ("soc@corp", "risk@corp"):
        assert main(["halt", "--scope", "tool:wire.send", "--reason", f"leaked {token}", "--by", who,
                     "--store", path, "--json"]) == 0
    ids = [json.loads(line)["engaged"]["id"] for line in capsys.readouterr().out.splitlines()]
    assert len(set(ids)) == 2 and all(i.startswith("cli/halt-") for i in ids), "one lever each, neither replaced"
    text = Path(path).read_text()
    assert token not in text and "leaked [REDACTED]" in text
    refusal = await agent_switch(Path(path)).check(req("wire.send"))
    assert refusal is not None and token not in refusal.reason
    assert main(["resume", "--scope", "tool:wire.send", "--by", "soc@corp", "--store", path, "--json"]) == 0
    assert sorted(lv["id"] for lv in json.loads(capsys.readouterr().out)["lifted"]) == sorted(ids)
    assert await agent_switch(Path(path)).check(req("wire.send")) is None
