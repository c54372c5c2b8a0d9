"""The brief's four crash points, each leaving the log in a structurally different state.

    after_intent      intent fsynced, the charge never happened
    after_effect      charge happened, its inverse is not yet durable
    after_commit      compensation descriptor durable
    mid_compensation  died half way through unwinding a 3-step saga

For each: the chain verifies after the kill; after recovery every charge is refunded
exactly once or a human escalation exists (never a clean report with money outstanding);
running the daemon four times issues one refund; an interrupted rollback is finished,
not restarted. Then the daemon itself is killed at its own commit boundaries.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from agent_saga import idempotency_key
from agent_saga.history import COMPENSATED, ROLLBACK_PARTIAL, ROLLED_BACK
from agent_saga.recovery import FileLedger
from chaos_bank import Bank
from chaos_checks import attempts, chain_ok, check_money, in_doubt, recover, sagas
from chaos_support import PYTHON, Run, run_worker, subprocess_env

THREE = ["charge", "charge", "charge"]

POINTS = {
    "after_intent": ({"point": "before_effect", "nth": 2}, "complete"),
    "after_effect": ({"point": "after_effect", "nth": 2}, "complete"),
    "after_commit": ({"point": "after_commit", "nth": 2}, "complete"),
    "mid_compensation": ({"point": "compensation_before_effect", "nth": 2}, "fail"),
    "mid_compensation_after_refund": ({"point": "compensation_after_effect", "nth": 2}, "fail"),
}


def crash(tmp_path: Path, point: str, mode: str) -> tuple[Run, set[str]]:
    kill, end = POINTS[point]
    run = run_worker(tmp_path, {"saga_id": "pay-1", "steps": THREE, "end": end, "kill": {**kill, "mode": mode}})
    assert run.killed, f"the worker was not killed at {point}: exit {run.exitcode}, trace {run.points()}"
    assert run.points()[-1] == "KILLED"
    chain_ok(run.wal)  # the hash chain verifies after the kill
    return run, in_doubt(run.wal)


def compensated(run: Run) -> set[str]:
    return {s.step_id for s in sagas(run.wal)["pay-1"].steps.values() if s.state == COMPENSATED}


@pytest.mark.parametrize("mode", ["exit", "sigkill"])
@pytest.mark.parametrize("point", list(POINTS))
def test_each_crash_point_is_recovered_exactly_once(tmp_path: Path, point: str, mode: str, reconcilers: None) -> None:
    run, doubt = crash(tmp_path, point, mode)
    done_at_kill = compensated(run)
    reports = recover(run.wal, times=4)
    assert reports[0].recovered == 1
    assert [r.recovered for r in reports[1:]] == [0, 0, 0]  # four runs, one refund each
    chain_ok(run.wal)
    v = check_money(run.wal, run.bank, doubt, context=f"{point}/{mode}")
    # With a reconciler every point restores the balance completely and reports clean.
    assert v.status == {"pay-1": ROLLED_BACK} and v.escalated == 0
    assert Bank(run.bank).balance("pay-1") == 0
    charges = {c.key: c for c in Bank(run.bank).state().values()}
    if point.startswith("mid_compensation"):
        # Finished, not restarted: the step the worker compensated before dying was not
        # called again; the one in doubt was called again only under the same key.
        assert done_at_kill == {"pay-1/2"} and doubt == {"pay-1/1"}
        last = charges[idempotency_key("pay-1", "pay-1/2", "forward")]
        assert len(last.attempts) == 1
        middle = charges[idempotency_key("pay-1", "pay-1/1", "forward")]
        expected = 2 if point.endswith("after_refund") else 1
        assert len(middle.attempts) == expected and len(middle.applied) == 1
    else:
        assert done_at_kill == set()
        assert all(len(c.attempts) == 1 for c in charges.values())  # the second call was never made


@pytest.mark.parametrize("point", ["after_intent", "after_effect"])
def test_without_a_reconciler_a_dangling_charge_is_escalated_never_guessed(
    tmp_path: Path, point: str, no_reconcilers: None
) -> None:
    run, doubt = crash(tmp_path, point, "exit")
    (rep,) = recover(run.wal)
    v = check_money(run.wal, run.bank, doubt, context=point)
    assert v.status == {"pay-1": ROLLBACK_PARTIAL}
    (esc,) = FileLedger(f"{run.wal}.recovery.jsonl").escalations_sync()
    assert (esc.step_id, esc.kind) == ("pay-1/1", "OUTCOME_UNKNOWN")
    state = Bank(run.bank).state()
    if point == "after_intent":
        assert len(state) == 1 and v.escalated == 0  # never charged: balance restored AND escalated
        assert Bank(run.bank).balance("pay-1") == 0
    else:
        assert len(state) == 2 and v.escalated == 1  # the charge stands, a human knows


def test_a_torn_final_line_after_the_kill_hides_nothing(tmp_path: Path, reconcilers: None) -> None:
    run, doubt = crash(tmp_path, "after_commit", "sigkill")
    with open(run.wal, "ab") as f:
        f.write(b'{"v":1,"seq":9999,"ts":1,"type":"STEP_COMMITTED","saga":"pay-1","st')
    (rep,) = recover(run.wal)
    assert rep.recovered == 1
    chain_ok(run.wal)
    v = check_money(run.wal, run.bank, doubt)
    assert v.status == {"pay-1": ROLLED_BACK} and v.refunded == 2


DAEMON = """
import asyncio, sys, time
from agent_saga.recovery import RecoveryDaemon
async def main():
    d = RecoveryDaemon(sys.argv[1], imports=["chaos_handlers"], clock=lambda: time.time() + 3600)
    rep = await d.sweep()
    print(rep.summary())
asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("fault", "calls"),
    [
        ("recovery.after_claim", 1),           # nothing written: the next daemon does it all
        ("recovery.before_compensation", 1),   # STARTED durable, never called: called once
        ("recovery.after_compensation", 2),    # called, not journaled: in doubt, same key
        ("recovery.after_ledger", 1),          # journaled done: the next daemon skips the call
        ("recovery.before_terminal", 1),       # every step done: only the terminal is written
    ],
)
def test_a_daemon_killed_at_its_own_boundaries_is_finished_by_the_next(
    tmp_path: Path, fault: str, calls: int, reconcilers: None
) -> None:
    run = run_worker(tmp_path, {"saga_id": "pay-1", "steps": ["charge"], "end": "complete",
                                "kill": {"point": "after_commit", "nth": 1, "mode": "exit"}})
    assert run.killed
    out = subprocess.run([PYTHON, "-c", DAEMON, str(run.wal)], env=subprocess_env(AGENT_SAGA_FAULT=fault),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 137, out.stderr
    chain_ok(run.wal)
    (rep,) = recover(run.wal)
    assert rep.recovered == 1, rep.summary()
    (charge,) = Bank(run.bank).state().values()
    assert len(charge.applied) == 1 and len(charge.attempts) == calls
    assert len(set(charge.attempts)) == 1  # one key, whoever called
    assert sagas(run.wal)["pay-1"].status == ROLLED_BACK
    assert attempts(run.bank) == calls
