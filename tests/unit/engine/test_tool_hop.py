"""A sync tool's hop to the tool executor and back, on its failure paths: the tool's
exception (with its traceback), a cancelled caller while the tool runs, the caller's
contextvars, a tool that never returns, the pool's shutdown, and ``fork``."""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
import threading
import traceback

import pytest
from agent_saga.compensation import Compensation
from agent_saga.context import step_id_var
from agent_saga.executor import ToolExecutor, get_tool_executor
from agent_saga.idempotency import FORWARD_SCOPE, idempotency_key
from agent_saga.rollback import RollbackOutcome
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import (
    Boom,
    of_type,
    payload,
    types,
    wal_fixture,  # noqa: F401 - provides the `wal` fixture
)
from fixtures.polling import until_async

R = ActionSemantics.REVERSIBLE
var: contextvars.ContextVar[str] = contextvars.ContextVar("hop_var", default="unset")


def _alive(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


async def test_a_raising_sync_tool_fails_the_step_with_its_own_traceback_and_undoes_the_rest(wal):
    undone: list[str] = []

    def put() -> dict[str, str]:
        return {"id": "1"}

    def broken_sync_tool() -> None:
        raise Boom("the tool broke")

    with pytest.raises(Boom) as caught:
        async with saga_scope(wal) as saga:
            await saga.execute("cache.put", R, put, lambda r: Compensation(fn=lambda: undone.append(r["id"])))
            await saga.execute("cache.put", R, broken_sync_tool)
    frames = [f.name for f in traceback.extract_tb(caught.value.__traceback__)]
    assert "broken_sync_tool" in frames  # raised in the worker, re-raised with its frames
    (failed,) = of_type(wal, saga.saga_id, "STEP_FAILED")
    assert payload(failed)["error_type"] == "Boom" and failed.step == f"{saga.saga_id}/1"
    assert undone == ["1"]
    assert types(wal, saga.saga_id)[-1] == "SAGA_ROLLED_BACK"


async def test_a_caller_cancelled_while_its_sync_tool_runs_is_unknown_and_the_tool_still_finishes(wal):
    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    seen: list[object] = []

    def slow_sync_tool() -> str:
        started.set()
        release.wait(30)
        finished.set()
        return "late"

    def undo(r: object) -> Compensation:
        seen.append(r)
        return Compensation(fn=lambda: seen.append("undone"))

    holder: list = []

    async def agent() -> None:
        async with saga_scope(wal) as saga:
            holder.append(saga)
            await saga.execute("cache.put", R, slow_sync_tool, undo)

    task = asyncio.create_task(agent())
    await until_async("the tool started", started.is_set, timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (saga,) = holder
    (unknown,) = of_type(wal, saga.saga_id, "STEP_UNKNOWN")
    assert payload(unknown)["error_type"] == "CancelledError"
    assert not of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert seen == [None, "undone"]  # a thread cannot be stopped: it may happen, undone from None
    (step,) = saga.rollback_report.steps
    assert step.outcome is RollbackOutcome.COMPENSATED
    assert not finished.is_set()  # the rollback did not wait for the thread
    release.set()
    await until_async("the tool finished", finished.is_set, timeout=10)
    ex = get_tool_executor()
    await until_async("its worker is free", lambda: ex.stats().active == 0, timeout=10)
    assert await ex.submit(lambda: "next", {}) == "next"  # the late result went nowhere


async def test_a_sync_tool_sees_a_copy_of_the_callers_context(wal):
    inside: list[tuple[str, str | None]] = []

    def sync_tool() -> None:
        inside.append((var.get(), step_id_var.get()))
        var.set("set-by-the-tool")

    var.set("from-the-caller")
    async with saga_scope(wal) as saga:
        await saga.execute("cache.put", R, sync_tool)
    assert inside == [("from-the-caller", f"{saga.saga_id}/0")]
    assert var.get() == "from-the-caller"  # the tool's own sets stay in its copy


async def test_a_tool_that_never_returns_holds_one_worker_and_the_rest_of_the_bound_serves():
    ex = ToolExecutor(2, name="t-wedged")
    wedged = threading.Event()
    wedge = ex.submit(wedged.wait, {})
    try:
        await until_async("the wedged call runs", lambda: ex.stats().active == 1, timeout=10)
        assert [await ex.submit(lambda i: i, {"i": i}) for i in range(3)] == [0, 1, 2]
        second = ex.submit(wedged.wait, {})
        third = ex.submit(lambda: "queued", {})
        s = ex.stats()
        assert (s.threads, s.active, s.queued) == (2, 2, 1)  # the bound: the third waits
        assert not third.done()
    finally:
        wedged.set()
    assert await third == "queued"
    await asyncio.gather(wedge, second)
    assert len(_alive("t-wedged")) == 2


async def test_shutdown_lets_the_idle_workers_exit_and_the_pool_serves_again():
    ex = ToolExecutor(4, name="t-down")
    idents = {await ex.submit(threading.get_ident, {}) for _ in range(20)}
    assert len(idents) == 1 and threading.get_ident() not in idents
    assert len(_alive("t-down")) == 1  # sequential calls: one thread, no leak
    ex.shutdown()
    await until_async("the workers exited", lambda: not _alive("t-down"), timeout=10)
    assert ex.stats().threads == 0
    assert await ex.submit(lambda: "again", {}) == "again"
    ex.shutdown()
    await until_async("the workers exited", lambda: not _alive("t-down"), timeout=10)


_FORK_CHILD = r"""
import asyncio, os, sys, threading
from agent_saga.executor import get_tool_executor

async def hop(value):
    return await asyncio.wait_for(get_tool_executor().submit(lambda: value, {}), 10)

assert asyncio.run(hop("parent")) == "parent"  # a worker thread now idles in the pool
pid = os.fork()
if pid == 0:
    try:
        ok = asyncio.run(hop("child")) == "child"  # the parent's thread is not here
        code = 0 if ok else 1
    except BaseException as exc:  # noqa: BLE001
        print("child:", type(exc).__name__, exc, file=sys.stderr)
        code = 2
    os._exit(code)
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_starts_its_own_workers_and_both_exit_cleanly():
    # Python 3.12+ warns that fork() in a process with threads may deadlock: that is the case tested.
    cmd = [sys.executable, "-W", "ignore::DeprecationWarning", "-c", _FORK_CHILD]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "child exit 0", out.stderr
    assert out.stderr == ""  # nothing printed at exit by the pool's threads


async def test_a_sync_tool_gets_the_steps_key_and_an_awaitable_it_returns_is_awaited_on_the_loop(wal):
    keys: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []

    def keyed(idempotency_key: str) -> dict[str, str]:
        keys.append(idempotency_key)
        return {"id": "1"}

    async def on_the_loop() -> str:
        loops.append(asyncio.get_running_loop())
        return "awaited"

    async with saga_scope(wal) as saga:
        assert await saga.execute("cache.put", R, keyed) == {"id": "1"}
        assert await saga.execute("cache.put", R, lambda: on_the_loop()) == "awaited"
    assert keys == [idempotency_key(saga.saga_id, f"{saga.saga_id}/0", FORWARD_SCOPE)]
    assert loops == [asyncio.get_running_loop()]
