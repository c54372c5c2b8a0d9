"""An AgentLoop killed with SIGKILL mid-goal: the recovery daemon unwinds its side effects.

The loop's own records (LOOP_STEP) sit in the saga the daemon acts on: it must read them
(a record type it did not know would halt it) and compensate every tool call LIFO.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from agent_saga import RecoveryDaemon, saga_states
from agent_saga.wal.file import iter_file_records
from chaos_checks import chain_ok, future
from chaos_support import CHAOS_DIR, ROOT, subprocess_env


def test_a_killed_loop_is_unwound_by_recovery(tmp_path: Path) -> None:
    wal, notes = tmp_path / "loop.wal", tmp_path / "notes"
    notes.mkdir()
    done = subprocess.run(
        [sys.executable, str(CHAOS_DIR / "loop_worker.py"), str(wal), str(notes)],
        env=subprocess_env(PYTHONPATH=f"{CHAOS_DIR}:{ROOT / 'runtime'}"), capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert done.returncode == -9, done.stderr
    assert sorted(p.name for p in notes.iterdir()) == ["n1", "n2"]  # the goal's side effects, standing
    types = [r.type for _, r in iter_file_records(wal) if r.saga == "loop-1"]
    assert types.count("LOOP_STEP") == 2 and "LOOP_STOPPED" not in types

    async def sweep():
        daemon = RecoveryDaemon(wal, imports=["loop_worker"], clock=future)
        try:
            return await daemon.sweep()
        finally:
            await daemon.close()

    report = asyncio.run(sweep())
    assert report.error is None and report.recovered == 1 and report.escalations == 0, report.summary()
    assert list(notes.iterdir()) == []
    chain_ok(wal)
    assert saga_states(r for _, r in iter_file_records(wal))["loop-1"].status == "ROLLED_BACK"
