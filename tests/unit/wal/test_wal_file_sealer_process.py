"""FileWAL(sealer="process"): a real child process seals, writes and fdatasyncs the batches.

Every test runs real processes: the sealer child, a parent killed with SIGKILL, a child
stopped with SIGSTOP (a wedged sealer) or killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga import (
    Backpressure,
    ConfigurationError,
    FileWAL,
    WALBackpressure,
    WALError,
    WALStalled,
    verify_records,
)
from agent_saga.cli import main as cli_main
from agent_saga.wal.file import iter_file_records
from agent_saga.wal.prepared import PreparedPayload
from fixtures.polling import until, until_async

MODES = ("thread", "process")


class Color(enum.StrEnum):
    RED = "red"


class Tagged(dict):  # type: ignore[type-arg]
    """A dict subclass: marshal cannot carry it, the seal encodes it as a dict."""


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_bytes().splitlines()]


def verified(path: Path) -> int:
    res = verify_records(iter_file_records(path))
    assert res.ok, res.describe()
    return res.last_seq


def content(path: Path) -> list[tuple[Any, ...]]:
    """What a log says, without what is random or a clock (salt, digest, hash, prev, ts)."""
    return [(d["seq"], d["type"], d["saga"], d["step"], d["payload"]) for d in lines(path)]


def state(pid: int) -> str:
    """The process state letter from /proc (R, S, T, Z...), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


@pytest.fixture
def opened() -> Iterator[list[FileWAL]]:
    """WALs a test opened; each is closed (and a stopped sealer continued) at the end."""
    wals: list[FileWAL] = []
    yield wals
    for wal in wals:
        pid = wal.sealer_pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):  # it may have exited meanwhile
                os.kill(pid, signal.SIGCONT)
        try:
            wal.close()
        except WALError:
            pass


async def wal_took_everything(wal: FileWAL) -> None:
    """Wait until the flusher took every queued record (handed it to the sealer)."""
    await until_async("the flusher to take the queue", lambda: not wal.stats().pending)


def try_open(path: Path) -> FileWAL | None:
    """A new writer on ``path``, or None while another process holds its lock."""
    try:
        return FileWAL(path)
    except ConfigurationError:
        return None


def open_wal(opened: list[FileWAL], path: Path, **kw: Any) -> FileWAL:
    wal = FileWAL(path, **kw)
    opened.append(wal)
    return wal


# ---------------------------------------------------------------------- the same log


def append_mixed(wal: FileWAL) -> dict[str, int]:
    """Records of every kind the seal treats specially; returns their seqs by name."""
    seqs = {
        "plain": wal.append("STEP_INTENT", "s-1", "s-1/1", {"tool": "stripe.charge", "n": 1, "x": 1.5}),
        "nested": wal.append("STEP_COMMITTED", "s-1", "s-1/1", {"r": {"id": "ch_1", "ok": True, "l": [1, None]}}),
        "secret": wal.append("STEP_INTENT", "s-1", "s-1/2", {"password": "hunter2-hunter2", "keep": "me"}),
        "subclass": wal.append("STEP_INTENT", "s-1", "s-1/3", Tagged(color=Color.RED, n=2)),
        "subclass-secret": wal.append("STEP_INTENT", "s-1", "s-1/4", Tagged(api_key="sk_live_abcdefghijklmnop1234")),
        "enum-type": wal.append(Color.RED, "s-1", None, {"a": 1}),
        "set": wal.append("STEP_INTENT", "s-2", None, {"bad": {1, 2}}),
        "nan": wal.append("STEP_INTENT", "s-2", None, {"bad": math.nan}),
        "bytes": wal.append("STEP_INTENT", "s-2", None, {"bad": b"\x00"}),
        "subclass-unencodable": wal.append("STEP_INTENT", "s-2", None, Tagged(bad=object())),
        "prepared": wal.append_prepared("ROUTE", "s-3", None, PreparedPayload('{"host":"a.example"}')),
        "prepared-bad": wal.append_prepared("ROUTE", "s-3", None, PreparedPayload(_refuse)),
        "none": wal.append("SAGA_COMPLETED", "s-3", None, None),
    }
    return seqs


def _refuse() -> str:
    raise TypeError("this payload cannot be built")


async def outcomes(wal: FileWAL, seqs: dict[str, int]) -> dict[str, str | None]:
    """What a fence for each record says: None (durable) or its error, without the WAL's name."""
    out: dict[str, str | None] = {}
    for name, seq in seqs.items():
        try:
            await wal.barrier(seq)
            out[name] = None
        except WALError as exc:
            out[name] = str(exc).split(": ", 1)[1]
    return out


async def test_the_same_records_give_the_same_log_in_both_modes(tmp_path: Path, opened: list[FileWAL]) -> None:
    logs: dict[str, list[tuple[Any, ...]]] = {}
    said: dict[str, dict[str, str | None]] = {}
    for mode in MODES:
        path = tmp_path / f"{mode}.wal"
        wal = open_wal(opened, path, sealer=mode)
        said[mode] = await outcomes(wal, append_mixed(wal))
        wal.close()
        assert verified(path) == 13
        logs[mode] = content(path)
        assert cli_main(["verify", "--wal-path", str(path)]) == 0
    assert logs["process"] == logs["thread"]
    assert said["process"] == said["thread"]
    by_seq = {row[0]: row for row in logs["process"]}
    # Redactions, and rejections under the same seq with the encoding error, as thread mode.
    assert by_seq[3][4] == {"password": "[REDACTED]", "keep": "me"}
    assert by_seq[4][4] == {"color": "red", "n": 2}
    assert by_seq[5][4] == {"api_key": "[REDACTED]"}
    assert by_seq[6][1] == "red"
    for seq, why in ((7, "TypeError: Object of type set"), (8, "ValueError: Out of range float"),
                     (9, "TypeError: Object of type bytes"), (10, "TypeError: Object of type object"),
                     (12, "TypeError: this payload cannot be built")):
        assert by_seq[seq][1] == "RECORD_REJECTED"
        assert by_seq[seq][4]["error"].startswith(why), by_seq[seq]
    assert by_seq[11][4] == {"host": "a.example"}
    assert said["process"]["set"] == "record seq 7 was rejected: Object of type set is not JSON serializable"
    assert said["process"]["prepared-bad"] == "record seq 12 was rejected: this payload cannot be built"
    assert said["process"]["plain"] is None


async def test_a_rejected_records_waiter_gets_the_encoding_error_as_its_cause(tmp_path: Path, opened: list[FileWAL]) -> None:
    wal = open_wal(opened, tmp_path / "p.wal", sealer="process")
    child_side = wal.append("STEP_INTENT", "s-1", None, {"bad": math.inf})  # marshal carries it
    parent_side = wal.append("STEP_INTENT", "s-1", None, Tagged(bad={1}))  # marshal does not
    for seq, cls in ((child_side, ValueError), (parent_side, TypeError)):
        with pytest.raises(WALError, match=f"record seq {seq} was rejected") as info:
            await wal.barrier(seq)
        assert type(info.value.__cause__) is cls
    assert wal.stats().durable_seq == parent_side  # the chain has no gap


async def test_the_scrubbers_warning_is_logged_by_the_parent(tmp_path: Path, opened: list[FileWAL],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    wal = open_wal(opened, tmp_path / "p.wal", sealer="process")
    with caplog.at_level(logging.WARNING, logger="agent_saga.secrets"):
        await wal.barrier(wal.append("STEP_INTENT", "s-9", None, {"password": "hunter2-hunter2"}))
    warned = [r for r in caplog.records if r.name == "agent_saga.secrets"]
    assert len(warned) == 1
    assert "redacted from a STEP_INTENT record of saga s-9" in warned[0].getMessage()
    assert "hunter2" not in caplog.text


async def test_reopening_in_the_other_mode_continues_sequence_and_chain(tmp_path: Path, opened: list[FileWAL]) -> None:
    path = tmp_path / "mixed.wal"
    n = 0
    for mode in ("thread", "process", "thread", "process"):
        wal = open_wal(opened, path, sealer=mode)
        assert wal.head[0] == n
        for i in range(50):
            wal.append("STEP_INTENT", f"s-{mode}", None, {"i": i})
        await wal.barrier()
        n += 50
        assert wal.head == (n, lines(path)[-1]["hash"])  # the child's head is the disk's
        wal.close()
        assert verified(path) == n
    assert [d["seq"] for d in lines(path)] == list(range(1, n + 1))


# ---------------------------------------------------------------------- fences


async def test_a_fence_resolves_only_after_the_child_wrote_its_batch(tmp_path: Path, opened: list[FileWAL]) -> None:
    path = tmp_path / "p.wal"
    wal = open_wal(opened, path, sealer="process")
    await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
    pid = wal.sealer_pid
    assert pid is not None and pid != os.getpid()
    os.kill(pid, signal.SIGSTOP)  # the sealer cannot seal, write or sync
    try:
        seq = wal.append("STEP_INTENT", "s-1", None, {"i": 1})
        fence = asyncio.ensure_future(wal.barrier(seq))
        await wal_took_everything(wal)  # the batch is with the stopped sealer
        await asyncio.sleep(0.1)  # not a wait for something: room for a wrong early wake-up
        assert not fence.done()
        assert wal.stats().durable_seq == seq - 1
        assert [d["seq"] for d in lines(path)] == [1]
    finally:
        os.kill(pid, signal.SIGCONT)
    await fence
    assert [d["seq"] for d in lines(path)] == [1, 2]
    assert wal.head == (2, lines(path)[-1]["hash"])
    assert wal.stats().syncs == 2


def test_barrier_sync_from_a_thread(tmp_path: Path, opened: list[FileWAL]) -> None:
    wal = open_wal(opened, tmp_path / "p.wal", sealer="process")
    seq = wal.append("STEP_INTENT", "s-1", None, {"i": 0})
    wal.barrier_sync(seq)
    assert wal.stats().durable_seq == seq


# ---------------------------------------------------------------------- the child dies


async def test_a_killed_sealer_fails_every_waiter_and_every_later_call(tmp_path: Path, opened: list[FileWAL]) -> None:
    path = tmp_path / "p.wal"
    wal = open_wal(opened, path, sealer="process", stall_timeout=30)
    await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
    pid = wal.sealer_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # hold the next batch in the child, then kill it there
    seqs = [wal.append("STEP_INTENT", "s-1", None, {"i": i}) for i in range(1, 4)]
    fences = [asyncio.ensure_future(wal.barrier(s)) for s in seqs]
    await wal_took_everything(wal)  # the batch is with the stopped sealer: kill it there
    os.kill(pid, signal.SIGKILL)
    results = await asyncio.gather(*fences, return_exceptions=True)
    for res in results:  # the death, named, not a stall after stall_timeout
        assert isinstance(res, WALError) and not isinstance(res, WALStalled), res
        assert "sealer process" in str(res) and "killed by SIGKILL" in str(res)
    with pytest.raises(WALError, match="failed earlier.*killed by SIGKILL"):
        wal.append("STEP_INTENT", "s-1", None, {"i": 9})
    failed = wal.stats().failed
    assert failed is not None and "SIGKILL" in failed
    with pytest.raises(WALError, match="failed before close"):
        wal.close()
    # The lock is free and the log verifies; nothing after seq 1 was acknowledged.
    again = open_wal(opened, path, sealer="process")
    assert again.head[0] == verified(path) >= 1


async def test_a_sealer_killed_between_batches_fails_the_next_one(tmp_path: Path, opened: list[FileWAL]) -> None:
    wal = open_wal(opened, tmp_path / "p.wal", sealer="process")
    await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
    pid = wal.sealer_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WALError, match=r"sealer process \(pid \d+\) was killed by SIGKILL before it acknowledged seq 2\.\.2"):
        await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 1}))


async def test_a_failed_write_in_the_child_fails_the_writer_with_the_os_error(opened: list[FileWAL]) -> None:
    # /dev/full: every write fails with ENOSPC, a real failure of the device.
    said = {}
    for mode in MODES:
        wal = open_wal(opened, Path("/dev/full"), sealer=mode)
        with pytest.raises(WALError) as info:
            await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
        assert isinstance(info.value.__cause__, OSError)
        said[mode] = str(info.value)
    assert "[Errno 28] No space left on device" in said["process"]
    assert said["process"] == said["thread"]


# ---------------------------------------------------------------------- the parent dies


PARENT = r"""
import asyncio, sys
from agent_saga import FileWAL

async def main():
    wal = FileWAL(sys.argv[1], sealer="process")
    print("sealer", wal.sealer_pid, flush=True)
    i = 0
    while True:
        for _ in range(20):
            i += 1
            wal.append("STEP_INTENT", "s-1", None, {"i": i})
        await wal.barrier()
        print("durable", wal.head[0], flush=True)

asyncio.run(main())
"""


def test_a_killed_parent_leaves_a_log_that_verifies_and_holds_what_was_durable(tmp_path: Path) -> None:
    path = tmp_path / "p.wal"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline().split()
    assert first[0] == "sealer", first
    sealer = int(first[1])
    acked = 0
    for _ in range(30):  # let it commit some batches, then kill it mid-stream
        line = proc.stdout.readline().split()
        assert line[0] == "durable", line
        acked = int(line[1])
    proc.kill()
    proc.wait()
    proc.stdout.close()
    # The sealer sees end of file and exits, releasing the lock: a new writer can open.
    wal = until(f"the sealer (pid {sealer}) to let go of the log", lambda: try_open(path))
    assert wal is not None
    try:
        assert state(sealer) in ("gone", "Z")
        last = verified(path)
        assert last >= acked >= 600
        assert [d["payload"]["i"] for d in lines(path)] == list(range(1, last + 1))
        assert wal.head[0] == last  # and the new writer continues the chain
    finally:
        wal.close()


# ---------------------------------------------------------------------- close, stats, bounds


async def test_close_drains_the_queue_and_joins_the_child(tmp_path: Path) -> None:
    path = tmp_path / "p.wal"
    wal = FileWAL(path, sealer="process")
    for i in range(500):
        wal.append("STEP_INTENT", "s-1", None, {"i": i})  # nobody waits: close writes them
    sealer = wal._sealer
    assert sealer is not None
    wal.close()
    assert sealer._proc.returncode == 0  # joined, and it exited cleanly on end of file
    st = wal.stats()
    assert (st.appended_seq, st.durable_seq, st.pending, st.failed) == (500, 500, 0, None)
    assert st.syncs == st.batches >= 1
    assert wal.head == (500, lines(path)[-1]["hash"])
    assert verified(path) == 500


async def test_backpressure_raise_over_a_wedged_sealer_never_drops(tmp_path: Path, opened: list[FileWAL]) -> None:
    wal = open_wal(opened, tmp_path / "p.wal", sealer="process", max_pending=5)
    await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
    pid = wal.sealer_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    wal.append("STEP_INTENT", "s-1", None, {"i": 1})
    await wal_took_everything(wal)  # the flusher took that one and waits on the stopped child
    for i in range(5):
        wal.append("STEP_INTENT", "s-1", None, {"i": i + 2})
    with pytest.raises(WALBackpressure, match="max_pending=5"):
        wal.append("STEP_INTENT", "s-1", None, {"i": 99})
    os.kill(pid, signal.SIGCONT)
    await wal.barrier()
    assert [d["payload"]["i"] for d in lines(tmp_path / "p.wal")] == list(range(7))


async def test_backpressure_block_over_a_wedged_sealer_stalls_after_its_bound(tmp_path: Path, opened: list[FileWAL]) -> None:
    wal = open_wal(opened, tmp_path / "p.wal", sealer="process", max_pending=2,
                   backpressure=Backpressure.BLOCK, stall_timeout=0.5)
    await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
    pid = wal.sealer_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    wal.append("STEP_INTENT", "s-1", None, {"i": 1})
    await wal_took_everything(wal)  # with the stopped sealer
    wal.append("STEP_INTENT", "s-1", None, {"i": 2})
    wal.append("STEP_INTENT", "s-1", None, {"i": 3})  # the queue is full
    with pytest.raises(WALStalled, match=r"no room for a record within 0.5s \(max_pending=2\)"):
        wal.append("STEP_INTENT", "s-1", None, {"i": 4})
    with pytest.raises(WALStalled, match="stalled earlier"):
        wal.append("STEP_INTENT", "s-1", None, {"i": 5})


async def test_a_wedged_sealer_stalls_the_writer_within_its_bound(tmp_path: Path, opened: list[FileWAL]) -> None:
    path = tmp_path / "p.wal"
    wal = open_wal(opened, path, sealer="process", stall_timeout=0.5, backpressure=Backpressure.BLOCK, max_pending=2)
    await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
    pid = wal.sealer_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    seq = wal.append("STEP_INTENT", "s-1", None, {"i": 1})
    with pytest.raises(WALStalled, match=f"seq {seq} not durable within 0.5s"):
        await wal.barrier(seq)
    with pytest.raises(WALStalled):
        wal.append("STEP_INTENT", "s-1", None, {"i": 2})  # at once, chained to the first stall
    with pytest.raises(WALStalled, match="stalled before close"):
        wal.close()  # returns at once; the flusher releases the file when the child answers
    os.kill(pid, signal.SIGCONT)
    # The sealer answers; the flusher then releases the file and the sealer exits.
    again = await until_async(f"{path} to be free", lambda: try_open(path))
    assert again is not None
    try:
        assert state(pid) in ("gone", "Z")
        # The batch in doubt landed when the sealer came back; the log verifies.
        assert again.head[0] == verified(path) == 2
    finally:
        again.close()


# ---------------------------------------------------------------------- refused


async def test_compaction_and_fault_hooks_are_refused_with_the_fix(tmp_path: Path, opened: list[FileWAL]) -> None:
    wal = open_wal(opened, tmp_path / "p.wal", sealer="process")
    with pytest.raises(ConfigurationError, match=r"sealer='process'.*compact with FileWAL"):
        await wal.compact()
    with pytest.raises(ConfigurationError, match=r"fault_hook.*sealer='thread'"):
        FileWAL(tmp_path / "q.wal", sealer="process", fault_hook=lambda point: None)
    with pytest.raises(ConfigurationError, match=r"sealer must be 'thread' \(the default\) or 'process', got 'proc'"):
        FileWAL(tmp_path / "q.wal", sealer="proc")
    assert not (tmp_path / "q.wal").exists()


def test_the_sealer_imports_neither_package(tmp_path: Path, opened: list[FileWAL]) -> None:
    wal = open_wal(opened, tmp_path / "p.wal", sealer="process")
    pid = wal.sealer_pid
    assert pid is not None
    # The child's own mapped Python files are not listed by /proc; its command line shows
    # the boot program, which registers empty packages instead of running their __init__.
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[1:3] == [b"-I", b"-S"]
    assert b"types.ModuleType" in argv[4] and b"child_main" in argv[4]
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c",
         argv[4].decode().replace("child_main(sys.argv[2:])",
                                  "print(sorted(m for m in sys.modules if m.startswith('agent_saga')))"),
         argv[5].decode()],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout
    assert out.strip() == str(sorted(["agent_saga", "agent_saga.wal", "agent_saga.wal.sealer", "agent_saga.chain",
                                      "agent_saga.errors", "agent_saga.records", "agent_saga.scrubber"]))


def test_a_sealer_that_cannot_start_refuses_the_open_and_frees_the_file(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.wal"
    monkeypatch.setattr(sys, "executable", "/bin/false")  # a real program that exits at once
    with pytest.raises(WALError, match=r"sealer process \(pid \d+\) did not start: it exited with status 1"):
        FileWAL(path, sealer="process")
    monkeypatch.undo()
    wal = FileWAL(path, sealer="process")  # the lock was released
    wal.close()


async def test_a_torn_tail_is_moved_aside_before_the_sealer_starts(tmp_path: Path, opened: list[FileWAL]) -> None:
    path = tmp_path / "p.wal"
    wal = open_wal(opened, path, sealer="process")
    await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
    wal.close()
    with open(path, "ab") as f:
        f.write(b'{"v":1,"seq":2,"ts":')  # a write cut short, never acknowledged
    wal = open_wal(opened, path, sealer="process")
    await wal.barrier()
    assert [d["type"] for d in lines(path)] == ["STEP_INTENT", "WAL_TORN_TAIL"]
    assert verified(path) == 2


def test_a_forked_copy_lets_go_of_the_sealers_pipes(tmp_path: Path, opened: list[FileWAL]) -> None:
    wal = open_wal(opened, tmp_path / "p.wal", sealer="process")
    sealer = wal._sealer
    assert sealer is not None
    fds = (sealer._req, sealer._rep)
    pid = os.fork()
    if pid == 0:  # the forked copy: its copies of the pipes must be closed
        code = 0
        for fd in fds:
            try:
                os.fstat(fd)
                code = 1
            except OSError:
                pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    wal.barrier_sync(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))  # the parent's pipes still work


async def test_open_wal_takes_the_option(tmp_path: Path, opened: list[FileWAL]) -> None:
    from agent_saga.wal import open_wal as open_target

    wal = open_target(str(tmp_path / "p.wal"), sealer="process")
    assert isinstance(wal, FileWAL)
    opened.append(wal)
    assert wal.sealer == "process" and wal.sealer_pid is not None
    await wal.barrier(wal.append("STEP_INTENT", "s-1", None, {"i": 0}))
    assert verified(tmp_path / "p.wal") == 1
