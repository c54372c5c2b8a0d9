"""Saga leases: a running saga renews its lease from a background thread, never per step."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from agent_saga import ActionSemantics, ConfigurationError, FileWAL, saga_scope
from agent_saga.recovery.scan import LogScan
from agent_saga.wal.file import iter_file_records
from fixtures.polling import until_async


def types(path: Path, saga: str) -> list[str]:
    return [r.type for _, r in iter_file_records(path) if r.saga == saga]


async def test_the_default_lease_costs_no_record(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w")
    async with saga_scope(wal, saga_id="s") as saga:
        await saga.execute("t", ActionSemantics.REVERSIBLE, forward=lambda: asyncio.sleep(0))
    wal.close()
    assert "SAGA_LEASE" not in types(tmp_path / "w", "s")


async def test_a_running_saga_renews_its_lease_and_stops_when_it_ends(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w")
    async with saga_scope(wal, saga_id="s", lease_seconds=0.15):
        await until_async("the lease renewed twice", lambda: types(tmp_path / "w", "s").count("SAGA_LEASE") >= 3,
                          timeout=10)  # the first + 2 renewals
    n = types(tmp_path / "w", "s").count("SAGA_LEASE")
    await asyncio.sleep(0.3)
    wal.close()
    after = types(tmp_path / "w", "s")
    assert after.count("SAGA_LEASE") <= n + 1  # at most one renewal racing the exit
    scan = LogScan()
    scan.feed_all(r for _, r in iter_file_records(tmp_path / "w"))
    assert "s" in scan.resolved


async def test_the_lease_rule_the_daemon_reads(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w")
    async with saga_scope(wal, saga_id="s", lease_seconds=2.0):
        await wal.barrier()
        scan = LogScan()
        scan.feed_all(r for _, r in iter_file_records(tmp_path / "w"))
        view = scan.in_flight["s"]
        assert view.lease_seconds == 2.0
        now = time.time()
        assert not view.lease_expired(now, 0) and view.lease_expired(now + 2.5, 0)
        assert not view.lease_expired(now + 2.5, 1.0)  # the grace for clock skew
    wal.close()


@pytest.mark.parametrize("bad", [0, -1, "30", float("inf"), True])
def test_a_bad_lease_is_refused_before_anything_is_written(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="lease_seconds"):
        saga_scope(lease_seconds=bad)  # type: ignore[arg-type]
