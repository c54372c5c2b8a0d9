"""agent-saga-recoveryd as a process: health and metrics endpoints, SIGTERM drains."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from agent_saga import FileWAL, idempotency_key
from agent_saga.history import fold
from agent_saga.wal.file import iter_file_records

ROOT = Path(__file__).resolve().parents[2]
CHAOS = ROOT / "tests" / "chaos"
sys.path.insert(0, str(CHAOS))

from chaos_bank import Bank  # noqa: E402
from fixtures.polling import until  # noqa: E402


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(CHAOS), str(ROOT / "runtime"), str(ROOT / "recoveryd")])
    e.pop("AGENT_SAGA_FAULT", None)
    return e


def orphan(wal_path: Path, bank: Bank, saga_id: str, handler: str, extra: dict[str, str] | None = None) -> None:
    """The log a dead agent leaves: one committed charge, a lease that already ran out."""
    wal = FileWAL(wal_path)
    step = f"{saga_id}/0"
    fwd = idempotency_key(saga_id, step, "forward")
    charge = bank.charge(saga_id, 100, fwd)
    wal.append("SAGA_STARTED", saga_id, None, {"name": None, "tags": []})
    wal.append("SAGA_LEASE", saga_id, None, {"lease_seconds": 0.05})
    wal.append("STEP_INTENT", saga_id, step, {"tool": "chaos.charge", "semantics": "COMPENSABLE", "idempotency_key": fwd})
    wal.append("STEP_COMMITTED", saga_id, step, {"compensation": {
        "handler": handler, "kwargs": {"bank": bank.path, "charge_id": charge["id"], **(extra or {})}, "description": ""}})
    wal.barrier_sync()
    wal.close()


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    """Start recoveryd; its output goes to ``recoveryd-<n>.log`` in ``tmp_path``."""
    n = time.monotonic_ns()
    port_file = tmp_path / f"port-{n}"
    with open(tmp_path / f"recoveryd-{n}.log", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent_saga_recoveryd", "--metrics-port", "0", "--bind", "127.0.0.1",
             "--port-file", str(port_file), "--interval", "0.1", "--lease-grace", "0", *args],
            env=env(), stdout=out, stderr=subprocess.STDOUT, text=True,
        )
    port = until("the port file", lambda: port_file.exists() and int(port_file.read_text()))
    return proc, port


def metric(body: str, name: str) -> float:
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def require_prometheus() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        pytest.fail("prometheus-client is missing: pip install -e '.[dev]' (or '.[recoveryd]')", pytrace=False)


def test_metrics_health_and_recovery(tmp_path: Path, fresh_redis) -> None:  # type: ignore[no-untyped-def]
    require_prometheus()
    wal, bank = tmp_path / "a.wal", Bank(tmp_path / "bank")
    orphan(wal, bank, "s1", "chaos.refund")
    orphan(wal, bank, "s2", "chaos.not_imported")  # no handler: escalated to a human
    proc, port = start(tmp_path, "--wal-path", str(wal), "--imports", "chaos_handlers", "--redis-url", fresh_redis.url)
    try:
        assert get(port, "/livez") == (200, "alive\n")
        until("ready", lambda: get(port, "/readyz")[0] == 200)
        body = until("a recovery in the metrics", lambda: (b := get(port, "/metrics")[1]) and metric(b, "agent_saga_recovery_sagas_recovered_total") >= 1 and b)
        for name in ("agent_saga_recovery_claim_conflicts_total", "agent_saga_recovery_sweep_duration_seconds_bucket",
                     "agent_saga_recovery_oldest_orphan_age_seconds", "agent_saga_recovery_sagas_escalated_total",
                     "agent_saga_recovery_halted"):
            assert name in body, name
        assert metric(body, "agent_saga_recovery_ready") == 1
        assert metric(body, "agent_saga_recovery_claim_ttl_seconds") == 30
        # The escalation waits in the ledger for a human: counted under its log, until resolved.
        body = until("the open escalation counted", lambda: (b := get(port, "/metrics")[1])
                     and metric(b, "agent_saga_recovery_escalations_open") == 1 and b)
        assert f'agent_saga_recovery_escalations_open{{source="{wal}"}} 1.0' in body
        refunded, escalated = sorted(bank.state().values(), key=lambda c: len(c.applied), reverse=True)
        assert len(refunded.applied) == len(refunded.attempts) == 1
        assert not escalated.applied and not escalated.attempts
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_finishes_the_claim_in_hand_and_takes_no_new_one(tmp_path: Path, fresh_redis) -> None:  # type: ignore[no-untyped-def]
    wal, bank, gate = tmp_path / "a.wal", Bank(tmp_path / "bank"), tmp_path / "gate"
    for i in range(3):
        orphan(wal, bank, f"s{i}", "chaos.gated_refund", {"gate": str(gate)})
    proc, port = start(tmp_path, "--wal-path", str(wal), "--imports", "chaos_handlers",
                       "--redis-url", fresh_redis.url, "--concurrency", "1")
    try:
        until("a compensation in hand", lambda: Path(f"{gate}.entered").exists())
        proc.send_signal(signal.SIGTERM)
        until("not ready while draining", lambda: get(port, "/readyz")[0] == 503)
        assert "draining" in get(port, "/readyz")[1]
        gate.write_text("open")  # the slow call returns
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    statuses = {s: st.status for s, st in fold(r for _, r in iter_file_records(wal)).items()}
    assert sorted(statuses.values()) == ["IN_FLIGHT", "IN_FLIGHT", "ROLLED_BACK"]
    applied = [c for c in bank.state().values() if c.applied]
    assert len(applied) == 1 and len(applied[0].attempts) == 1


def test_an_unreadable_log_halts_and_readiness_says_so(tmp_path: Path) -> None:
    wal, bank = tmp_path / "a.wal", Bank(tmp_path / "bank")
    orphan(wal, bank, "s1", "chaos.refund")
    with open(wal, "ab") as f:
        f.write(b"this is not a record\n")
    proc, port = start(tmp_path, "--wal-path", str(wal), "--imports", "chaos_handlers")
    try:
        status, body = until("the halt", lambda: (r := get(port, "/readyz")) and "HALTED" in r[1] and r)
        assert status == 503 and "line 5" in body
        assert get(port, "/livez")[0] == 200  # alive: restarting would not repair the log
        require_prometheus()
        assert metric(get(port, "/metrics")[1], "agent_saga_recovery_halted") == 1
        assert metric(get(port, "/metrics")[1], "agent_saga_recovery_ready") == 0
        assert not any(c.attempts for c in bank.state().values())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_missing_handler_module_refuses_to_start(tmp_path: Path) -> None:
    wal, bank = tmp_path / "a.wal", Bank(tmp_path / "bank")
    orphan(wal, bank, "s1", "chaos.refund")
    out = subprocess.run([sys.executable, "-m", "agent_saga_recoveryd", "--wal-path", str(wal), "--imports",
                          "no_such_module", "--metrics-port", "-1", "--once"], env=env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "no_such_module" in out.stderr


def test_a_redis_not_reachable_at_start_leaves_it_up_and_unready_until_it_is(tmp_path: Path) -> None:
    from fixtures.procs import free_ports
    from fixtures.redis_server import RedisServer

    port = free_ports(1)[0]
    url = f"redis://127.0.0.1:{port}/0"
    proc, http = start(tmp_path, "--wal-url", f"{url}?key={{agent-saga}}:wal", "--redis-url", url,
                       "--imports", "chaos_handlers")
    server = RedisServer(tmp_path / "redis", port=port)
    try:
        status, body = until("unready, naming the log", lambda: (r := get(http, "/readyz")) and "cannot be opened" in r[1]
                             and r, proc=proc)
        assert status == 503 and f"127.0.0.1:{port}" in body and "retrying" in body, body
        assert get(http, "/livez")[0] == 200 and proc.poll() is None
        server.start()
        until("ready once Redis answers", lambda: get(http, "/readyz")[0] == 200, timeout=60, proc=proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.close()
