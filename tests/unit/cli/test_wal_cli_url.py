"""`agent-saga verify|inspect --wal-url`: the reader factory, for file logs (servers: integration)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agent_saga import FileWAL
from fixtures.cli import cli


def _log(path: Path) -> None:
    async def fill() -> None:
        wal = FileWAL(path)
        for i in range(3):
            wal.append("SAGA_STARTED", f"s-{i}", None, {"name": "pay"})
            wal.append("SAGA_COMPLETED", f"s-{i}", None, {})
        wal.append("SAGA_STARTED", "open", None, {"name": "pay"})
        await wal.barrier()
        await wal.compact()
        wal.close()

    asyncio.run(fill())


def test_wal_url_accepts_a_path_and_file_url(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    for target in (str(p), p.as_uri()):
        r = cli("verify", "--wal-url", target)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith("OK: 2 records, chain intact")
        assert "6 sequences removed by compaction, each attested" in r.stdout
    r = cli("inspect", "--wal-url", p.as_uri(), "--json")
    assert r.returncode == 0 and [s["saga_id"] for s in json.loads(r.stdout)] == ["open"]


def test_wal_path_and_wal_url_are_exclusive_and_one_is_required(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    assert cli("verify", "--wal-path", str(p), "--wal-url", str(p)).returncode == 2
    assert cli("verify").returncode == 2


def test_unknown_scheme_is_a_usage_error_without_the_password() -> None:
    r = cli("verify", "--wal-url", "mongodb://u:hunter2@h/db")
    assert r.returncode == 2 and "unknown WAL scheme" in r.stderr
    assert "hunter2" not in r.stderr + r.stdout
