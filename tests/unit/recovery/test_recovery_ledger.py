"""FileLedger: the journal two daemons on one host share, and the human escalation queue."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from agent_saga.recovery import (
    Escalation,
    FileLedger,
    LedgerCorrupt,
    LedgerEntry,
    LedgerKind,
    escalation_id,
)


def esc(saga: str, step: str) -> Escalation:
    return Escalation(
        id=escalation_id(saga, step), saga_id=saga, step_id=step, tool="sms.send",
        semantics="IRREVERSIBLE", kind="IRREVERSIBLE", reason="no undo", outcome_unknown=False,
        source="w", daemon="d", ts=time.time(),
    )


def test_done_tokens_are_seen_by_every_reader_of_the_file(tmp_path: Path) -> None:
    a, b = FileLedger(tmp_path / "j"), FileLedger(tmp_path / "j")
    a.record_sync(LedgerEntry(LedgerKind.ATTEMPT, "t1", "s", "s/0", "a"))
    assert b.completed_sync({"t1"}) == set()
    a.record_sync(LedgerEntry(LedgerKind.DONE, "t1", "s", "s/0", "a"))
    assert b.completed_sync({"t1", "t2"}) == {"t1"}
    assert b.attempts_sync("t1") == 1


def test_a_torn_final_fragment_is_moved_aside_by_the_next_writer(tmp_path: Path) -> None:
    j = tmp_path / "j"
    FileLedger(j).record_sync(LedgerEntry(LedgerKind.DONE, "t1", "s", "s/0", "a"))
    with open(j, "ab") as f:
        f.write(b'{"v":1,"kind":"done","tok')  # a daemon killed mid-append
    led = FileLedger(j)
    assert led.completed_sync({"t1"}) == {"t1"}  # the fragment hides nothing
    led.record_sync(LedgerEntry(LedgerKind.DONE, "t2", "s", "s/1", "b"))
    assert FileLedger(j).completed_sync({"t1", "t2"}) == {"t1", "t2"}
    (side,) = tmp_path.glob("j.torn-*")
    assert side.read_bytes() == b'{"v":1,"kind":"done","tok'


def test_a_damaged_complete_line_fails_closed(tmp_path: Path) -> None:
    j = tmp_path / "j"
    j.write_text('{"v":1,"kind":"done","token":"t1"}\nnot json\n')
    with pytest.raises(LedgerCorrupt, match="line 2"):
        FileLedger(j).completed_sync({"t1"})


def test_escalations_are_idempotent_and_closed_by_a_human(tmp_path: Path) -> None:
    led = FileLedger(tmp_path / "j")
    assert led.escalate_sync(esc("s", "s/1")) is True
    assert led.escalate_sync(esc("s", "s/1")) is False
    (e,) = led.escalations_sync()
    assert e.open and e.kind == "IRREVERSIBLE"
    assert led.resolve_escalation_sync(e.id, by="ops@corp", note="called the customer") is True
    assert led.resolve_escalation_sync(e.id, by="ops@corp") is False
    assert FileLedger(tmp_path / "j").escalations_sync() == []
    (closed,) = FileLedger(tmp_path / "j").escalations_sync(include_resolved=True)
    assert closed.resolved_by == "ops@corp" and closed.note == "called the customer"
