"""FileWAL(sealer="process") against the system: the sealer's own system calls (traced
with strace), a frozen ext4 disk and a tmpfs that fills under the sealer process."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from agent_saga import FileWAL, WALError, WALStalled, verify_records
from agent_saga.wal.file import iter_file_records
from fixtures.disks import FreezableDisk, SmallTmpfs
from fixtures.polling import until
from fixtures.procs import MissingPart

STALL = 2.0


async def test_the_sealer_answers_a_batch_only_after_its_fdatasync(tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        raise MissingPart("strace not found: install it (apt-get install strace)")
    wal = FileWAL(tmp_path / "p.wal", sealer="process")
    sealer = wal._sealer
    assert sealer is not None
    # The child keeps the parent's descriptor numbers (pass_fds): the log's and the reply pipe's.
    log_fd = wal._fd
    reply_fd = int(Path(f"/proc/{sealer.pid}/cmdline").read_bytes().split(b"\0")[8])
    trace = tmp_path / "trace"
    tracer = subprocess.Popen(
        ["strace", "-p", str(sealer.pid), "-e", "trace=write,writev,fdatasync", "-o", str(trace)],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        assert tracer.stderr is not None
        line = tracer.stderr.readline()
        if "attached" not in line:
            raise MissingPart(f"strace cannot attach to the sealer ({line.strip()}): run as root or with CAP_SYS_PTRACE")
        for n in range(3):
            for i in range(5):
                wal.append("STEP_INTENT", "s-1", None, {"n": n, "i": i})
            await wal.barrier()
    finally:
        tracer.terminate()
        tracer.wait()
        tracer.stderr.close()  # type: ignore[union-attr]
    wal.close()
    calls = [x for x in trace.read_text().splitlines() if x.startswith(("write(", "writev(", "fdatasync("))]
    # Each batch: the line(s) written to the log, the log fdatasync'ed, then the answer.
    answers = [i for i, c in enumerate(calls) if c.startswith(f"writev({reply_fd},")]
    assert len(answers) >= 3, calls
    last = -1
    for i in answers:
        batch = calls[last + 1 : i]
        assert batch and batch[-1].startswith(f"fdatasync({log_fd})") and batch[-1].endswith("= 0"), batch
        assert any(c.startswith(f"write({log_fd},") for c in batch[:-1]), batch
        last = i
    assert verify_records(iter_file_records(tmp_path / "p.wal")).last_seq == 15


async def test_a_frozen_disk_under_the_sealer_stalls_the_writer_within_its_bound(tmp_path: Path) -> None:
    with FreezableDisk(tmp_path) as disk:
        path = disk.mnt / "saga.wal"
        wal = FileWAL(path, stall_timeout=STALL, sealer="process")
        await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
        disk.freeze()
        try:
            seq = wal.append("STEP_INTENT", "s-1", None, {"i": 1})
            with pytest.raises(WALStalled, match=f"seq {seq} not durable within {STALL}s"):
                await wal.barrier(seq)
            with pytest.raises(WALStalled, match="stalled earlier"):
                wal.append("STEP_INTENT", "s-1", None, {"i": 2})
            with pytest.raises(WALStalled, match="stalled before close"):
                wal.close()  # at once: the sealer is stuck in the write
        finally:
            disk.thaw()
        # The write in flight lands once the disk thaws; the flusher then releases the
        # file and the sealer process exits.
        until("the flusher to return", lambda: wal._flusher is not None and not wal._flusher.is_alive())
        sealer = wal._sealer
        assert sealer is not None
        until("the sealer to exit", lambda: sealer._proc.poll() is not None)
        result = verify_records(iter_file_records(path))
        assert result.ok and result.last_seq == 2, result.describe()


async def test_a_tmpfs_that_fills_under_the_sealer_fails_the_writer_with_enospc(tmp_path: Path) -> None:
    with SmallTmpfs(tmp_path, size_kb=256) as fs:
        path = fs.mnt / "saga.wal"
        wal = FileWAL(path, sealer="process")
        await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
        fs.fill(leave=0)
        with pytest.raises(WALError) as info:
            for i in range(2000):  # the disk is full: a batch fails long before the end
                await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": i, "pad": "x" * 512}))
        assert not isinstance(info.value, WALStalled)
        cause = info.value.__cause__
        assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC, repr(cause)
        assert "No space left on device" in str(info.value)
        with pytest.raises(WALError, match="failed earlier"):
            wal.append("STEP_INTENT", "s-1", None, {"i": -1})
        with pytest.raises(WALError, match="failed before close"):
            wal.close()
        fs.free()
        again = FileWAL(path)  # the lock is free; a torn tail, if any, is set aside
        again.close()
        result = verify_records(iter_file_records(path))
        assert result.ok, result.describe()
        assert os.path.exists(path)
