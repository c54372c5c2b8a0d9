"""saga_lifespan and @saga in process (the ASGI lifespan is an async context manager):
routes get the default WAL, shutdown cancels a @saga still running so that it rolls back
and waits for that rollback before closing the log, a bad WAL is named at startup, a
crashed recovery daemon is surfaced, not hidden. The real-uvicorn tests (SIGTERM) are in
tests/integration/test_fastapi_uvicorn.py."""

from __future__ import annotations

import asyncio
import inspect
import logging
from pathlib import Path

import pytest
from agent_saga import (
    Compensation,
    ConfigurationError,
    RecoveryDaemon,
    current_saga,
    get_default_wal,
    saga,
    saga_lifespan,
    set_default_wal,
)
from agent_saga.wal.file import iter_file_records
from fixtures.polling import until_async


def saga_records(path: Path, saga_id: str) -> list[str]:
    return [r.type for _, r in iter_file_records(path) if not isinstance(r, Exception) and r.saga == saga_id]


async def test_routes_use_the_lifespans_wal_and_get_their_saga(tmp_path: Path):
    path = tmp_path / "app.wal"
    before = set_default_wal(None)

    @saga
    async def checkout(order: str, saga) -> str:  # noqa: F811 - the injected Saga
        assert current_saga() is saga
        await saga.execute("shop.reserve", "REVERSIBLE", lambda: order)
        return saga.saga_id

    # FastAPI reads the signature: `saga` is not a request parameter
    assert list(inspect.signature(checkout).parameters) == ["order"]
    try:
        async with saga_lifespan(path, recovery=False)(None) as state:
            runtime = state["agent_saga"]
            assert get_default_wal() is runtime.wal
            saga_id = await checkout("o-1")
            assert current_saga() is None
            assert runtime.status() == {"healthy": True, "open_sagas": [], "recovery": None}
        assert runtime.wal.closed
        assert saga_records(path, saga_id) == ["SAGA_STARTED", "STEP_INTENT", "STEP_COMMITTED", "SAGA_COMPLETED"]
        assert saga_id.startswith("checkout-")
    finally:
        set_default_wal(before)


async def test_shutdown_cancels_a_running_saga_and_waits_for_its_rollback(tmp_path: Path, caplog):
    path = tmp_path / "app.wal"
    undone: list[str] = []
    committed = asyncio.Event()
    before = set_default_wal(None)

    async def slow_undo() -> None:
        await asyncio.sleep(0.05)  # the compensation is still running when shutdown begins
        undone.append("reserve")

    @saga(name="hold")
    async def hold(saga) -> None:
        await saga.execute("shop.reserve", "COMPENSABLE", lambda: "r",
                           lambda r: Compensation(fn=slow_undo))
        committed.set()
        await asyncio.Event().wait()  # never finishes by itself

    try:
        caplog.set_level(logging.INFO, "agent_saga")
        async with saga_lifespan(path, recovery=False, drain_timeout=0.05)(None) as state:
            task = asyncio.ensure_future(hold())
            await committed.wait()
            saga_id = state["agent_saga"].status()["open_sagas"][0]
        # the lifespan returned only after the rollback: the undo ran and its record is on disk
        assert undone == ["reserve"]
        assert saga_records(path, saga_id)[-3:] == ["COMPENSATION_STARTED", "COMPENSATION_DONE", "SAGA_ROLLED_BACK"]
        assert task.cancelled() or isinstance(task.exception(), asyncio.CancelledError)
        assert "cancelling 1 @saga call(s)" in caplog.text
        # the previous default (none) is back; asking get_default_wal() would make one in the cwd
        assert set_default_wal(None) is None
    finally:
        set_default_wal(before)


async def test_a_bad_wal_is_named_at_startup(tmp_path: Path):
    with pytest.raises(ConfigurationError, match=r"wal_path_or_url"):
        saga_lifespan("")
    with pytest.raises(ConfigurationError, match=r"drain_timeout"):
        saga_lifespan(tmp_path / "w", drain_timeout=0)
    lifespan = saga_lifespan("ftp://user:hunter2@host/log")
    with pytest.raises(ConfigurationError, match=r"wal_path_or_url 'ftp://user:\*\*\*@host/log'") as info:
        async with lifespan(None):
            pass
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigurationError, match=r"returned None, not a RecoveryDaemon"):
        async with saga_lifespan(tmp_path / "w.wal", recovery=lambda wal: None)(None):
            pass
    with pytest.raises(ConfigurationError, match=r"cannot import 'no_such_handlers_module'"):
        async with saga_lifespan(tmp_path / "w.wal", imports=["no_such_handlers_module"])(None):
            pass


class CrashingDaemon(RecoveryDaemon):
    """A real daemon whose sweep dies with an unexpected error (a bug, a broken disk driver)."""

    async def sweep(self, *, dry_run: bool = False, wait: float | None = None):
        raise RuntimeError("sweep crashed")


async def test_a_crashed_recovery_daemon_is_surfaced(tmp_path: Path, caplog):
    path = tmp_path / "app.wal"
    before = set_default_wal(None)
    try:
        lifespan = saga_lifespan(path, recovery=True)
        async with lifespan(None) as state:
            runtime = state["agent_saga"]
            assert runtime.daemon is not None
        # same again with the crashing daemon, on the app's own log
        async with saga_lifespan(tmp_path / "crash.wal", recovery=CrashingDaemon)(None) as state:
            runtime = state["agent_saga"]
            wal = runtime.wal
            await until_async("the daemon's crash to be recorded", lambda: runtime.recovery_error is not None)
            assert runtime.healthy() is False
            assert runtime.status()["recovery"]["crashed"] == "RuntimeError: sweep crashed"
        crit = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert crit and "recovery daemon" in crit[0].getMessage() and "sweep crashed" in crit[0].getMessage()
        assert wal.closed
    finally:
        set_default_wal(before)
