"""Helpers for the tests of what recovery reads: orphans in any WAL, the real CLI and
recoveryd as processes, and a handler whose every call lands in a ledger file.

The handler module is written next to the test's files and imported by the recovery
process (``--import ledger_handlers``): each call of ``ledger.refund`` appends one JSON
line to ``$LEDGER_CALLS``, so a test counts real calls made by another process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_saga import BaseWAL, FileWAL, idempotency_key
from fixtures.cli import cli
from fixtures.polling import until

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "ledger.refund"

HANDLERS_SOURCE = '''
import json, os
from agent_saga import compensator

@compensator("ledger.refund")
def refund(charge_id, idempotency_key):
    with open(os.environ["LEDGER_CALLS"], "a") as f:
        f.write(json.dumps({"charge_id": charge_id, "key": idempotency_key}) + "\\n")
        f.flush()
        os.fsync(f.fileno())
'''


def comp(charge_id: str, handler: str = HANDLER) -> dict[str, Any]:
    return {"handler": handler, "kwargs": {"charge_id": charge_id}, "description": f"refund {charge_id}"}


def write_orphan(
    wal: BaseWAL, saga_id: str, charge_id: str = "ch_1", *, handler: str = HANDLER, sync: bool = True
) -> None:
    """What a dead agent leaves: one committed charge, and a lease that ran out at once
    (``sync=False``: not waited for; the caller's ``barrier_sync`` makes them durable)."""
    step = f"{saga_id}/0"
    wal.append("SAGA_STARTED", saga_id, None, {"name": "checkout", "tags": []})
    wal.append("SAGA_LEASE", saga_id, None, {"lease_seconds": 0.001})
    wal.append("STEP_INTENT", saga_id, step, {
        "tool": "pay.charge", "semantics": "COMPENSABLE", "policy_args": {"amount": 100},
        "idempotency_key": idempotency_key(saga_id, step, "forward"),
    })
    wal.append("STEP_COMMITTED", saga_id, step, {
        "tool": "pay.charge", "semantics": "COMPENSABLE", "compensation": comp(charge_id, handler),
    })
    if sync:
        wal.barrier_sync()


def orphan_file(path: Path, saga_id: str = "s1", charge_id: str = "ch_1", **kw: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    wal = FileWAL(path)
    try:
        write_orphan(wal, saga_id, charge_id, **kw)
    finally:
        wal.close()
    return path


class Env:
    """A directory with the handler module, the calls ledger and the environment to run
    recovery processes with."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        (tmp_path / "ledger_handlers.py").write_text(HANDLERS_SOURCE)
        self.calls_file = tmp_path / "handler-calls.jsonl"
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(tmp_path), str(ROOT / "runtime"), str(ROOT / "recoveryd"), self.env.get("PYTHONPATH", "")]
        )
        self.env["LEDGER_CALLS"] = str(self.calls_file)
        for var in ("AGENT_SAGA_FAULT", "AGENT_SAGA_WAL_KEY", "AGENT_SAGA_WAL_KEY_FILE"):
            self.env.pop(var, None)

    def handle_in_process(self, monkeypatch: Any) -> None:
        """Register ``ledger.refund`` in this process too (for a daemon run in the test),
        its calls landing in this test's ledger file."""
        monkeypatch.syspath_prepend(str(self.dir))
        monkeypatch.setenv("LEDGER_CALLS", str(self.calls_file))
        import importlib

        importlib.import_module("ledger_handlers")  # registers once per test session

    def calls(self) -> list[dict[str, Any]]:
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]

    def cli(self, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``agent-saga ARGS`` as the installed console script."""
        return cli(*args, env={**self.env, **(extra_env or {})}, timeout=120)

    def recover(self, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.cli("recover", *args, "--import", "ledger_handlers", "--lease-grace", "0", extra_env=extra_env)

    def recoveryd_once(self, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agent_saga_recoveryd", "--once", "--metrics-port", "-1",
             "--imports", "ledger_handlers", "--lease-grace", "0", *args],
            capture_output=True, text=True, timeout=120, env={**self.env, **(extra_env or {})},
        )


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def line_of(path: Path, type_: str) -> int:
    """The 0-based index of the first line of ``path`` holding a record of ``type_``."""
    return next(i for i, ln in enumerate(lines(path)) if json.loads(ln)["type"] == type_)


# ------------------------------------------------------------------ recoveryd as a process


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll ``cond`` until it returns something true; fail naming ``what`` at the deadline."""
    return until(what, cond, timeout=timeout, interval=0.05)


class Recoveryd:
    """``agent-saga-recoveryd`` as a real process serving /readyz and /metrics."""

    def __init__(self, env: Env, *args: str) -> None:
        n = time.monotonic_ns()
        port_file = env.dir / f"port-{n}"
        self.log_path = env.dir / f"recoveryd-{n}.log"
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent_saga_recoveryd", "--metrics-port", "0", "--bind", "127.0.0.1",
                 "--port-file", str(port_file), "--interval", "0.1", "--lease-grace", "0",
                 "--imports", "ledger_handlers", *args],
                env=env.env, stdout=out, stderr=subprocess.STDOUT, text=True,
            )
        self.port = int(wait_for(lambda: port_file.exists() and port_file.read_text(), "recoveryd's port file"))

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name: str, source: str | None = None) -> float | None:
        """The value of ``name`` (for ``source`` if given) on /metrics, or None if absent."""
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                if source is None or f'source="{source}"' in line:
                    return float(line.rsplit(" ", 1)[1])
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
