"""An escalation hands the human the full compensation (handler, kwargs, description and
the idempotency key to call it with) and why it could not run, whatever the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_saga import Compensation, FileWAL, compensator, idempotency_key
from agent_saga.errors import RollbackIncomplete
from agent_saga.recovery import FileLedger, RecoveryDaemon
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from verified_support import HANDLER, Env, comp, orphan_file


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def escalations(env: Env, wal: Path) -> list[dict[str, Any]]:
    r = env.cli("recover", "--wal-path", str(wal), "--escalations", "--json")
    assert r.returncode == 1, r.stdout + r.stderr  # open escalations
    out: list[dict[str, Any]] = json.loads(r.stdout)
    return out


def test_a_handler_not_registered_escalation_carries_the_descriptor_and_the_key(env: Env) -> None:
    wal = orphan_file(env.dir / "a.wal", "s1", "ch_42")
    r = env.cli("recover", "--wal-path", str(wal), "--lease-grace", "0")  # no --import: not registered
    assert r.returncode == 1, r.stdout + r.stderr
    (esc,) = escalations(env, wal)
    assert esc["escalation_kind"] == "HANDLER_NOT_REGISTERED"
    assert f"compensation handler {HANDLER!r} is not registered" in esc["reason"]
    assert esc["compensation"] == {
        **comp("ch_42"), "idempotency_key": idempotency_key("s1", "s1/0", "compensate"),
    }
    text = env.cli("recover", "--wal-path", str(wal), "--escalations").stdout
    assert '"charge_id": "ch_42"' in text and '"handler": "ledger.refund"' in text and "idempotency_key" in text
    assert env.calls() == []


def test_a_compensation_that_fails_escalates_with_the_descriptor_and_the_error(env: Env) -> None:
    wal = orphan_file(env.dir / "a.wal", "s1", "ch_7", handler="ledger.missing_file")
    (env.dir / "ledger_handlers.py").write_text(
        (env.dir / "ledger_handlers.py").read_text()
        + "\n@compensator('ledger.missing_file')\ndef broken(charge_id, idempotency_key):\n"
        "    raise ConnectionError('payments API unreachable')\n"
    )
    r = env.recover("--wal-path", str(wal))
    assert r.returncode == 1, r.stdout + r.stderr
    (esc,) = escalations(env, wal)
    assert esc["escalation_kind"] == "COMPENSATION_FAILED"
    assert "ConnectionError: payments API unreachable" in esc["reason"]
    assert esc["compensation"]["kwargs"] == {"charge_id": "ch_7"}
    assert esc["compensation"]["handler"] == "ledger.missing_file"
    assert esc["compensation"]["idempotency_key"] == idempotency_key("s1", "s1/0", "compensate")


def test_an_in_process_only_compensation_escalates_with_what_was_recorded(env: Env) -> None:
    wal_path = env.dir / "a.wal"
    wal = FileWAL(wal_path)
    recorded = {"handler": None, "kwargs": None, "description": "undo the upload",
                "in_process_only": "fn= is a Python callable another process cannot call"}
    wal.append("SAGA_STARTED", "s1", None, {"name": None, "tags": []})
    wal.append("SAGA_LEASE", "s1", None, {"lease_seconds": 0.001})
    wal.append("STEP_INTENT", "s1", "s1/0", {"tool": "files.upload", "semantics": "COMPENSABLE"})
    wal.append("STEP_COMMITTED", "s1", "s1/0", {"compensation": recorded})
    wal.barrier_sync()
    wal.close()
    assert env.recover("--wal-path", str(wal_path)).returncode == 1
    (esc,) = escalations(env, wal_path)
    assert esc["escalation_kind"] == "NOT_REPLAYABLE" and "another process cannot call" in esc["reason"]
    assert esc["compensation"]["description"] == "undo the upload"
    assert esc["compensation"]["idempotency_key"] == idempotency_key("s1", "s1/0", "compensate")


@compensator("test.escalations.refund_fails")
def _refund_fails(charge_id: str, idempotency_key: str) -> None:
    raise RuntimeError("card network down")


async def test_a_saga_whose_own_rollback_ended_partial_is_queued_with_its_compensation(tmp_path: Path) -> None:
    wal_path = tmp_path / "a.wal"
    wal = FileWAL(wal_path)
    with pytest.raises(RollbackIncomplete):
        async with saga_scope(wal, name="checkout") as saga:
            await saga.execute(
                "pay.charge", ActionSemantics.COMPENSABLE, forward=lambda: {"id": "ch_99"},
                compensate=lambda r: Compensation(
                    handler="test.escalations.refund_fails", kwargs={"charge_id": r["id"]}, description="refund",
                ),
            )
            raise ValueError("the agent changed its mind")
    wal.close()
    ledger = FileLedger(tmp_path / "journal.jsonl")
    daemon = RecoveryDaemon(str(wal_path), ledger=ledger, lease_grace=0)
    try:
        rep = await daemon.sweep()
        assert rep.ok and rep.in_flight == 0
    finally:
        await daemon.close()
    (esc,) = await ledger.escalations()
    step = f"{saga.saga_id}/0"
    assert esc.step_id == step and esc.kind == "COMPENSATION_FAILED" and esc.semantics == "COMPENSABLE"
    assert "card network down" in esc.reason
    assert esc.compensation is not None
    assert esc.compensation["handler"] == "test.escalations.refund_fails"
    assert esc.compensation["kwargs"] == {"charge_id": "ch_99"}
    assert esc.compensation["idempotency_key"] == idempotency_key(saga.saga_id, step, "compensate")


def test_a_step_its_owner_escalated_before_dying_is_queued_with_its_compensation(env: Env) -> None:
    wal_path = env.dir / "a.wal"
    wal = FileWAL(wal_path)
    wal.append("SAGA_STARTED", "s1", None, {"name": None, "tags": []})
    wal.append("SAGA_LEASE", "s1", None, {"lease_seconds": 0.001})
    wal.append("STEP_INTENT", "s1", "s1/0", {"tool": "pay.charge", "semantics": "COMPENSABLE"})
    wal.append("STEP_COMMITTED", "s1", "s1/0", {"compensation": comp("ch_5")})
    wal.append("ESCALATED", "s1", "s1/0", {
        "tool": "pay.charge", "semantics": "COMPENSABLE", "reason": "refund limit reached", "kind": "ESCALATED_BEFORE",
        "outcome": "ESCALATED",
    })
    wal.barrier_sync()
    wal.close()
    assert env.recover("--wal-path", str(wal_path)).returncode == 1
    (esc,) = escalations(env, wal_path)
    assert esc["reason"] == "refund limit reached"
    assert esc["compensation"] == {**comp("ch_5"), "idempotency_key": idempotency_key("s1", "s1/0", "compensate")}
    assert env.calls() == []
