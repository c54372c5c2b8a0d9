"""Which Approvals the janitor deletes: finished ones, once their TTL has passed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from agent_saga_operator.__main__ import parse_args
from agent_saga_operator.janitor import due

NOW = datetime(2026, 7, 1, 12, 0, 10, tzinfo=UTC)


def approval(phase: str | None, decided_at: str | None = "2026-07-01T12:00:00Z") -> dict[str, Any]:
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if decided_at:
        status["decidedAt"] = decided_at
    return {"metadata": {"name": "a"}, "status": status}


@pytest.mark.parametrize("phase", ["Approved", "Denied", "Expired"])
def test_a_finished_approval_is_due_once_its_ttl_passed(phase: str) -> None:
    assert due(approval(phase), NOW, ttl=10)
    assert not due(approval(phase), NOW, ttl=11)


@pytest.mark.parametrize("obj", [
    approval("Pending"), approval(None), approval("Approved", decided_at=None),
    approval("Approved", decided_at="yesterday"), {"metadata": {"name": "a"}},
])
def test_never_due_unfinished_or_without_a_decision_time(obj: dict[str, Any]) -> None:
    assert not due(obj, NOW, ttl=1)


def test_a_ttl_of_zero_keeps_every_approval() -> None:
    assert not due(approval("Approved"), NOW, ttl=0)


def test_the_ttl_flag_refuses_negative_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--redis-url", "redis://x", "--approval-ttl-after-finished", "604800"]) \
        .approval_ttl_after_finished == 604800
    with pytest.raises(SystemExit):
        parse_args(["--redis-url", "redis://x", "--approval-ttl-after-finished", "-1"])
    assert "--approval-ttl-after-finished must be 0" in capsys.readouterr().err
