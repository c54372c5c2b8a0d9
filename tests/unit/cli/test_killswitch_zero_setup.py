"""The zero-setup kill switch: with no store configured, ``agent-saga halt`` and every
agent on the host share ``agent-saga.switch.json`` beside the default WAL, so the
incident commands work on one machine out of the box (real CLI and agent processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga.cli import main
from agent_saga.controls import PreFlightGate, get_kill_switch, set_kill_switch
from agent_saga.controls.killswitch import FileSwitchStore, default_switch_path, is_zero_setup
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from agent_saga.wal import set_default_wal
from agent_saga.wal.file import iter_file_records
from fixtures.cli import cli_module

UNSET = ("AGENT_SAGA_SWITCH_STORE", "AGENT_SAGA_REDIS_URL", "AGENT_SAGA_WAL_PATH", "AGENT_SAGA_WAL_STREAM")
HALT = ["halt", "--scope", "tool:wire.send", "--reason", "fraud pattern", "--by", "soc@corp"]


def bare_env() -> dict[str, str]:
    """This process's environment with no kill switch store, policy plane or WAL set."""
    return {k: v for k, v in os.environ.items() if k not in UNSET}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return cli_module(*args, cwd=cwd, env=bare_env())


@pytest.fixture
def unconfigured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process with nothing configured, in an empty directory."""
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    prev = set_kill_switch(None)
    prev_wal = set_default_wal(None)  # the switch records what it sees in the process-wide WAL
    try:
        yield tmp_path
    finally:
        set_kill_switch(prev)
        made = set_default_wal(prev_wal)
        if made is not None:
            made.close()


def test_the_default_path_sits_beside_the_default_wal() -> None:
    assert default_switch_path({}) == "agent-saga.switch.json"
    assert default_switch_path({"AGENT_SAGA_WAL_PATH": "/var/lib/agent/run.wal"}) == \
        "/var/lib/agent/agent-saga.switch.json"


async def test_with_nothing_configured_the_gate_consults_the_file_the_cli_halts(
        unconfigured: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    switch = get_kill_switch()
    assert switch is not None and is_zero_setup(switch)
    assert isinstance(switch.store, FileSwitchStore) and switch.store.path == "agent-saga.switch.json"
    assert "THIS HOST ONLY" in caplog.text
    req = StepRequest("s-1", "s-1/0", "wire.send", ActionSemantics.COMPENSABLE, {}, ())
    assert (await PreFlightGate(default_rules=()).decide(req)).allowed
    assert main(HALT) == 0
    err = capsys.readouterr().err
    assert "no kill switch store configured" in err and "THIS HOST ONLY" in err
    assert (unconfigured / "agent-saga.switch.json").exists()
    switch.store.start()  # re-read now rather than at the next poll
    decision = await PreFlightGate(default_rules=()).decide(req)
    assert not decision.allowed and decision.stage == "kill_switch" and "fraud pattern" in decision.reason


def test_a_policy_plane_keeps_its_own_store(unconfigured: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With AGENT_SAGA_REDIS_URL set, the plane's connection sets its Redis switch: no file default."""
    monkeypatch.setenv("AGENT_SAGA_REDIS_URL", "redis://127.0.0.1:1/0")
    from agent_saga.controls.killswitch import _default

    set_kill_switch(None)
    monkeypatch.setattr(_default, "_resolved", False)
    assert get_kill_switch() is None


def test_the_incident_commands_work_out_of_the_box(tmp_path: Path) -> None:
    """halt / status / resume, as an operator types them, with nothing configured."""
    out = cli(*HALT, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "engaged HALT tool:wire.send by soc@corp" in out.stdout
    assert "THIS HOST ONLY" in out.stderr
    doc = json.loads((tmp_path / "agent-saga.switch.json").read_text())
    assert len(doc["levers"]) == 1
    out = cli("status", cwd=tmp_path)
    assert "HALT tool:wire.send by soc@corp" in out.stdout and "zero-setup default" in out.stdout
    out = cli("resume", "--scope", "tool:wire.send", "--by", "soc@corp", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "agent-saga.switch.json").read_text())["levers"] == {}


AGENT = textwrap.dedent('''
    import asyncio, sys
    from agent_saga import ActionSemantics, saga_scope
    from agent_saga.errors import GateBlocked

    async def main():
        async with saga_scope(name="wires") as saga:   # no gate, no store: the zero-setup switch
            n = 0
            while True:
                try:
                    await saga.execute("wire.send", ActionSemantics.REVERSIBLE, forward=lambda: n)
                except GateBlocked as exc:
                    print("REFUSED", exc.control, exc.reason, flush=True)
                    return
                n += 1
                print("sent", n, flush=True)
                await asyncio.sleep(0.02)

    try:
        asyncio.run(main())
    except GateBlocked:
        pass
''')


def test_a_halt_from_the_cli_stops_a_running_agent_in_another_process(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", AGENT], cwd=tmp_path, env=bare_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as agent:
        assert agent.stdout is not None and agent.stderr is not None
        try:
            first = agent.stdout.readline()
            assert first.startswith("sent"), first
            out = cli(*HALT, cwd=tmp_path)
            assert out.returncode == 0, out.stderr
            deadline = time.monotonic() + 60
            line = ""
            while time.monotonic() < deadline:
                line = agent.stdout.readline()
                if not line.startswith("sent"):
                    break
            assert line.startswith("REFUSED kill_switch") and "fraud pattern" in line, line
            assert agent.wait(timeout=60) == 0
            assert "THIS HOST ONLY" in agent.stderr.read()
            seen = [r for _, r in iter_file_records(tmp_path / "agent-saga.wal") if r.type == "KILL_SWITCH_ENGAGED"]
            assert [r.payload["lever"]["reason"] for r in seen] == ["fraud pattern"]  # who/why/when, in its WAL
        finally:
            if agent.poll() is None:
                agent.kill()


async def test_a_quarantine_on_the_zero_setup_switch_freezes_a_running_saga(unconfigured: Path) -> None:
    """A saga opened while the switch was idle has no gate; a QUARANTINE engaged on the
    file afterwards still freezes it instead of rolling it back, and the gate it adopts
    mid-saga hears how its steps end."""
    from agent_saga import Compensation, FileWAL, saga_scope
    from agent_saga.errors import SagaQuarantined

    switch = get_kill_switch()
    assert switch is not None and is_zero_setup(switch) and switch.idle()
    undone: list[str] = []
    wal = FileWAL(str(unconfigured / "run.wal"))
    with pytest.raises(SagaQuarantined, match="NOT rolled back"):
        async with saga_scope(wal, name="pay") as saga:
            await saga.execute("crm.note", ActionSemantics.REVERSIBLE, forward=lambda: "n1",
                               compensate=lambda r: Compensation(fn=lambda **kw: undone.append(r),
                                                                 handler="crm.unnote", kwargs={}))
            assert saga.gate is None  # idle: the zero-dependency path
            switch.halt("tool:wire.send", reason="fraud pattern", by="soc@corp")
            switch.store.start()  # re-read now rather than at the next poll
            await saga.execute("crm.tag", ActionSemantics.REVERSIBLE, forward=lambda: "t1")
            assert saga.gate is not None and saga._on_outcome == getattr(saga.gate, "on_outcome", None)
            switch.quarantine(saga.saga_id, reason="suspected duplicate", by="soc@corp")
            switch.store.start()
            raise RuntimeError("the agent failed")
    assert saga.status == "QUARANTINED" and undone == []
    wal.close()
