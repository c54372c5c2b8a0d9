"""Status conditions set as cert-manager sets them, and the status patch built from them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent_saga_operator.conditions import (
    READY,
    SYNCED,
    Cond,
    changed,
    find,
    rfc3339,
    set_condition,
)
from agent_saga_operator.handlers import _status_patch
from agent_saga_operator.reconcilers import Outcome

T0 = datetime(2026, 7, 1, 12, 0, 0, 123456, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_rfc3339_is_whole_seconds_utc() -> None:
    assert rfc3339(T0) == "2026-07-01T12:00:00Z"


def test_transition_time_is_kept_unless_the_status_flips() -> None:
    conds = set_condition(None, Cond(READY, "False", "Pending", "waiting"), generation=1, now=T0)
    assert conds == [{"type": "Ready", "status": "False", "reason": "Pending", "message": "waiting",
                      "lastTransitionTime": "2026-07-01T12:00:00Z", "observedGeneration": 1}]
    # Same status, new reason and message: the time stays, the rest moves.
    conds = set_condition(conds, Cond(READY, "False", "RedisUnavailable", "down"), generation=2, now=T1)
    assert conds[0]["lastTransitionTime"] == "2026-07-01T12:00:00Z"
    assert (conds[0]["reason"], conds[0]["observedGeneration"]) == ("RedisUnavailable", 2)
    # The status flips: a new transition time.
    conds = set_condition(conds, Cond(READY, "True", "Engaged", "on"), generation=2, now=T1)
    assert conds[0]["lastTransitionTime"] == "2026-07-01T12:05:00Z"


def test_other_types_are_kept_in_order_and_new_ones_appended() -> None:
    conds = set_condition(None, Cond(SYNCED, "True", "Projected"), generation=1, now=T0)
    conds = set_condition(conds, Cond(READY, "True", "Engaged"), generation=1, now=T0)
    conds = set_condition(conds, Cond(SYNCED, "False", "RedisUnavailable"), generation=1, now=T1)
    assert [c["type"] for c in conds] == ["Synced", "Ready"]
    assert find(conds, READY)["reason"] == "Engaged"  # type: ignore[index]
    assert find(conds, "Nope") is None


def test_changed_is_status_or_reason() -> None:
    a = {"status": "True", "reason": "Engaged", "message": "x"}
    assert not changed(a, {**a, "message": "y"})
    assert changed(a, {**a, "reason": "Expired"})
    assert changed(a, {**a, "status": "False"})
    assert changed(None, a) and not changed(None, None)


def test_status_patch_holds_only_what_changed() -> None:
    outcome = Outcome(Cond(READY, "True", "Engaged", "on"), Cond(SYNCED, "True", "Projected", "in"),
                      {"engaged": True, "scope": "global"}, rev=7)
    diff, old, new = _status_patch({}, outcome, 3, T0)
    assert diff["observedGeneration"] == 3 and diff["revision"] == 7 and diff["engaged"] is True
    assert old is None and new is not None and new["reason"] == "Engaged"
    status = dict(diff)
    # The same outcome again (a resync that found nothing new) patches nothing.
    again, old, new = _status_patch(status, Outcome(outcome.ready, outcome.synced, outcome.fields), 3, T1)
    assert again == {} and not changed(old, new)
