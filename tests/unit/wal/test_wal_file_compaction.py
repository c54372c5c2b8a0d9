"""FileWAL.compact: keeps unresolved sagas, attests what left, atomic, serialised with appends."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from agent_saga import ConfigurationError, FileWAL, WALClosed, WALError, verify_records
from agent_saga.chain import removal_digest
from agent_saga.wal.compaction import CompactionAborted
from agent_saga.wal.file import iter_file_records
from fixtures.wal import records


def verify(path: Path):
    return verify_records(iter_file_records(path))


def saga(wal: FileWAL, sid: str, *, done: bool) -> None:
    wal.append("SAGA_STARTED", sid, None, {"name": "pay"})
    wal.append("STEP_INTENT", sid, f"{sid}/0", {"tool": "stripe.charge", "amount": 4200})
    wal.append("STEP_COMMITTED", sid, f"{sid}/0", {"tool": "stripe.charge"})
    if done:
        wal.append("SAGA_COMPLETED", sid, None, {})


async def test_compaction_keeps_unresolved_and_attests_what_left(tmp_path: Path) -> None:
    p = tmp_path / "c.wal"
    wal = FileWAL(p)
    for i in range(6):
        saga(wal, f"s-{i}", done=i % 2 == 0)
    await wal.barrier()
    before = {r.seq: r for r in records(p)}
    report = await wal.compact()
    after = records(p)
    wal.close()

    kept = {r.saga for r in after if r.saga != "wal"}
    assert kept == {"s-1", "s-3", "s-5"}
    removed = sorted(seq for seq, r in before.items() if r.saga in {"s-0", "s-2", "s-4"})
    assert report.removed == len(removed) == 12 and report.sagas_removed == 3
    assert report.kept == 9 and report.attestation_seq == 22
    att = after[-1]
    assert att.type == "COMPACTION" and att.saga == "wal" and att.seq == 22
    assert att.payload["count"] == 12
    assert att.payload["digest"] == removal_digest(before[s].hash for s in removed) == report.digest
    runs = att.payload["removed"]
    assert [(a, b) for a, b, _ in runs] == [(1, 4), (8, 11), (15, 18)] == list(report.runs)
    assert all(h == before[b].hash for _, b, h in runs)
    res = verify(p)
    assert res.ok and res.records == 10 and res.attested == 12, res
    assert "12 sequences removed by compaction, each attested" in res.describe()


async def test_unresolved_sagas_survive_whatever_keep_sagas_says(tmp_path: Path) -> None:
    p = tmp_path / "k.wal"
    wal = FileWAL(p)
    saga(wal, "open-1", done=False)
    saga(wal, "done-1", done=True)
    saga(wal, "done-2", done=True)
    await wal.barrier()
    await wal.compact(keep_sagas={"done-2"})
    assert {r.saga for r in records(p)} == {"open-1", "done-2", "wal"}
    await wal.compact(keep_sagas=set())  # an empty keep-set never drops an open saga
    wal.close()
    assert {r.saga for r in records(p)} == {"open-1", "wal"}
    assert verify(p).ok


async def test_attestations_survive_later_compactions(tmp_path: Path) -> None:
    p = tmp_path / "m.wal"
    wal = FileWAL(p)
    for round_ in range(4):
        saga(wal, f"a-{round_}", done=True)
        saga(wal, f"b-{round_}", done=False)
        if round_:
            wal.append("SAGA_COMPLETED", f"b-{round_ - 1}", None, {})  # last round's saga settles
        await wal.barrier()
        await wal.compact()
        assert verify(p).ok
    wal.close()
    recs = records(p)
    atts = [r for r in recs if r.type == "COMPACTION"]
    assert len(atts) == 4  # none was removed
    assert {r.saga for r in recs if r.saga != "wal"} == {"b-3"}
    res = verify(p)
    assert res.ok and res.attested == sum(a.payload["count"] for a in atts)


async def test_nothing_to_remove_appends_an_empty_attestation(tmp_path: Path) -> None:
    p = tmp_path / "e.wal"
    wal = FileWAL(p)
    saga(wal, "open", done=False)
    await wal.barrier()
    ino = os.stat(p).st_ino
    report = await wal.compact()
    wal.close()
    assert report.removed == 0 and os.stat(p).st_ino == ino  # not rewritten
    assert records(p)[-1].payload["count"] == 0 and verify(p).ok


@pytest.mark.parametrize("edit", ["delete_kept", "delete_attestation", "forge_runs", "forge_link"])
async def test_tampering_after_compaction_is_detected(tmp_path: Path, edit: str) -> None:
    p = tmp_path / "t.wal"
    wal = FileWAL(p)
    for i in range(4):
        saga(wal, f"s-{i}", done=i % 2 == 0)
    await wal.barrier()
    await wal.compact()
    saga(wal, "later", done=False)
    await wal.barrier()
    wal.close()
    lines = p.read_bytes().splitlines(keepends=True)
    idx = next(i for i, ln in enumerate(lines) if b'"type":"COMPACTION"' in ln)
    if edit == "delete_kept":
        del lines[0]  # a record of an unresolved saga: no attestation names it
    elif edit == "delete_attestation":
        del lines[idx]
    elif edit == "forge_runs":
        # Claim one more sequence left: the record's digest no longer matches.
        d = json.loads(lines[idx])
        d["payload"]["removed"][0][1] += 1
        lines[idx] = (json.dumps(d, separators=(",", ":")) + "\n").encode()
    else:
        # Re-link the record after the gap to a different hash: the attested link fails.
        first_after_gap = 0
        d = json.loads(lines[first_after_gap])
        d["prev"] = "f" * 64
        lines[first_after_gap] = (json.dumps(d, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    p.write_bytes(b"".join(lines))
    res = verify(p)
    assert not res.ok and res.reason, res


async def test_appends_during_compaction_land_after_the_attestation(tmp_path: Path) -> None:
    p = tmp_path / "r.wal"
    hold = threading.Event()
    reached = threading.Event()

    def hook(point: str) -> None:
        if point == "before_compact":
            reached.set()
            hold.wait(10)

    wal = FileWAL(p, fault_hook=hook)
    for i in range(20):
        saga(wal, f"s-{i}", done=True)
    await wal.barrier()
    task = asyncio.ensure_future(wal.compact())
    assert await asyncio.to_thread(reached.wait, 5)
    late = [wal.append("STEP_INTENT", "late", "late/0", {"i": i}) for i in range(50)]
    hold.set()
    report = await task
    await wal.barrier(late[-1])
    wal.close()
    recs = records(p)
    assert report.attestation_seq == late[0] - 1
    assert [r.seq for r in recs if r.saga == "late"] == late
    assert recs[0].type == "COMPACTION" and verify(p).ok


async def test_the_lock_moves_with_the_file(tmp_path: Path) -> None:
    p = tmp_path / "l.wal"
    wal = FileWAL(p)
    saga(wal, "s-0", done=True)
    saga(wal, "s-1", done=False)
    await wal.barrier()
    await wal.compact()
    with pytest.raises(ConfigurationError, match="already open for writing"):
        FileWAL(p)
    seq = wal.append("X", "s-1")
    await wal.barrier(seq)  # the writer writes to the new file, not the replaced one
    wal.close()
    assert records(p)[-1].seq == seq and verify(p).ok
    FileWAL(p).close()


async def test_aborted_compaction_leaves_the_log_and_says_so(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"

    def hook(point: str) -> None:
        if point == "before_replace":
            raise OSError(28, "No space left on device")

    wal = FileWAL(p, fault_hook=hook)
    saga(wal, "s-0", done=True)
    await wal.barrier()
    with pytest.raises(CompactionAborted, match="log is unchanged") as ei:
        await wal.compact()
    assert isinstance(ei.value, WALError) and isinstance(ei.value.__cause__, OSError)
    seq = wal.append("X", "s-1")  # the writer carries on
    await wal.barrier(seq)
    wal.close()
    recs = records(p)
    assert [r.type for r in recs[-2:]] == ["COMPACTION_FAILED", "X"]
    assert "No space left" in recs[-2].payload["error"]
    assert len(recs) == 6 and verify(p).ok
    assert not [n for n in os.listdir(tmp_path) if ".compact-" in n]


def test_crash_before_the_swap_keeps_the_old_log(tmp_path: Path) -> None:
    p = tmp_path / "crash.wal"
    code = (
        "import asyncio, os\n"
        "from agent_saga import FileWAL\n"
        "def hook(point):\n"
        "    if point == 'before_replace':\n"
        "        os._exit(17)\n"
        f"w = FileWAL({str(p)!r}, fault_hook=hook)\n"
        "for i in range(10):\n"
        "    w.append('SAGA_STARTED', f's-{i}', None, {})\n"
        "    w.append('SAGA_COMPLETED', f's-{i}', None, {})\n"
        "w.barrier_sync()\n"
        "asyncio.run(w.compact())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert r.returncode == 17
    assert len(records(p)) == 20 and verify(p).ok
    assert [n for n in os.listdir(tmp_path) if ".compact-" in n]  # the half-written temp file
    wal = FileWAL(p)  # the next writer removes it
    wal.close()
    assert not [n for n in os.listdir(tmp_path) if ".compact-" in n]


async def test_compact_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    wal = FileWAL("/dev/null")
    with pytest.raises(ConfigurationError, match="not a regular file"):
        await wal.compact()
    wal.close()
    wal = FileWAL(tmp_path / "x.wal")
    wal.close()
    with pytest.raises(WALClosed):
        await wal.compact()


async def test_torn_tail_note_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "torn.wal"
    wal = FileWAL(p)
    saga(wal, "s-0", done=True)
    await wal.barrier()
    wal.close()
    with open(p, "ab") as f:
        f.write(b'{"v":1,"se')
    wal = FileWAL(p)
    await wal.compact()
    wal.close()
    assert [r.type for r in records(p)] == ["WAL_TORN_TAIL", "COMPACTION"]
    assert verify(p).ok
