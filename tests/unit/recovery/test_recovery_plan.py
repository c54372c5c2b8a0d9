"""The recovery plan: each dangling step gets exactly one action, decided from the log."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga.recovery import Action, EscalationKind, RecoveryHalted, plan_saga
from agent_saga.recovery.scan import LogScan
from agent_saga.rollback import RollbackOutcome
from recovery_support import desc, key, records, write_orphan


def plan_of(path: Path, saga: str = "s", **kw):  # type: ignore[no-untyped-def]
    scan = LogScan()
    scan.feed_all(records(path))
    return plan_saga(scan.in_flight[saga], **kw)


def test_committed_steps_are_compensated_last_in_first_out(tmp_path: Path) -> None:
    write_orphan(tmp_path / "w", "s", [{"comp": desc("c0")}, {"comp": desc("c1")}, {"comp": desc("c2")}])
    plan = plan_of(tmp_path / "w")
    assert [s.step_id for s in plan.steps] == ["s/2", "s/1", "s/0"]
    assert {s.action for s in plan.steps} == {Action.COMPENSATE}
    assert plan.steps[0].key == key("s", 2)  # the engine's own key: the same token everywhere
    assert plan.steps[0].compensation == desc("c2")


def test_every_kind_of_step_gets_its_action(tmp_path: Path) -> None:
    write_orphan(tmp_path / "w", "s", [
        {"comp": desc("done"), "state": "DONE"},                 # 0 compensated before the crash
        {"comp": desc("doubt"), "state": "STARTED"},             # 1 in doubt: resume
        {"state": "FAILED"},                                     # 2 did not happen: not in the plan
        {"sem": "IRREVERSIBLE", "tool": "sms.send"},             # 3 escalate
        {"sem": "REVERSIBLE", "tool": "cache.put"},              # 4 nothing to undo
        {"comp": {"handler": None, "kwargs": {}, "description": ""}},  # 5 fn= only
        {"comp": desc("x", handler="not.imported")},             # 6 handler missing
        {"state": "INTENT"},                                     # 7 dangling, no reconciler
        {"comp": desc("f"), "state": "FAILED_COMP"},             # 8 failed in-process
    ])
    steps = {s.step_id: s for s in plan_of(tmp_path / "w").steps}
    assert "s/2" not in steps
    assert steps["s/0"].action is Action.ALREADY and steps["s/0"].outcome is RollbackOutcome.COMPENSATED
    assert steps["s/1"].action is Action.RESUME and steps["s/1"].key == key("s", 1)
    assert (steps["s/3"].action, steps["s/3"].kind, steps["s/3"].outcome) == (
        Action.ESCALATE, EscalationKind.IRREVERSIBLE, RollbackOutcome.NOT_UNDOABLE)
    assert steps["s/4"].action is Action.NOTHING_TO_UNDO
    assert steps["s/5"].kind is EscalationKind.NOT_REPLAYABLE
    assert steps["s/6"].kind is EscalationKind.HANDLER_NOT_REGISTERED and "not.imported" in steps["s/6"].reason
    assert steps["s/7"].kind is EscalationKind.OUTCOME_UNKNOWN and steps["s/7"].outcome_unknown
    assert steps["s/8"].kind is EscalationKind.COMPENSATION_FAILED


def test_a_dangling_step_is_reconciled_when_its_tool_has_a_reconciler(tmp_path: Path) -> None:
    write_orphan(tmp_path / "w", "s", [{"state": "INTENT", "tool": "pay.charge", "args": {"amount": 5}}])
    (step,) = plan_of(tmp_path / "w", has_reconciler=lambda tool: tool == "pay.charge").steps
    assert step.action is Action.RECONCILE and step.policy_args == {"amount": 5}
    assert step.forward_key is not None and len(step.forward_key) == 64


def test_a_malformed_descriptor_halts_instead_of_guessing(tmp_path: Path) -> None:
    write_orphan(tmp_path / "w", "s", [{"comp": {"handler": 7, "kwargs": "x"}}])
    with pytest.raises(RecoveryHalted, match="not \\{handler, kwargs"):
        plan_of(tmp_path / "w")


def test_an_in_doubt_compensation_under_a_foreign_key_halts(tmp_path: Path) -> None:
    from agent_saga import FileWAL

    write_orphan(tmp_path / "w", "s", [{"comp": desc("c")}])
    wal = FileWAL(tmp_path / "w")
    wal.append("COMPENSATION_STARTED", "s", "s/0", {"tool": "t", "compensation": desc("c"), "idempotency_key": "f" * 64})
    wal.close()
    with pytest.raises(RecoveryHalted, match="not the deterministic key"):
        plan_of(tmp_path / "w")
