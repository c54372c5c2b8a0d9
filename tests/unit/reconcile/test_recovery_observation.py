"""Recovery resolves an in-doubt step by asking the tool's @reconciler for an Observation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import recovery_support as rs
from agent_saga import Compensation, Observation, idempotency_key, reconciler
from agent_saga.errors import ConfigurationError
from agent_saga.history import fold
from agent_saga.recovery import RecoveryDaemon
from agent_saga.recovery.reconcilers import unregister_reconciler
from recovery_support import FUTURE, records, write_orphan

TOOL = "test.obs.charge"
SEEN: list[dict[str, Any]] = []
ANSWER: list[Any] = []


@pytest.fixture(autouse=True)
def _registered() -> Iterator[None]:
    rs.CALLS.clear()
    SEEN.clear()
    ANSWER.clear()

    @reconciler(TOOL)
    def observe(**kw: Any) -> Any:
        SEEN.append(kw)
        return ANSWER[0]

    yield
    unregister_reconciler(TOOL)
    rs.CALLS.clear()


async def recover(tmp_path: Path, state: str = "INTENT") -> tuple[str, list[Any]]:
    wal = tmp_path / "a.wal"
    write_orphan(wal, "s", [{"tool": TOOL, "state": state, "args": {"account": "acct_1", "amount": 4200}}])
    d = RecoveryDaemon(wal, clock=FUTURE)
    rep = await d.sweep()
    await d.close()
    assert rep.recovered == 1
    recs = records(wal)
    return fold(recs)["s"].status, recs


def refund() -> Compensation:
    return Compensation(handler="test.recovery.refund", kwargs={"charge_id": "ch_9"})


async def test_the_reconciler_is_called_over_the_forward_kwargs_and_key(tmp_path: Path) -> None:
    ANSWER.append(Observation(exists=False, detail="no charge under the key"))
    status, recs = await recover(tmp_path)
    assert SEEN == [{"account": "acct_1", "amount": 4200, "idempotency_key": idempotency_key("s", "s/0", "forward")}]
    assert status == "ROLLED_BACK" and rs.CALLS == []
    (rec,) = [r for r in recs if r.type == "STEP_RECONCILED"]
    assert rec.payload["happened"] is False and rec.payload["observation"]["detail"] == "no charge under the key"


@pytest.mark.parametrize("state", ["INTENT", "UNKNOWN"])
async def test_a_charge_that_landed_and_stands_is_undone_by_the_observed_compensation(tmp_path: Path, state: str) -> None:
    ANSWER.append(Observation(exists=True, reversed_=False, amount=4200, compensation=refund()))
    status, recs = await recover(tmp_path, state)
    assert status == "ROLLED_BACK"
    assert rs.CALLS == [(idempotency_key("s", "s/0", "compensate"), {"charge_id": "ch_9"})]
    (rec,) = [r for r in recs if r.type == "STEP_RECONCILED"]
    assert rec.payload["compensation"]["handler"] == "test.recovery.refund" and rec.payload["observation"]["amount"] == 4200


async def test_a_charge_already_reversed_is_not_undone_twice(tmp_path: Path) -> None:
    ANSWER.append(Observation(exists=True, reversed_=True, compensation=refund()))
    status, _ = await recover(tmp_path)
    assert status == "ROLLED_BACK" and rs.CALLS == []


async def test_i_dont_know_survives_as_an_escalation(tmp_path: Path) -> None:
    ANSWER.append(Observation(exists=None, detail="provider timed out"))
    status, recs = await recover(tmp_path)
    assert status == "ROLLBACK_PARTIAL" and rs.CALLS == []
    (esc,) = [r for r in recs if r.type == "ESCALATED"]
    assert esc.payload["kind"] == "OUTCOME_UNKNOWN" and "provider timed out" in esc.payload["reason"]


async def test_it_happened_but_nobody_said_how_to_undo_it_is_escalated(tmp_path: Path) -> None:
    ANSWER.append(Observation(exists=True, reversed_=False))
    status, recs = await recover(tmp_path)
    (esc,) = [r for r in recs if r.type == "ESCALATED"]
    assert status == "ROLLBACK_PARTIAL" and esc.payload["kind"] == "NOT_REPLAYABLE"


async def test_a_reconciler_on_the_old_contract_is_escalated_with_the_migration(tmp_path: Path) -> None:
    ANSWER.append(refund())  # the old contract returned a Compensation
    status, recs = await recover(tmp_path)
    (esc,) = [r for r in recs if r.type == "ESCALATED"]
    assert status == "ROLLBACK_PARTIAL" and esc.payload["kind"] == "RECONCILE_FAILED"
    assert "not an Observation" in esc.payload["reason"] and rs.CALLS == []


def test_observation_fields_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="reversed_ must be True, False or None"):
        Observation(reversed_="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="amount must be a number"):
        Observation(amount="42")  # type: ignore[arg-type]
    assert Observation(detail="sk_live_" + "a" * 24).to_dict()["detail"] == "[REDACTED]"
