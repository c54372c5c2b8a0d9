"""The tool executor hands a call straight to an idle worker; queued calls keep their order."""

from __future__ import annotations

import asyncio
import threading

from agent_saga.executor import ToolExecutor
from fixtures.polling import until_async


async def test_sequential_calls_reuse_one_persistent_worker() -> None:
    ex = ToolExecutor(4, name="t-reuse")
    seen = {await ex.submit(threading.get_ident, {}) for _ in range(50)}
    assert len(seen) == 1 and threading.get_ident() not in seen
    s = ex.stats()
    assert (s.threads, s.active, s.queued) == (1, 0, 0)


async def test_queued_calls_run_in_submission_order_on_the_freed_worker() -> None:
    ex = ToolExecutor(1, name="t-order")
    release = threading.Event()
    order: list[int] = []
    first = ex.submit(release.wait, {"timeout": 10})
    rest = [ex.submit(lambda i: order.append(i), {"i": i}) for i in range(5)]
    assert ex.stats().queued == 5
    release.set()
    await asyncio.gather(first, *rest)
    assert order == [0, 1, 2, 3, 4]
    assert ex.stats().threads == 1


async def test_a_shrink_retires_idle_workers_at_once_and_the_rest_still_serve() -> None:
    ex = ToolExecutor(3, name="t-shrink")
    release = threading.Event()
    busy = [ex.submit(release.wait, {"timeout": 10}) for _ in range(3)]
    await until_async("three workers running", lambda: ex.stats().active == 3, timeout=10)
    release.set()
    await asyncio.gather(*busy)
    await until_async("the workers idle", lambda: ex.stats().active == 0, timeout=10)
    ex.resize(1)
    assert ex.stats().threads == 1  # the idle surplus left at once
    await until_async(
        "the retired threads exited",
        lambda: sum(t.name.startswith("t-shrink-") for t in threading.enumerate()) == 1,
        timeout=10,
    )
    assert await ex.submit(lambda: "served", {}) == "served"
