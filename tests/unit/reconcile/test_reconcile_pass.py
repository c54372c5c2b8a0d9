"""``agent-saga reconcile``: the system of record, not the log, decides; unverifiable is never clean.

The "system of record" here is a dict the reconcilers read (the connectors' suites test
the same contract against real PostgreSQL, stripe-mock and a Salesforce protocol server).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga import FileWAL, Observation, reconciler
from agent_saga.cli import main
from agent_saga.recovery.reconcilers import unregister_reconciler
from recovery_support import desc, write_orphan

LEDGER: dict[str, dict[str, Any]] = {}  # charge id -> {"refunded": bool|None, "amount": int}
CALLED: list[float] = []
NAMES = ("test.rp.refund", "test.rp.charge", "test.rp.raises", "test.rp.slow", "test.rp.stamp")


@pytest.fixture(autouse=True)
def _reconcilers() -> Iterator[None]:
    LEDGER.clear()
    CALLED.clear()

    @reconciler("test.rp.refund")
    def observe_refund(*, charge_id: str, **_: Any) -> Observation:
        c = LEDGER[charge_id]
        return Observation(reversed_=c["refunded"], exists=True, detail=c.get("status", ""), amount=c["amount"])

    @reconciler("test.rp.charge")
    async def observe_charge(*, account: str, **_: Any) -> Observation:
        c = LEDGER.get(account)
        if c is None:
            return Observation(exists=False)
        return Observation(exists=True, reversed_=c["refunded"], amount=c["amount"])

    @reconciler("test.rp.stamp")
    async def stamp(**_: Any) -> Observation:  # on the loop: the time a call started
        CALLED.append(time.monotonic())
        return Observation(reversed_=True, exists=True)

    @reconciler("test.rp.raises")
    def raises(**_: Any) -> Observation:
        raise ConnectionError("provider unreachable")

    @reconciler("test.rp.slow")
    async def slow(**_: Any) -> Observation:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    yield
    for n in NAMES:
        unregister_reconciler(n)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["reconcile", *argv])
    return code, capsys.readouterr().out


def compensated(wal: Path, saga: str, charge: str, handler: str = "test.rp.refund") -> None:
    write_orphan(wal, saga, [{"comp": desc(charge, handler), "state": "DONE"}])


def test_a_refund_the_provider_applied_is_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compensated(tmp_path / "w", "s", "ch_1")
    LEDGER["ch_1"] = {"refunded": True, "amount": 500}
    code, out = run(capsys, "--wal-path", str(tmp_path / "w"))
    assert code == 0, out
    assert "[OK] pay.charge" in out and "1 confirmed, 0 drift, 0 unverifiable" in out


def test_a_refund_acknowledged_but_not_applied_is_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compensated(tmp_path / "w", "s", "ch_1")
    LEDGER["ch_1"] = {"refunded": False, "amount": 500, "status": "succeeded"}
    code, out = run(capsys, "--wal-path", str(tmp_path / "w"))
    assert code == 1
    assert "[DRIFT] pay.charge: the log says COMPENSATED but the effect is still standing" in out
    assert "saga s, IN_FLIGHT, step s/0, reconciler test.rp.refund" in out and "amount=500" in out  # no terminal record yet


def test_the_timed_out_charge_that_landed_is_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_orphan(tmp_path / "w", "s", [{"tool": "test.rp.charge", "state": "UNKNOWN", "args": {"account": "a1"}}])
    LEDGER["a1"] = {"refunded": False, "amount": 4200}
    code, out = run(capsys, "--wal-path", str(tmp_path / "w"))
    assert code == 1
    assert ("[DRIFT] test.rp.charge: timed-out step DID land and is still standing — it was never "
            "compensated (amount=4200)") in out


def test_a_timed_out_charge_that_never_landed_is_confirmed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_orphan(tmp_path / "w", "s", [{"tool": "test.rp.charge", "state": "UNKNOWN", "args": {"account": "a1"}}])
    code, out = run(capsys, "--wal-path", str(tmp_path / "w"))
    assert code == 0 and "did not land" in out


@pytest.mark.parametrize(("handler", "why"), [
    ("test.rp.none", "no @reconciler registered for 'test.rp.none' or 'pay.charge'"),
    ("test.rp.raises", "the reconciler raised ConnectionError: provider unreachable"),
    ("test.rp.slow", "the reconciler did not answer within 0.2s"),
])
def test_could_not_check_is_unverifiable_never_confirmed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], handler: str, why: str
) -> None:
    compensated(tmp_path / "w", "s", "ch_1", handler)
    code, out = run(capsys, "--wal-path", str(tmp_path / "w"), "--timeout", "0.2")
    assert code == 3, out
    assert "[UNVERIFIABLE]" in out and why in out and "nothing could be verified" in out


def test_reversed_none_is_unverifiable_and_one_confirmed_does_not_make_it_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    compensated(tmp_path / "w", "s1", "ch_1")
    compensated(tmp_path / "w", "s2", "ch_2")
    LEDGER["ch_1"] = {"refunded": True, "amount": 1}
    LEDGER["ch_2"] = {"refunded": None, "amount": 2}
    code, out = run(capsys, "--wal-path", str(tmp_path / "w"))
    assert code == 3 and "1 confirmed, 0 drift, 1 unverifiable - not clean" in out


def test_json_names_saga_step_handler_and_observation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compensated(tmp_path / "w", "s", "ch_1")
    LEDGER["ch_1"] = {"refunded": False, "amount": 500, "status": "succeeded"}
    code, out = run(capsys, "--wal-path", str(tmp_path / "w"), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["exit_code"] == 1 and doc["drift"] == 1
    (f,) = doc["findings"]
    assert (f["saga"], f["step"], f["tool"], f["handler"], f["reconciler"], f["verdict"], f["check"]) == (
        "s", "s/0", "pay.charge", "test.rp.refund", "test.rp.refund", "DRIFT", "undone")
    assert f["observed"] == {"reversed": False, "exists": True, "detail": "succeeded", "amount": 500}
    assert f["saga_status"] == "IN_FLIGHT"


def test_since_leaves_older_sagas_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compensated(tmp_path / "w", "old", "ch_1")
    LEDGER["ch_1"] = {"refunded": False, "amount": 1}
    code, out = run(capsys, "--wal-path", str(tmp_path / "w"), "--since", "2999-01-01T00:00:00Z")
    assert code == 0 and "nothing to reconcile" in out
    code, _ = run(capsys, "--wal-path", str(tmp_path / "w"), "--since", "1h")
    assert code == 1


def test_the_rate_limit_spaces_the_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(3):
        compensated(tmp_path / "w", f"s{i}", f"ch_{i}", "test.rp.stamp")
    code, _ = run(capsys, "--wal-path", str(tmp_path / "w"), "--rate", "20")
    assert code == 0 and len(CALLED) == 3
    assert all(b - a >= 0.05 for a, b in zip(CALLED, CALLED[1:], strict=False))  # a floor, not a speed


@pytest.mark.parametrize(("argv", "field"), [
    (["--since", "yesterday"], "--since 'yesterday' is not a time"),
    (["--timeout", "0"], "--timeout must be a positive"),
    (["--rate", "-1"], "--rate must be a positive"),
    (["--import", "no_such_module_xyz"], "cannot import 'no_such_module_xyz'"),
])
def test_bad_input_names_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], field: str) -> None:
    FileWAL(tmp_path / "w").close()
    assert main(["reconcile", "--wal-path", str(tmp_path / "w"), *argv]) == 2
    assert field in capsys.readouterr().err


def test_the_pass_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compensated(tmp_path / "w", "s", "ch_1")
    LEDGER["ch_1"] = {"refunded": False, "amount": 1}
    before = (tmp_path / "w").read_bytes()
    run(capsys, "--wal-path", str(tmp_path / "w"))
    assert (tmp_path / "w").read_bytes() == before
