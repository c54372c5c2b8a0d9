"""A real process SIGKILLed mid-saga: the recovery daemon settles its tentative resources
and restores its steps from durable snapshots, which a GC sweeping all along never took.

One child runs two sagas at once and is killed while both are open:
- ``keep``: a tentative order with a named rollback handler, then five COMPENSABLE steps
  each preceded by a durable snapshot (the parent runs ``gc`` between the child's steps);
- ``local``: a tentative order whose rollback is a callable (in-process only).
Recovery must cancel the first order, restore the five snapshots newest first, and
escalate the second order to a human (never guessed); gc then collects exactly the
snapshots of the saga that ended cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from agent_saga import FileSnapshots, RecoveryDaemon
from agent_saga.compensation import unregister_compensator
from fixtures.polling import until

HANDLERS = textwrap.dedent(
    """
    import json
    from agent_saga import FileSnapshots, compensator

    def _out(path, doc):
        with open(path, "a") as f:
            f.write(json.dumps(doc) + "\\n")

    @compensator("isocrash.cancel")
    def cancel(order_id, out, idempotency_key):
        _out(out, {"cancel": order_id, "key": idempotency_key})

    @compensator("isocrash.restore")
    def restore(snapshot_id, snapshots, out):
        _out(out, {"restore": FileSnapshots(snapshots).load(snapshot_id).value})
    """
)

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    import isocrash_handlers
    from agent_saga import (ActionSemantics, Compensation, FileSnapshots, FileWAL, TentativeResource,
                            saga_scope)

    wal_path, snaps, out, progress = sys.argv[1:5]
    store = FileSnapshots(snaps)

    def note(text):
        tmp = progress + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, progress)

    async def step_gate(i):
        # wait for the parent to have run a gc sweep since step i-1 (a file it writes)
        while not os.path.exists(f"{progress}.gc{i}"):
            await asyncio.sleep(0.005)

    async def keep(wal, local_ready):
        async with saga_scope(wal, saga_id="keep", lease_seconds=0.3) as saga:
            await TentativeResource("order-9", rollback="isocrash.cancel",
                                    kwargs={"order_id": "order-9", "out": out}).register(saga)
            for i in range(5):
                await step_gate(i)
                snap = await store.capture(saga, "config/web", {"replicas": i})
                await saga.execute("config.write", ActionSemantics.COMPENSABLE, forward=lambda: None,
                                   compensate=lambda r, s=snap: Compensation(
                                       handler="isocrash.restore", kwargs={**s.ref(), "snapshots": snaps, "out": out}))
                note(f"step {i} {snap.snapshot_id}")
            await local_ready.wait()
            open(progress + ".ready", "w").close()
            await asyncio.Event().wait()

    async def local(wal, local_ready):
        async with saga_scope(wal, saga_id="local", lease_seconds=0.3) as saga:
            await TentativeResource("order-10", rollback=lambda order_id: None,
                                    kwargs={"order_id": "order-10"}).register(saga)
            local_ready.set()
            await asyncio.Event().wait()

    async def main():
        wal = FileWAL(wal_path)
        ready = asyncio.Event()
        await asyncio.gather(keep(wal, ready), local(wal, ready))

    asyncio.run(main())
    """
)


@pytest.mark.crash
async def test_recovery_settles_the_tentative_resources_and_restores_from_snapshots_gc_never_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "isocrash_handlers.py").write_text(HANDLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    wal_path, snaps, out, progress = (tmp_path / n for n in ("iso.wal", "snaps", "out.jsonl", "progress"))
    store = FileSnapshots(snaps)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(wal_path), str(snaps), str(out), str(progress)],
                             env=env, stderr=subprocess.PIPE, text=True)
    try:
        taken: list[str] = []
        for i in range(5):  # a gc sweep while the saga is live, between each of its steps
            report = await store.gc(iter_records(wal_path))
            taken += report.collected
            (tmp_path / f"progress.gc{i}").touch()
            until(f"step {i}", lambda i=i: progress.exists() and progress.read_text().startswith(f"step {i}"),
                  proc=child, timeout=60)
        until("both sagas open", (tmp_path / "progress.ready").exists, proc=child, timeout=60)
        report = await store.gc(iter_records(wal_path))
        taken += report.collected
        assert taken == [], "gc collected a snapshot of a live saga"
        assert len(store.ids()) == 5
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stderr:
            child.stderr.close()

    # The owner is gone; both sagas are unresolved in the log: gc still keeps everything.
    report = await store.gc(iter_records(wal_path))
    assert report.collected == () and report.kept == {"unresolved": 5}

    try:
        daemon = RecoveryDaemon(wal_path, imports=["isocrash_handlers"], clock=lambda: time.time() + 3600)
        async with daemon:
            sweep = await daemon.sweep()
            escalations = await daemon.ledger.escalations()
    finally:
        for name in ("isocrash.cancel", "isocrash.restore"):
            unregister_compensator(name)
        sys.modules.pop("isocrash_handlers", None)
    results = {r.saga_id: r for r in sweep.results}
    assert results["keep"].status == "ROLLED_BACK"
    assert results["local"].status == "ROLLBACK_PARTIAL"
    (escalation,) = escalations  # the in-process rollback: handed to a human, never guessed
    assert (escalation.saga_id, escalation.tool, escalation.kind) == ("local", "tentative.resource", "NOT_REPLAYABLE")
    assert escalation.compensation is not None and escalation.compensation["kwargs"] == {"order_id": "order-10"}
    calls = [json.loads(line) for line in out.read_text().splitlines()]
    assert calls[:5] == [{"restore": {"replicas": i}} for i in (4, 3, 2, 1, 0)]  # newest first
    assert calls[5]["cancel"] == "order-9" and len(calls) == 6

    report = await store.gc(iter_records(wal_path))
    assert len(report.collected) == 5 and store.ids() == []


def iter_records(path: Path) -> Any:
    from agent_saga.wal.file import iter_file_records

    return iter_file_records(path) if path.exists() else []
