"""A switch file that is deleted, emptied, unreadable or damaged is a degraded store: the
last known halts stay in force for the grace window, then everything is refused; it never
means "no halts". Real files, the real CLI in a child process, time on a manual clock."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_saga.controls import FileSwitchStore, KillSwitch, ManualClock
from agent_saga.wal.file import FileWAL, iter_file_records
from fixtures.cli import cli_module as cli
from fixtures.steps import req

GRACE = 30.0


def halt_wires(path: Path) -> None:
    out = cli("halt", "--scope", "tool:wire.send", "--reason", "fraud pattern", "--by", "soc@corp",
              "--store", str(path))
    assert out.returncode == 0, out.stderr


def delete(path: Path) -> None:
    path.unlink()


def empty(path: Path) -> None:
    path.write_text("")


def damage(path: Path) -> None:
    path.write_text('{"v": 1, "levers": ')  # cut mid-write by someone else's editor


def unreadable(path: Path) -> None:
    path.unlink()
    path.mkdir()  # root reads any file: a directory in its place is unreadable to anyone


@pytest.mark.parametrize("loss", [delete, empty, damage, unreadable], ids=lambda f: f.__name__)
async def test_a_lost_switch_file_keeps_its_halts_for_the_grace_window_then_refuses_everything(
    tmp_path: Path, loss: Callable[[Path], None]
) -> None:
    path = tmp_path / "switch.json"
    halt_wires(path)
    clock = ManualClock()
    wal = FileWAL(tmp_path / "w.wal")
    ks = KillSwitch(FileSwitchStore(path, poll=0, warn=False, clock=clock, grace=GRACE), wal=wal, clock=clock)
    assert await ks.check(req("wire.send")) is not None
    assert await ks.check(req("crm.update")) is None

    loss(path)
    halted = await ks.check(req("wire.send"))
    assert halted is not None and "fraud pattern" in halted.reason, "a lost file lifted the halt"
    assert await ks.check(req("crm.update")) is None  # degraded: the last known levers rule
    assert ks.status()["posture"] == "degraded"

    clock.advance(GRACE + 1)
    closed = await ks.check(req("crm.update"))
    assert closed is not None and "grace window of 30s has passed" in closed.reason
    assert "refuses everything" in closed.reason and ks.status()["posture"] == "closed"

    wal.barrier_sync()
    types = [r.type for _, r in iter_file_records(wal.path)]
    assert "KILL_SWITCH_DEGRADED" in types and "KILL_SWITCH_FAILED_CLOSED" in types
    wal.close()


async def test_a_valid_file_back_restores_the_switch(tmp_path: Path) -> None:
    path = tmp_path / "switch.json"
    halt_wires(path)
    saved = path.read_bytes()
    clock = ManualClock()
    ks = KillSwitch(FileSwitchStore(path, poll=0, warn=False, clock=clock, grace=0), clock=clock)
    assert await ks.check(req("wire.send")) is not None
    delete(path)
    closed = await ks.check(req("crm.update"))
    assert closed is not None and "was deleted" in closed.reason  # grace=0: closed at once
    path.write_bytes(saved)  # restored from a backup
    assert await ks.check(req("crm.update")) is None
    assert await ks.check(req("wire.send")) is not None
    assert ks.status()["posture"] == "ok"


def test_a_process_started_after_the_deletion_refuses_at_once(tmp_path: Path) -> None:
    path = tmp_path / "switch.json"
    halt_wires(path)
    delete(path)
    script = textwrap.dedent(f"""
        import asyncio
        from agent_saga.controls import FileSwitchStore, KillSwitch
        from agent_saga.gates import StepRequest
        from agent_saga.semantics import ActionSemantics

        async def main():
            ks = KillSwitch(FileSwitchStore({str(path)!r}, warn=False))
            r = await ks.check(StepRequest("s", "s/0", "crm.update", ActionSemantics.COMPENSABLE, {{}}, ()))
            print("REFUSED" if r is not None else "ALLOWED", r.reason if r else "")

        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("REFUSED") and "no levers were ever read from it" in out.stdout


def test_the_cli_will_not_recreate_a_deleted_file_and_says_how_to_start_afresh(tmp_path: Path) -> None:
    path = tmp_path / "switch.json"
    halt_wires(path)
    delete(path)
    out = cli("halt", "--scope", "tool:crm.update", "--reason", "x", "--by", "soc@corp", "--store", str(path))
    assert out.returncode != 0 and "was deleted" in out.stderr and "Restore the file" in out.stderr
    assert not path.exists(), "a new file with one lever would have lifted the others"
    os.unlink(f"{path}.lock")  # the documented, deliberate fresh start
    halt_wires(path)
    assert path.exists()


async def test_a_switch_never_written_has_no_halts(tmp_path: Path) -> None:
    path = tmp_path / "nothing-yet" / "switch.json"
    ks = KillSwitch(FileSwitchStore(path, poll=0, warn=False))
    assert await ks.check(req("wire.send")) is None and ks.status()["posture"] == "ok"
    shutil.rmtree(tmp_path / "nothing-yet", ignore_errors=True)
