"""Offline mesh sagas on real device logs (MeshWAL = a stamped FileWAL per device): the
engine runs sagas on two offline devices, `agent-saga mesh merge` unions their replicas
without rewriting a line, `mesh verify` checks each chain and names conflicts, a live
device log is never overwritten, and the Lamport clock orders what a device did after a
sync after what it had seen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_saga import Compensation, ConfigurationError, SagaError, saga_scope
from agent_saga.cli import main
from agent_saga.mesh import MeshView, MeshWAL, RecordSet


async def run_saga(wal: MeshWAL, name: str, *, fail: bool = False) -> None:
    undone: list[str] = []

    async def boom() -> None:
        raise ValueError("offline card reader declined")

    try:
        async with saga_scope(wal, name=name) as saga:
            await saga.execute("ledger.hold", "COMPENSABLE", lambda: f"{name}-hold",
                               lambda r: Compensation(fn=lambda: undone.append(r)))
            if fail:
                await saga.execute("card.charge", "COMPENSABLE", boom,
                                   lambda r: Compensation(fn=lambda: undone.append("never")))
    except ValueError:
        assert fail and undone == [f"{name}-hold"]


async def test_two_offline_devices_merge_verify_and_order_causally(tmp_path: Path, capsys) -> None:
    a = MeshWAL(tmp_path / "laptop", "laptop")
    b = MeshWAL(tmp_path / "tablet", "tablet")
    await run_saga(a, "order-1")
    await run_saga(b, "order-2", fail=True)
    # The tablet syncs from the laptop, observes its clock, then acts.
    seen, damage = RecordSet.load(tmp_path / "laptop")
    assert not damage
    b.observe(seen)
    await b.barrier(b.append("NOTE", "order-2", None, {"after": "sync"}))
    a.close()
    b.close()

    out = tmp_path / "merged"
    assert main(["mesh", "merge", str(tmp_path / "laptop"), str(tmp_path / "tablet"), "--out", str(out)]) == 0
    assert "2 device logs" in capsys.readouterr().out
    # Every merged line is a line its device wrote, byte for byte.
    for dev in ("laptop", "tablet"):
        assert (out / f"{dev}.wal").read_bytes() == (tmp_path / dev / f"{dev}.wal").read_bytes()
    # Merging again, in the other order, changes nothing (idempotent, commutative).
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["mesh", "merge", str(tmp_path / "tablet"), str(tmp_path / "laptop"), "--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.suffix == ".wal"} == before
    capsys.readouterr()

    assert main(["mesh", "verify", str(out), "--order", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["conflicts"] == [] and set(report["devices"]) == {"laptop", "tablet"}
    order = report["order"]
    last_laptop = max(i for i, r in enumerate(order) if r["device"] == "laptop")
    note = next(i for i, r in enumerate(order) if r["type"] == "NOTE")
    assert note > last_laptop  # written after the tablet saw all of the laptop's records


async def test_conflicts_and_a_tampered_copy_fail_verify_naming_each(tmp_path: Path, capsys) -> None:
    a = MeshWAL(tmp_path / "a", "dev-a")
    b = MeshWAL(tmp_path / "b", "dev-b")
    a.claim("seat-12A", "trip-1")
    b.claim("seat-12A", "trip-2")
    a.barrier_sync()
    b.barrier_sync()
    a.close()
    b.close()
    assert main(["mesh", "verify", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (conflict,) = report["conflicts"]
    assert conflict["kind"] == "entity" and {s["saga"] for s in conflict["sides"]} == {"trip-1", "trip-2"}
    assert all(d["ok"] for d in report["devices"].values())

    # A copy of dev-a's log altered on another replica: both versions kept, the fork named.
    copy = tmp_path / "copy"
    copy.mkdir()
    line = (tmp_path / "a" / "dev-a.wal").read_text()
    (copy / "dev-a.wal").write_text(line.replace("seat-12A", "seat-99Z"))
    assert main(["mesh", "verify", str(tmp_path / "a"), str(copy)]) == 1
    text = capsys.readouterr().out
    assert "CONFLICT fork: device dev-a has 2 versions of seq 1" in text
    assert "payload does not match its digest" in text and "NOT OK" in text


def test_a_live_device_log_is_never_overwritten(tmp_path: Path, capsys) -> None:
    live = MeshWAL(tmp_path / "phone", "phone")
    live.barrier_sync(live.append("NOTE", "s-1"))
    other = MeshWAL(tmp_path / "hub", "hub")
    other.barrier_sync(other.append("NOTE", "s-2"))
    other.close()
    before = live.path.read_bytes()
    assert main(["mesh", "merge", str(tmp_path / "hub"), "--out", str(tmp_path / "phone")]) == 2
    assert "a merge never overwrites a device's own log" in capsys.readouterr().err
    assert live.path.read_bytes() == before
    live.close()


def test_bad_input_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="device 'a/b' is not a valid device id"):
        MeshWAL(tmp_path, "a/b")
    wal = MeshWAL(tmp_path, "dev")
    with pytest.raises(ConfigurationError, match="payload key 'mesh' is reserved"):
        wal.append("NOTE", "s-1", None, {"mesh": 1})
    with pytest.raises(ConfigurationError, match="entity must be a non-empty string"):
        wal.claim("", "s-1")
    with pytest.raises(ConfigurationError, match="does not exist"):
        RecordSet.load(tmp_path / "nowhere")
    wal.close()
    assert main(["mesh", "merge", str(tmp_path), "--out", str(wal.path)]) == 2
    assert main(["mesh", "verify", str(tmp_path / "nowhere")]) == 2


async def test_compaction_is_refused_and_the_clock_resumes_on_reopen(tmp_path: Path) -> None:
    wal = MeshWAL(tmp_path, "dev")
    for i in range(3):
        wal.append("NOTE", "s-1", None, {"i": i})
    with pytest.raises(SagaError, match="does not implement compact"):
        await wal.compact()
    wal.close()
    again = MeshWAL(tmp_path, "dev")
    assert again.clock == 3
    again.barrier_sync(again.append("NOTE", "s-1"))
    again.close()
    recs, _ = RecordSet.load(tmp_path)
    view = MeshView(recs)
    assert view.ok and [r.payload["mesh"]["lamport"] for _d, r in view.ordered()] == [1, 2, 3, 4]
