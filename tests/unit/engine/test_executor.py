"""The bounded tool executor: bounds, saturation accounting, resizing, context propagation."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
from agent_saga.errors import ConfigurationError
from agent_saga.executor import ToolExecutor, set_tool_executor_size
from fixtures.polling import until_async

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


async def test_results_exceptions_and_context_cross_the_thread_hop():
    ex = ToolExecutor(2)
    var.set("from-caller")
    assert await ex.submit(lambda x: x * 2, {"x": 21}) == 42
    assert await ex.submit(var.get, {}) == "from-caller"
    with pytest.raises(ZeroDivisionError):
        await ex.submit(lambda: 1 / 0, {})


async def test_saturation_is_counted_once_per_episode_and_logged(caplog):
    ex = ToolExecutor(2, name="t-sat")
    release = threading.Event()
    with caplog.at_level("WARNING", logger="agent_saga.executor"):
        futs = [ex.submit(release.wait, {"timeout": 10}) for _ in range(5)]
        await until_async('ex.stats().active == 2', lambda: ex.stats().active == 2, timeout=5)
        s = ex.stats()
        assert (s.max_workers, s.threads, s.active, s.queued) == (2, 2, 2, 3)
        assert s.saturated_count == 1 and s.peak_queued == 3
        release.set()
        await asyncio.gather(*futs)
        # A second episode is counted (and logged) again.
        release.clear()
        futs = [ex.submit(release.wait, {"timeout": 10}) for _ in range(3)]
        await until_async('ex.stats().active == 2', lambda: ex.stats().active == 2, timeout=5)
        release.set()
        await asyncio.gather(*futs)
    assert ex.stats().saturated_count == 2
    warnings = [r for r in caplog.records if "saturated" in r.getMessage()]
    assert len(warnings) == 2


async def test_resize_grows_for_queued_work_and_shrinks_later():
    ex = ToolExecutor(1)
    release = threading.Event()
    futs = [ex.submit(release.wait, {"timeout": 10}) for _ in range(3)]
    await until_async('ex.stats().active == 1', lambda: ex.stats().active == 1, timeout=5)
    ex.resize(3)
    await until_async('ex.stats().active == 3', lambda: ex.stats().active == 3, timeout=5)
    release.set()
    await asyncio.gather(*futs)
    ex.resize(1)
    await until_async('ex.stats().threads == 1', lambda: ex.stats().threads == 1, timeout=5)


async def test_a_cancelled_wait_does_not_break_the_worker():
    ex = ToolExecutor(1)
    release = threading.Event()
    fut = ex.submit(release.wait, {"timeout": 10})
    fut.cancel()
    release.set()
    assert await ex.submit(lambda: "next", {}) == "next"


def test_sizes_are_validated():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError):
            ToolExecutor(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            set_tool_executor_size(bad)  # type: ignore[arg-type]
