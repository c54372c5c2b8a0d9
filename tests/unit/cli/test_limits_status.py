"""``agent-saga status`` limits section without a server: the in-process store says it
cannot be read from outside, and an unreachable store is reported (exit 1), never fine."""

from __future__ import annotations

import json
import socket

from agent_saga.cli import main


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_with_the_in_process_store_says_there_is_nothing_to_read(capsys, monkeypatch):
    monkeypatch.delenv("AGENT_SAGA_LIMIT_STORE", raising=False)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    # sections print in the gate's order: the kill switch comes before the limits
    assert "\nLIMITS\n" in "\n" + out and "InProcessLimitStore" in out and "RedisLimitStore" in out


def test_status_fails_closed_when_the_limit_store_is_unreachable(capsys):
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    assert main(["status", "--redis-url", url, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["limits"]["ok"] is False
    assert f"RedisLimitStore({url}) is unreachable" in doc["limits"]["error"]


def test_amounts_are_shown_without_rounding_small_ones_away():
    """A max of 0.0001 is never shown as "0.00" (refusals, status, the operator's Ready)."""
    from agent_saga.controls.limits import display_amount

    assert [display_amount(x) for x in (50_000, 12.5, 0.0001, 0.25, 1234.567, 0)] == [
        "50,000", "12.50", "0.0001", "0.25", "1,234.57", "0"]
