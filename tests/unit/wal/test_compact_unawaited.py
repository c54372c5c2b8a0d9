"""``compact()`` called without ``await``: a bare call in a script runs to completion, a
bare call in async code raises naming the ``await``; every other use is unchanged
(``agent_saga._unawaited``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agent_saga import ConfigurationError, FileWAL
from agent_saga.recovery import RecoveryDaemon
from agent_saga.wal.file import iter_file_records


def log(path: Path) -> list:
    return [item for _, item in iter_file_records(path)]


def write(path: Path) -> None:
    wal = FileWAL(path)
    for sid, done in (("done", True), ("open", False)):
        wal.append("SAGA_STARTED", sid, None, {"name": "pay"})
        wal.append("STEP_INTENT", sid, f"{sid}/0", {"tool": "cache.put"})
        wal.append("STEP_COMMITTED", sid, f"{sid}/0", {"tool": "cache.put"})
        if done:
            wal.append("SAGA_COMPLETED", sid, None, {})
    wal.barrier_sync()
    wal.close()


def compacted(path: Path) -> bool:
    records = log(path)
    return records[-1].type == "COMPACTION" and {r.saga for r in records} == {"open", "wal"}


def test_a_bare_call_in_a_script_compacts(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    write(p)
    wal = FileWAL(p)
    wal.compact()  # no await, no loop: as a script writes it
    wal.close()
    assert compacted(p)


def test_a_used_call_is_still_the_coroutine(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    write(p)
    wal = FileWAL(p)
    report = asyncio.run(wal.compact())  # passed on: unchanged
    wal.close()
    assert report.sagas_removed == 1 and compacted(p)


async def test_a_bare_call_in_async_code_raises_naming_await(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    write(p)
    wal = FileWAL(p)
    try:
        with pytest.raises(ConfigurationError, match=r"without await.*await \.\.\.compact"):
            wal.compact()
        assert not compacted(p)
        await wal.compact()
    finally:
        wal.close()
    assert compacted(p)


def test_the_recovery_daemon_compacts_on_a_bare_call_in_a_script(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    write(p)
    daemon = RecoveryDaemon(p)
    try:
        daemon.compact(grace_seconds=0)
    finally:
        asyncio.run(daemon.close())
    assert compacted(p)


async def test_the_recovery_daemon_raises_on_a_bare_call_in_async_code(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    write(p)
    daemon = RecoveryDaemon(p)
    try:
        with pytest.raises(ConfigurationError, match="RecoveryDaemon.compact"):
            daemon.compact(grace_seconds=0)
    finally:
        await daemon.close()
    assert not compacted(p)
