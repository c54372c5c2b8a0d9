"""`agent-saga verify` and `agent-saga inspect`, run as the real console script."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agent_saga import FileWAL
from fixtures.cli import cli


def _log(path: Path) -> None:
    async def fill() -> None:
        wal = FileWAL(path)
        wal.append("SAGA_STARTED", "checkout-1", None, {"name": "checkout"})
        wal.append("STEP_INTENT", "checkout-1", "checkout-1/0", {"tool": "stripe.charge", "semantics": "COMPENSABLE"})
        wal.append("STEP_COMMITTED", "checkout-1", "checkout-1/0",
                   {"tool": "stripe.charge", "semantics": "COMPENSABLE",
                    "compensation": {"handler": "stripe.refund", "kwargs": {"charge_id": "ch_1"}}})
        wal.append("SAGA_COMPLETED", "checkout-1", None, {})
        wal.append("SAGA_STARTED", "wire-2", None, {"name": "wire"})
        wal.append("STEP_INTENT", "wire-2", "wire-2/0", {"tool": "wire.send", "semantics": "IRREVERSIBLE"})
        await wal.barrier()
        wal.close()

    asyncio.run(fill())


def test_verify_intact_exits_0(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    r = cli("verify", "--wal-path", str(p))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK: 6 records, chain intact")


def test_verify_broken_exits_1_and_names_the_record(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    p.write_bytes(p.read_bytes().replace(b'"charge_id":"ch_1"', b'"charge_id":"ch_9"'))
    r = cli("verify", "--wal-path", str(p), "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["ok"] is False and out["first_bad_seq"] == 3
    assert out["location"].endswith("line 3") and "digest" in out["reason"]


def test_verify_malformed_line_names_line(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    lines = p.read_bytes().splitlines(keepends=True)
    lines[1] = b"{not json\n"
    p.write_bytes(b"".join(lines))
    r = cli("verify", "--wal-path", str(p))
    assert r.returncode == 1
    assert "line 2" in r.stdout and "not valid JSON" in r.stdout


def test_verify_head_detects_truncation(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    head = json.loads(p.read_bytes().splitlines()[-1])["hash"]
    assert cli("verify", "--wal-path", str(p), "--head", head).returncode == 0
    p.write_bytes(b"".join(p.read_bytes().splitlines(keepends=True)[:-1]))  # drop the last record
    assert cli("verify", "--wal-path", str(p)).returncode == 0  # a chain alone cannot see this
    r = cli("verify", "--wal-path", str(p), "--head", head)
    assert r.returncode == 1 and "truncated" in r.stdout


def test_verify_missing_file_is_usage_error(tmp_path: Path) -> None:
    r = cli("verify", "--wal-path", str(tmp_path / "nope.wal"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_inspect_lists_sagas_and_dangling_steps(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    r = cli("inspect", "--wal-path", str(p))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["checkout-1", "COMPLETED", "1"]
    assert lines[1].split()[:2] == ["wire-2", "IN_FLIGHT"] and "DANGLING: wire-2/0" in lines[1]
    r = cli("inspect", "--wal-path", str(p), "--json")
    sagas = json.loads(r.stdout)
    assert sagas[0]["steps"][0]["compensation"]["handler"] == "stripe.refund"
    assert sagas[1]["dangling"] == ["wire-2/0"]
