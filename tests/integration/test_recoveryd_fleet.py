"""The fleet: 3 recoveryd processes over one RedisWAL resolve 500 orphans exactly once.

An agent process runs 500 sagas of two charges each against the bank and is killed with
every one in flight. Three ``agent-saga-recoveryd`` replicas sharing claims and the
ledger through Redis sweep the log; one of them is killed mid-sweep (right after a
refund call, before it journaled or logged it). Its claims expire, the others finish its
sagas. Every charge is refunded exactly once; a refund was called twice only for a step
the killed replica had in hand, and always under the same key.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

from agent_saga import verify_records
from agent_saga.history import ROLLED_BACK, fold
from agent_saga.wal.readers import open_reader

ROOT = Path(__file__).resolve().parents[2]
CHAOS = ROOT / "tests" / "chaos"
sys.path.insert(0, str(CHAOS))

from chaos_bank import Bank  # noqa: E402
from fixtures.redis_server import tagged  # noqa: E402

N = 500
CONCURRENCY = 8
KILL_AFTER_CALLS = 60  # replica 0 dies right after its 60th refund call


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(CHAOS), str(ROOT / "runtime"), str(ROOT / "recoveryd")])
    e.pop("AGENT_SAGA_FAULT", None)
    e.update(extra)
    return e


def resolved(log_url: str) -> dict[str, str]:
    reader = open_reader(log_url)
    try:
        return {s: st.status for s, st in fold(reader.records()).items()}
    finally:
        reader.close()


def test_three_replicas_resolve_500_orphans_exactly_once(tmp_path: Path, fresh_redis) -> None:  # type: ignore[no-untyped-def]
    log_url = f"{fresh_redis.url}?key={tagged('fleet:wal')}"
    bank = Bank(tmp_path / "bank")
    t0 = time.monotonic()
    worker = subprocess.run(
        [sys.executable, "-m", "chaos_worker", "many", log_url, bank.path, str(tmp_path / "trace"), str(N), "1.0"],
        env=env(), capture_output=True, text=True, timeout=300,
    )
    assert worker.returncode == 137, worker.stderr[-2000:]
    assert len(bank.state()) == 2 * N
    orphaned = time.monotonic()
    print(f"\n{N} orphans (2 charges each) made in {orphaned - t0:.1f}s")

    procs: list[subprocess.Popen[str]] = []
    logs = []
    started = time.monotonic()
    for i in range(3):
        extra = {"AGENT_SAGA_FAULT": f"recovery.after_compensation:{KILL_AFTER_CALLS}"} if i == 0 else {}
        log = open(tmp_path / f"recoveryd-{i}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "agent_saga_recoveryd", "--wal-url", log_url, "--redis-url", fresh_redis.url,
             "--imports", "chaos_handlers", "--metrics-port", "0", "--bind", "127.0.0.1",
             "--port-file", str(tmp_path / f"port-{i}"), "--interval", "0.2", "--claim-ttl", "2",
             "--lease-grace", "0", "--concurrency", str(CONCURRENCY), "--daemon-id", f"replica-{i}"],
            env=env(**extra), stdout=log, stderr=subprocess.STDOUT, text=True,
        ))
    try:
        deadline = time.monotonic() + 240
        while True:
            statuses = Counter(resolved(log_url).values())
            if statuses.get(ROLLED_BACK, 0) == N:
                break
            assert time.monotonic() < deadline, f"not all resolved: {statuses}"
            time.sleep(0.2)
        done = time.monotonic()
        assert procs[0].wait(30) == 137  # the killed replica really died mid-sweep
        ports = [int((tmp_path / f"port-{i}").read_text()) for i in (1, 2)]
        bodies = [urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).read().decode() for p in ports]
        for p in procs[1:]:
            p.send_signal(signal.SIGTERM)
        for p in procs[1:]:
            assert p.wait(60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()

    rate = N / (done - started)
    print(f"fleet: {N} sagas recovered by 3 replicas (one killed mid-sweep) in {done - started:.2f}s "
          f"= {rate:.0f} sagas/s (including process start and the 2s claim expiry)")

    charges = bank.state().values()
    assert all(len(c.applied) == 1 for c in charges), [c.id for c in charges if len(c.applied) != 1]
    twice = [c for c in charges if len(c.attempts) > 1]
    assert all(len(c.attempts) == 2 and len(set(c.attempts)) == 1 for c in twice)
    assert len(twice) <= CONCURRENCY, f"{len(twice)} refunds called twice; the killed replica held at most {CONCURRENCY}"

    reader = open_reader(log_url)
    try:
        terminals = [r for r in reader.records() if r.type == "SAGA_ROLLED_BACK"]
        by = Counter((r.payload or {}).get("recovered_by") for r in terminals)
        for writer in reader.chains():
            result = verify_records(reader.chain(writer))
            assert result.ok, f"{writer}: {result.describe()}"
    finally:
        reader.close()
    assert sum(by.values()) == N and len(by) >= 2, by  # the work was shared, each saga closed once
    assert "replica-0" in by  # the killed replica did part of it before dying
    for body in bodies:
        assert "agent_saga_recovery_sagas_recovered_total" in body
    print(f"fleet: sagas closed per replica: {dict(by)}")
    # Steady state: leave out the sagas the killed replica held (they wait for its claims
    # to expire) and measure between the first and the last of the others.
    ts = sorted(r.ts for r in terminals)[: N - CONCURRENCY]
    print(f"fleet: steady state {(len(ts) - 1) / ((ts[-1] - ts[0]) / 1e6):.0f} sagas/s across 3 replicas")
