"""Helpers of the crash suite: forked workers, subprocess environments.

Workers are forked from a forkserver that has already imported agent-saga (a fresh
interpreter per run would cost ~100 ms; 200 randomised runs must fit in CI), so each run
is a real, separate process that dies without atexit, finally or loop shutdown.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHAOS_DIR = Path(__file__).resolve().parent
ROOT = CHAOS_DIR.parents[1]
PYTHON = sys.executable

_ctx: Any = None


def _context() -> Any:
    global _ctx
    if _ctx is None:
        _ctx = multiprocessing.get_context("forkserver")
        _ctx.set_forkserver_preload(["agent_saga", "agent_saga.recovery", "chaos_bank", "chaos_handlers", "chaos_worker"])
    return _ctx


@dataclass
class Run:
    """One worker run: where its files are and how it ended."""

    wal: Path
    bank: Path
    trace: Path
    exitcode: int | None = None

    def points(self) -> list[str]:
        return self.trace.read_text().split() if self.trace.exists() else []

    @property
    def killed(self) -> bool:
        return self.exitcode in (137, -9)


def run_worker(
    directory: Path,
    scenario: dict[str, Any],
    *,
    name: str = "run",
    timeout: float = 60,
    kill_after: float | None = None,
) -> Run:
    """Run one saga scenario in a forked worker (see chaos_worker) and wait for it to end;
    with ``kill_after``, SIGKILL it that many seconds after start wherever it is (inside
    the WAL's flusher, between two records: points no hook can name)."""
    import chaos_worker

    run = Run(directory / f"{name}.wal", directory / f"{name}.bank", directory / f"{name}.trace")
    p = _context().Process(
        target=chaos_worker.child_main,
        args=(str(run.wal), str(run.bank), str(run.trace), json.dumps(scenario)),
    )
    p.start()
    if kill_after is not None:
        p.join(kill_after)
        with contextlib.suppress(ProcessLookupError):  # it may have just ended by itself
            os.kill(p.pid, signal.SIGKILL)
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        raise AssertionError(f"worker {name} did not finish within {timeout}s: {scenario}")
    run.exitcode = p.exitcode
    return run


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a daemon / worker subprocess: the chaos modules importable."""
    env = dict(os.environ)
    paths = [str(CHAOS_DIR), str(ROOT / "runtime"), str(ROOT / "recoveryd")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("AGENT_SAGA_FAULT", None)
    env.update(extra)
    return env
