"""Semantic locks held in this process: each test is one sentence of the contract.

The same contract against a real Redis (cross-process, SIGKILL) is
tests/integration/test_isolation_redis.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agent_saga import (
    ActionSemantics,
    ConfigurationError,
    FileWAL,
    LockClaim,
    SemanticLockManager,
    SemanticLockNotHeld,
    SemanticLockTimeout,
    saga_scope,
)
from fixtures.polling import until_async

REV = ActionSemantics.REVERSIBLE


class CountingLocks(SemanticLockManager):
    """Counts renewals, so a test can wait for time to pass by what happened in it."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0

    async def renew(self, claim: LockClaim) -> bool:
        ok = await super().renew(claim)
        self.renewals += ok
        return ok


@pytest.fixture
def wal(tmp_path: Path) -> Any:
    w = FileWAL(tmp_path / "iso.wal")
    yield w
    w.close()


async def test_a_second_saga_waits_for_the_first_and_gets_the_resource_after_its_boundary(wal: Any) -> None:
    locks = SemanticLockManager()
    order: list[str] = []
    first_holds = asyncio.Event()
    finish_first = asyncio.Event()

    async def first() -> None:
        async with saga_scope(wal, saga_id="first") as saga:
            await locks.claim(saga, "account:42")
            first_holds.set()
            await finish_first.wait()
            order.append("first done")

    async def second() -> None:
        await first_holds.wait()
        async with saga_scope(wal, saga_id="second") as saga:
            await locks.claim(saga, "account:42", wait=30)
            order.append("second holds")
            assert await locks.holder("account:42") == "second"

    t1, t2 = asyncio.ensure_future(first()), asyncio.ensure_future(second())
    await first_holds.wait()
    with pytest.raises(SemanticLockTimeout):
        await locks.acquire("account:42", "third", wait=0)
    finish_first.set()
    await asyncio.gather(t1, t2)
    assert order == ["first done", "second holds"]
    assert await locks.holder("account:42") is None  # released at the second's boundary too


async def test_a_bounded_wait_ends_with_an_error_naming_the_holder_saga() -> None:
    locks = SemanticLockManager()
    await locks.acquire("account:42", "holder-saga")
    with pytest.raises(SemanticLockTimeout) as e:
        await locks.acquire("account:42", "waiter-saga", wait=0.05)
    assert e.value.holder == "holder-saga" and e.value.resource_id == "account:42"
    assert "held by saga 'holder-saga'" in str(e.value) and "waited 0.05s" in str(e.value)


async def test_a_release_by_another_saga_is_refused_and_the_claim_is_untouched() -> None:
    locks = SemanticLockManager()
    await locks.acquire("account:42", "saga-a")
    with pytest.raises(SemanticLockNotHeld) as e:
        await locks.release("account:42", "saga-b")
    assert e.value.holder == "saga-a"
    assert "saga saga-b cannot release 'account:42': it is held by saga 'saga-a'" in str(e.value)
    assert await locks.holder("account:42") == "saga-a"
    assert await locks.release("account:42", "saga-a") is True
    assert await locks.release("account:42", "saga-a") is False  # nothing left to free


async def test_the_holder_acquiring_again_extends_its_claim_rather_than_deadlocking() -> None:
    locks = SemanticLockManager()
    await locks.acquire("r1", "s1", lease=0.05)
    await locks.acquire("r1", "s1", lease=60, wait=0)
    assert await locks.holder("r1") == "s1"


async def test_a_claim_nobody_renews_expires_so_a_dead_holder_cannot_hold_it_forever() -> None:
    locks = SemanticLockManager()
    await locks.acquire("r1", "gone", lease=0.05)
    claim = await locks.acquire("r1", "next", lease=5, wait=10)  # polls until the lease ran out
    assert claim.saga_id == "next" and await locks.holder("r1") == "next"


async def test_a_claim_is_renewed_across_a_run_longer_than_its_lease(wal: Any) -> None:
    locks = CountingLocks()
    async with saga_scope(wal, saga_id="long") as saga:
        await locks.claim(saga, "r1", lease=0.5)
        # Each counted renewal compared-and-extended a live claim (an expired one is not
        # renewed), so four of them = held, continuously, for longer than the lease.
        await until_async("four renewals", lambda: locks.renewals >= 4, timeout=20, interval=0.01)
        assert await locks.holder("r1") == "long"
        with pytest.raises(SemanticLockTimeout):
            await locks.acquire("r1", "contender", wait=0)
    assert await locks.holder("r1") is None


@pytest.mark.parametrize("exit_path", ["completed", "rolled_back", "cancelled"])
async def test_a_claim_is_released_on_every_exit_path_after_the_rollback(wal: Any, exit_path: str) -> None:
    locks = SemanticLockManager()
    seen_during_undo: list[str | None] = []

    async def undo() -> None:
        seen_during_undo.append(await locks.holder("r1"))

    started = asyncio.Event()

    async def body() -> None:
        async with saga_scope(wal, saga_id=f"exit-{exit_path}") as saga:
            await locks.claim(saga, "r1")
            await saga.execute("cache.put", REV, forward=lambda: asyncio.sleep(0),
                               compensate=lambda r: __import__("agent_saga").Compensation(fn=undo))
            if exit_path == "rolled_back":
                raise RuntimeError("abort")
            if exit_path == "cancelled":
                started.set()
                await asyncio.Event().wait()

    task = asyncio.ensure_future(body())
    if exit_path == "cancelled":
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    elif exit_path == "rolled_back":
        with pytest.raises(RuntimeError, match="abort"):
            await task
    else:
        await task
    assert await locks.holder("r1") is None
    if exit_path != "completed":
        assert seen_during_undo == [f"exit-{exit_path}"]  # still isolated while undoing


@pytest.mark.parametrize(("call", "field", "fix"), [
    (lambda L: L.acquire("", "s"), "resource_id", "use 1-200 characters"),
    (lambda L: L.acquire("r", "bad id"), "saga_id", "use 1-200 characters"),
    (lambda L: L.acquire("r", "s", lease=0), "lease must be a number of seconds >= 0.05", "outlives"),
    (lambda L: L.acquire("r", "s", lease=float("inf")), "lease must be", ">= 0.05"),
    (lambda L: L.acquire("r", "s", wait=-1), "wait must be a finite number of seconds >= 0", "0: fail at once"),
    (lambda L: L.acquire("r", "s", wait=True), "wait must be", ">= 0"),
    (lambda L: L.claim(object(), "r"), "saga must be the Saga of a saga_scope", "use acquire()/hold()"),
])
async def test_bad_input_is_refused_naming_the_field_and_the_fix(call: Any, field: str, fix: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        await call(SemanticLockManager())
    assert field in str(e.value) and fix in str(e.value)


async def test_hold_releases_on_every_way_out_of_the_block() -> None:
    locks = SemanticLockManager()
    with pytest.raises(KeyError):
        async with locks.hold("r1", "s1") as claim:
            assert claim == LockClaim("r1", "s1", 30.0)
            raise KeyError("boom")
    assert await locks.holder("r1") is None
