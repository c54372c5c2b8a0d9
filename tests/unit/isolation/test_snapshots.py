"""Snapshots: in-process for REVERSIBLE steps, durable for COMPENSABLE ones, never a
secret, and a GC that only collects what no unresolved saga can still need."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_saga import (
    ActionSemantics,
    Compensation,
    ConfigurationError,
    FileSnapshots,
    FileWAL,
    InProcessSnapshots,
    NotSerializable,
    RollbackIncomplete,
    SecretDetected,
    SnapshotMissing,
    saga_scope,
)
from agent_saga.wal.file import iter_file_records

REV, COMP, IRR = ActionSemantics.REVERSIBLE, ActionSemantics.COMPENSABLE, ActionSemantics.IRREVERSIBLE


@pytest.fixture
def wal_path(tmp_path: Path) -> Path:
    return tmp_path / "s.wal"


async def test_a_reversible_step_is_restored_from_its_in_process_snapshot(wal_path: Path) -> None:
    memory = InProcessSnapshots()
    config = {"replicas": 2}
    wal = FileWAL(wal_path)
    try:
        with pytest.raises(RuntimeError):
            async with saga_scope(wal, saga_id="scale") as saga:
                snap = await memory.capture(saga, "deploy/web", config)
                await saga.execute("deploy.scale", REV, forward=lambda: config.update(replicas=9),
                                   compensate=lambda r: Compensation(
                                       fn=lambda: config.update(memory.load(snap.snapshot_id).value)))
                assert config == {"replicas": 9} and len(memory) == 1
                raise RuntimeError("abort")
    finally:
        wal.close()
    assert config == {"replicas": 2}
    assert len(memory) == 0  # resolved cleanly: discarded at the boundary
    with pytest.raises(SnapshotMissing, match="not held by this process"):
        memory.load(snap.snapshot_id)


async def test_a_compensable_snapshot_is_durable_and_verified(tmp_path: Path, wal_path: Path) -> None:
    store = FileSnapshots(tmp_path / "snaps")
    wal = FileWAL(wal_path)
    try:
        async with saga_scope(wal, saga_id="cfg") as saga:
            snap = await store.capture(saga, "config/web", {"timeout": 30})
            # on disk before capture returned, read back by another store on the directory
            assert FileSnapshots(tmp_path / "snaps").load(snap.snapshot_id).value == {"timeout": 30}
            assert snap.ref() == {"snapshot_id": snap.snapshot_id} and snap.durable
            path = tmp_path / "snaps" / f"{snap.snapshot_id}.json"
            doc = json.loads(path.read_text())
            doc["value"] = {"timeout": 31}
            path.write_text(json.dumps(doc))
            with pytest.raises(SnapshotMissing, match="does not verify"):
                store.load(snap.snapshot_id)
    finally:
        wal.close()
    assert store.ids() == []  # the saga completed: nothing left to restore
    with pytest.raises(SnapshotMissing, match="is not in"):
        store.load(snap.snapshot_id)
    with pytest.raises(SnapshotMissing, match="is not a snapshot id"):
        store.load("../../etc/passwd")


async def test_after_a_partial_rollback_the_snapshot_stays_for_a_human(tmp_path: Path, wal_path: Path) -> None:
    store = FileSnapshots(tmp_path / "snaps")
    wal = FileWAL(wal_path)

    def broken() -> None:
        raise ConnectionError("config service down")

    try:
        with pytest.raises(RollbackIncomplete):
            async with saga_scope(wal, saga_id="cfg2") as saga:
                snap = await store.capture(saga, "config/web", {"timeout": 30})
                await saga.execute("config.write", COMP, forward=lambda: None,
                                   compensate=lambda r: Compensation(fn=broken))
                raise RuntimeError("abort")
    finally:
        wal.close()
    assert store.ids() == [snap.snapshot_id]
    report = await store.gc(iter_file_records(wal_path))
    assert report.collected == () and report.kept == {"partial": 1}


@pytest.mark.parametrize(("store", "value", "sem", "error", "text"), [
    ("memory", {"a": 1}, COMP, ConfigurationError, "capture it in a durable store (FileSnapshots(directory))"),
    ("file", {"a": 1}, IRR, ConfigurationError, "declare the step COMPENSABLE with a restore compensation"),
    ("file", {"token": "sk_live_4eC39HqLyjWDarjtT1zdp7dc"}, COMP, SecretDetected, "value['token']"),
    ("file", {"when": object()}, COMP, NotSerializable, "value['when']"),
    ("file", {"a": 1}, "SOMETIMES", ConfigurationError, "SOMETIMES"),
])
async def test_what_cannot_be_snapshotted_safely_is_refused_naming_the_fix(
    tmp_path: Path, wal_path: Path, store: str, value: Any, sem: Any, error: type, text: str,
) -> None:
    snaps: Any = InProcessSnapshots() if store == "memory" else FileSnapshots(tmp_path / "snaps")
    wal = FileWAL(wal_path)
    try:
        async with saga_scope(wal) as saga:
            with pytest.raises(error) as e:
                await snaps.capture(saga, "thing", value, sem)
            assert text in str(e.value)
            with pytest.raises(ConfigurationError, match="key 'has space' is not a valid id"):
                await snaps.capture(saga, "has space", {}, REV)
    finally:
        wal.close()
    with pytest.raises(ConfigurationError, match=r"capture\(\) takes the Saga of a saga_scope"):
        await snaps.capture("a-saga-id", "thing", {}, REV)
    if store == "file":
        assert snaps.ids() == []  # nothing refused was written


async def test_gc_collects_only_cleanly_resolved_sagas_and_keeps_the_rest(tmp_path: Path, wal_path: Path) -> None:
    store = FileSnapshots(tmp_path / "snaps")
    wal = FileWAL(wal_path)
    try:
        async with saga_scope(wal, saga_id="open-here") as live:
            kept_live = await store.capture(live, "a", {"v": 1})
            # a saga that completed but whose boundary did not discard (a crash after the
            # terminal record): the log says it ended cleanly, so gc collects it
            async with saga_scope(wal, saga_id="ended") as ended:
                crashed = await store.capture(ended, "b", {"v": 2})
                ended._exit_hooks.clear()  # as if the process died before its exit hooks
            report = await store.gc(wal)
            assert report.collected == (crashed.snapshot_id,)
            assert report.kept == {"open_here": 1}
        async with saga_scope(wal, saga_id="elsewhere") as gone:
            elsewhere = await store.capture(gone, "c", {"v": 3})
            gone._exit_hooks.clear()
        (tmp_path / "snaps" / "snap-0000.json").write_text("{not json")
        empty = FileWAL(tmp_path / "empty.wal")
        try:
            report = await store.gc(empty)  # a log that never saw the saga: keep
        finally:
            empty.close()
        assert report.collected == () and report.kept == {"not_in_log": 1, "unreadable": 1}
        report = await store.gc(wal)
        assert report.collected == (elsewhere.snapshot_id,) and report.kept == {"unreadable": 1}
    finally:
        wal.close()
    assert kept_live.snapshot_id not in store.ids()  # its own boundary discarded it
    with pytest.raises(ConfigurationError, match="gc\\(\\) reads a BaseWAL or an iterable of Record"):
        await store.gc(42)
