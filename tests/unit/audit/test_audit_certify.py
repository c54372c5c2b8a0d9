"""Rollback-safety certificates: stranded effects fail naming the step; recovery makes it pass."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_saga import ActionSemantics, Compensation, FileWAL, RollbackIncomplete, saga_scope
from agent_saga.audit import certify, certify_log
from agent_saga.records import Record
from agent_saga.wal.readers import FileLogReader
from engine_support import AllowGate
from fixtures.cli import cli
from fixtures.wal import records as wal_records


def _records(p: Path) -> list[Record]:
    return wal_records(p, damaged="skip")


CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from agent_saga import ActionSemantics, Compensation, FileWAL, saga_scope

    async def main():
        wal = FileWAL(sys.argv[1])
        async with saga_scope(wal, saga_id="checkout-402") as saga:
            await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE,
                               forward=lambda: {"id": "ch_1"},
                               compensate=lambda r: Compensation(handler="stripe.refund",
                                                                 kwargs={"charge_id": r["id"]}))
            os._exit(0)   # the process dies with the charge committed and nothing undone

    asyncio.run(main())
    """
)


def _crashed_log(p: Path) -> None:
    subprocess.run([sys.executable, "-c", CHILD, str(p)], check=True, timeout=60)


def test_stranded_compensable_effect_fails_naming_the_step_then_recovery_passes(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _crashed_log(p)
    r = cli("certify", "--wal-path", str(p))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NOT CERTIFIED" in r.stdout
    assert "saga checkout-402 step checkout-402/0 (stripe.charge, COMPENSABLE)" in r.stdout
    assert "IN_FLIGHT" in r.stdout
    out = json.loads(cli("certify", "--wal-path", str(p), "--json").stdout)
    assert out["ok"] is False and out["chain_ok"] is True
    assert [(f["saga"], f["step"], f["verdict"]) for f in out["unaccounted"]] == [
        ("checkout-402", "checkout-402/0", "unaccounted")]

    # What a recovery writes for the dangling step, appended by a real writer.
    wal = FileWAL(p)
    base = {"tool": "stripe.charge", "semantics": "COMPENSABLE", "outcome_unknown": False}
    wal.append("COMPENSATION_STARTED", "checkout-402", "checkout-402/0",
               {**base, "compensation": {"handler": "stripe.refund", "kwargs": {"charge_id": "ch_1"}}})
    wal.append("COMPENSATION_DONE", "checkout-402", "checkout-402/0", base)
    wal.append("SAGA_ROLLED_BACK", "checkout-402", None, {"clean": True})
    wal.barrier_sync()
    wal.close()
    r = cli("certify", "--wal-path", str(p))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("CERTIFIED: 1 effects in 1 sagas, every one accounted for (1 compensated")


def test_a_tampered_log_is_never_certified(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _crashed_log(p)
    wal = FileWAL(p)
    wal.append("SAGA_COMPLETED", "checkout-402", None, {})
    wal.barrier_sync()
    wal.close()
    assert cli("certify", "--wal-path", str(p)).returncode == 0
    p.write_bytes(p.read_bytes().replace(b'"ch_1"', b'"ch_2"'))
    r = cli("certify", "--wal-path", str(p))
    assert r.returncode == 1
    assert "failed verification" in r.stdout and "never certified" in r.stdout
    cert = certify_log(FileLogReader(str(p)))
    assert not cert.ok and not cert.chain_ok and cert.effects == 0


async def test_engine_sagas_completed_and_rolled_back_are_certified(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    wal = FileWAL(p)
    undone: list[str] = []

    async with saga_scope(wal, name="ok") as saga:
        await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE, forward=lambda: {"id": "c1"},
                           compensate=lambda r: Compensation(fn=lambda: undone.append(r["id"])))
        await saga.execute("cache.put", ActionSemantics.REVERSIBLE, forward=lambda: None)

    with pytest.raises(RollbackIncomplete):  # the SMS cannot be undone: partial, by design
        async with saga_scope(wal, name="fails", gate=AllowGate()) as saga:
            await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE, forward=lambda: {"id": "c2"},
                               compensate=lambda r: Compensation(fn=lambda: undone.append(r["id"])))
            await saga.execute("sms.send", ActionSemantics.IRREVERSIBLE, forward=lambda: "sent")
            raise RuntimeError("the agent changed its mind")
    await wal.barrier()
    wal.close()
    assert undone == ["c2"]
    cert = certify(_records(p))
    assert cert.ok, cert.describe()
    assert cert.effects == 3 and cert.compensated == 1
    kinds = sorted(f.reason.split(" ")[0] for f in cert.terminal)
    assert kinds == ["committed", "not"], cert.describe()  # intended charge; the SMS, not undoable
    assert not certify(_records(p), strict=True).ok  # strict: the SMS is not an intended effect


async def test_failed_compensation_fails_and_names_it(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    wal = FileWAL(p)

    def refund_fails() -> None:
        raise ConnectionError("stripe is down")

    with pytest.raises(RollbackIncomplete):
        async with saga_scope(wal, saga_id="pay-7") as saga:
            await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE, forward=lambda: {"id": "c"},
                               compensate=lambda r: Compensation(fn=refund_fails))
            raise RuntimeError("boom")
    await wal.barrier()
    wal.close()
    cert = certify(_records(p))
    assert not cert.ok
    [f] = cert.unaccounted
    assert (f.saga_id, f.step_id, f.state) == ("pay-7", "pay-7/0", "COMPENSATION_FAILED")
    assert "stripe is down" in f.reason


def _write(p: Path, *recs: tuple[str, str, str | None, dict | None]) -> None:
    wal = FileWAL(p)
    for r in recs:
        wal.append(*r)
    wal.barrier_sync()
    wal.close()


def test_unknown_outcome_in_a_completed_saga_is_not_accounted(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p,
           ("SAGA_STARTED", "s", None, {}),
           ("STEP_INTENT", "s", "s/0", {"tool": "bank.wire", "semantics": "COMPENSABLE"}),
           ("STEP_UNKNOWN", "s", "s/0", {"tool": "bank.wire", "message": "timed out"}),
           ("SAGA_COMPLETED", "s", None, {}))
    cert = certify(_records(p))
    assert not cert.ok and "outcome unknown" in cert.unaccounted[0].reason


def test_escalated_is_terminal_and_listed_but_fails_strict(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p,
           ("SAGA_STARTED", "s", None, {}),
           ("STEP_INTENT", "s", "s/0", {"tool": "bank.wire", "semantics": "COMPENSABLE"}),
           ("STEP_UNKNOWN", "s", "s/0", {"tool": "bank.wire"}),
           ("ESCALATED", "s", "s/0", {"tool": "bank.wire", "semantics": "COMPENSABLE", "reason": "no result"}),
           ("SAGA_ROLLBACK_PARTIAL", "s", None, {}))
    r = cli("certify", "--wal-path", str(p))
    assert r.returncode == 0 and "TERMINAL" in r.stdout and "escalated to a human: no result" in r.stdout
    r = cli("certify", "--wal-path", str(p), "--strict")
    assert r.returncode == 1 and "strict: escalated" in r.stdout


@pytest.mark.parametrize(
    "tail, ok",
    [
        ([("STEP_COMMITTED", {"compensation": {"handler": "h"}})], False),  # in flight
        ([("STEP_COMMITTED", {"compensation": {"handler": "h"}}), ("SAGA_ROLLED_BACK", {})], False),
        ([("STEP_COMMITTED", {"compensation": {"handler": "h"}}), ("COMPENSATION_STARTED", {})], False),
        ([], False),  # a dangling intent
        ([("STEP_FAILED", {"message": "card declined"})], True),  # did not happen
        ([("STEP_REFUSED", {})], True),
        ([("STEP_COMMITTED", {}), ("COMPENSATION_SKIPPED", {"outcome": "NOTHING_TO_UNDO"}),
          ("SAGA_ROLLED_BACK", {})], True),
    ],
)
def test_step_states(tmp_path: Path, tail: list, ok: bool) -> None:
    p = tmp_path / "a.wal"
    recs = [("SAGA_STARTED", "s", None, {}),
            ("STEP_INTENT", "s", "s/0", {"tool": "t", "semantics": "COMPENSABLE"})]
    recs += [(t, "s", None if t.startswith("SAGA_") else "s/0", pl) for t, pl in tail]
    _write(p, *recs)
    cert = certify(_records(p))
    assert cert.ok is ok, cert.describe()
    if not ok:
        assert cert.unaccounted[0].step_id == "s/0"


def test_reversible_without_compensation_is_not_an_effect_even_in_flight(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p,
           ("SAGA_STARTED", "s", None, {}),
           ("STEP_INTENT", "s", "s/0", {"tool": "cache.put", "semantics": "REVERSIBLE"}),
           ("STEP_COMMITTED", "s", "s/0", {"compensation": None}),
           ("STEP_INTENT", "s", "s/1", {"tool": "tmp.write", "semantics": "REVERSIBLE"}),
           ("STEP_COMMITTED", "s", "s/1", {"compensation": {"handler": "tmp.delete"}}))
    cert = certify(_records(p))
    assert [f.step_id for f in cert.unaccounted] == ["s/1"] and cert.effects == 1


def test_redacted_semantics_are_treated_as_compensable(tmp_path: Path) -> None:
    from agent_saga.audit import redact_records

    p = tmp_path / "a.wal"
    _write(p,
           ("SAGA_STARTED", "s", None, {}),
           ("STEP_INTENT", "s", "s/0", {"tool": "cache.put", "semantics": "REVERSIBLE"}),
           ("STEP_COMMITTED", "s", "s/0", {"compensation": None}))
    assert certify(_records(p)).ok
    redact_records(p, [2, 3])
    cert = certify(_records(p))
    assert not cert.ok and cert.unaccounted[0].semantics == "?"


def test_certify_reads_a_file_url_and_a_missing_log_is_usage(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _write(p, ("SAGA_STARTED", "s", None, {}), ("SAGA_COMPLETED", "s", None, {}))
    assert cli("certify", "--wal-url", f"file://{p}").returncode == 0
    r = cli("certify", "--wal-path", str(tmp_path / "nope.wal"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_certify_an_encrypted_log_needs_the_key_and_says_so(tmp_path: Path) -> None:
    from agent_saga.audit import EncryptedWAL, encryptor_from_env, new_wal_key

    key = new_wal_key("k1")
    p = tmp_path / "a.wal"
    inner = FileWAL(p)
    wal = EncryptedWAL(inner, encryptor_from_env({"AGENT_SAGA_WAL_KEY": key}))

    async def run() -> None:
        async with saga_scope(wal, saga_id="enc-1") as saga:
            await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE, forward=lambda: {"id": "c"},
                               compensate=lambda r: Compensation(handler="stripe.refund", kwargs={"id": r["id"]}))
        await wal.barrier()

    asyncio.run(run())
    wal.close()
    env = {k: v for k, v in os.environ.items() if k != "AGENT_SAGA_WAL_KEY"}
    r = cli("certify", "--wal-path", str(p), env=env)
    assert r.returncode == 2 and "encrypted under key 'k1'" in r.stderr and "AGENT_SAGA_WAL_KEY" in r.stderr
    r = cli("certify", "--wal-path", str(p), env={**env, "AGENT_SAGA_WAL_KEY": key})
    assert r.returncode == 0 and "CERTIFIED: 1 effects" in r.stdout, r.stdout + r.stderr
