"""RedisSemanticLocks against a real Redis, and a holder killed with SIGKILL.

Each test is one sentence of the contract (docs/isolation.md): two sagas contend for one
resource; a SIGKILLed holder's lease expires so the waiter proceeds, and the recovery
daemon settles the tentative resource it left PENDING; renewal keeps a claim across a
run longer than its lease; a release by the wrong saga is refused; an unreachable
server is an error that names it without its password.
"""

from __future__ import annotations

import asyncio
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
from agent_saga import (
    FileWAL,
    LockClaim,
    LockStoreUnavailable,
    RecoveryDaemon,
    RedisSemanticLocks,
    SemanticLockNotHeld,
    SemanticLockTimeout,
    saga_scope,
)
from agent_saga.compensation import unregister_compensator
from fixtures.polling import until, until_async


def pttl(url: str, key: str) -> int:
    from fixtures.redis_server import client_for

    client = client_for(url)
    try:
        return int(client.pttl(key))
    finally:
        client.close()


class CountingLocks(RedisSemanticLocks):
    renewals = 0

    async def renew(self, claim: LockClaim) -> bool:
        ok = await super().renew(claim)
        self.renewals += ok
        return ok


async def test_two_sagas_contend_for_one_resource_and_take_turns(fresh_redis: Any, tmp_path: Path) -> None:
    locks = RedisSemanticLocks(fresh_redis.url, namespace="iso-contend")
    wal = FileWAL(tmp_path / "c.wal")
    first_holds, finish_first = asyncio.Event(), asyncio.Event()
    order: list[str] = []

    async def first() -> None:
        async with saga_scope(wal, saga_id="first") as saga:
            await locks.claim(saga, "account:42", lease=5)
            first_holds.set()
            await finish_first.wait()
            order.append("first resolved")

    async def second() -> None:
        await first_holds.wait()
        async with saga_scope(wal, saga_id="second") as saga:
            await locks.claim(saga, "account:42", lease=5, wait=30)
            order.append(f"second holds ({await locks.holder('account:42')})")

    try:
        tasks = [asyncio.ensure_future(first()), asyncio.ensure_future(second())]
        await first_holds.wait()
        with pytest.raises(SemanticLockTimeout) as e:
            await locks.acquire("account:42", "third", wait=0.05)
        assert e.value.holder == "first" and "held by saga 'first'" in str(e.value)
        finish_first.set()
        await asyncio.gather(*tasks)
        assert order == ["first resolved", "second holds (second)"]
        assert await locks.holder("account:42") is None
    finally:
        wal.close()
        await locks.close()


async def test_a_release_by_the_wrong_saga_is_refused_and_leaves_the_claim(fresh_redis: Any) -> None:
    locks = RedisSemanticLocks(fresh_redis.url, namespace="iso-wrong")
    try:
        await locks.acquire("account:7", "saga-a", lease=30)
        with pytest.raises(SemanticLockNotHeld) as e:
            await locks.release("account:7", "saga-b")
        assert e.value.holder == "saga-a"
        assert "saga saga-b cannot release 'account:7': it is held by saga 'saga-a'" in str(e.value)
        assert await locks.holder("account:7") == "saga-a"
        assert pttl(fresh_redis.url, locks.key("account:7")) > 0  # its lease untouched
        assert await locks.renew(LockClaim("account:7", "saga-b", 30)) is False  # nor extended by another
        assert await locks.release("account:7", "saga-a") is True
        assert await locks.release("account:7", "saga-a") is False
    finally:
        await locks.close()


async def test_renewal_keeps_a_claim_across_a_run_longer_than_its_lease(fresh_redis: Any, tmp_path: Path) -> None:
    locks = CountingLocks(fresh_redis.url, namespace="iso-renew")
    wal = FileWAL(tmp_path / "r.wal")
    try:
        async with saga_scope(wal, saga_id="long-run") as saga:
            await locks.claim(saga, "account:9", lease=0.6)
            # each counted renewal compared-and-extended a live key (PEXPIRE on a key that
            # expired finds nothing): four of them = held for longer than the lease
            await until_async("four renewals", lambda: locks.renewals >= 4, timeout=20, interval=0.01)
            assert await locks.holder("account:9") == "long-run"
            with pytest.raises(SemanticLockTimeout):
                await locks.acquire("account:9", "contender", wait=0)
        assert await locks.holder("account:9") is None
    finally:
        wal.close()
        await locks.close()


async def test_an_unreachable_server_is_an_error_naming_it_without_the_password() -> None:
    from fixtures.procs import free_port

    locks = RedisSemanticLocks(f"redis://:hunter2@127.0.0.1:{free_port()}/0", socket_timeout=1)
    try:
        with pytest.raises(LockStoreUnavailable) as e:
            await locks.acquire("account:1", "s1", wait=0)
        assert "failed while claiming 'account:1'; nothing was claimed or freed" in str(e.value)
        assert "hunter2" not in str(e.value) and "127.0.0.1" in str(e.value)
    finally:
        await locks.close()


HANDLERS = textwrap.dedent(
    """
    import json
    from agent_saga import compensator

    @compensator("isoredis.cancel")
    def cancel(order_id, out, idempotency_key):
        with open(out, "a") as f:
            f.write(json.dumps({"cancel": order_id, "key": idempotency_key}) + "\\n")
    """
)

HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    import isoredis_handlers
    from agent_saga import FileWAL, RedisSemanticLocks, TentativeResource, saga_scope

    url, wal_path, out, ready = sys.argv[1:5]

    async def main():
        locks = RedisSemanticLocks(url, namespace="iso-kill")
        async with saga_scope(FileWAL(wal_path), saga_id="holder", lease_seconds=0.3) as saga:
            await locks.claim(saga, "account:1", lease=1.5)
            await TentativeResource("order-1", rollback="isoredis.cancel",
                                    kwargs={"order_id": "order-1", "out": out}).register(saga)
            open(ready, "w").write("holding")
            await asyncio.Event().wait()   # killed here

    asyncio.run(main())
    """
)


@pytest.mark.crash
async def test_a_sigkilled_holder_frees_the_resource_by_lease_and_recovery_settles_its_tentative_resource(
    fresh_redis: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "isoredis_handlers.py").write_text(HANDLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    wal_path, out, ready = tmp_path / "k.wal", tmp_path / "out.jsonl", tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, fresh_redis.url, str(wal_path), str(out), str(ready)],
                              env=env, stderr=subprocess.PIPE, text=True)
    locks = RedisSemanticLocks(fresh_redis.url, namespace="iso-kill")
    try:
        until("the holder's claim", ready.exists, proc=holder, timeout=60)
        assert await locks.holder("account:1") == "holder"
        waiter = asyncio.ensure_future(locks.acquire("account:1", "waiter", lease=5, wait=60))
        # the holder renews while alive: the waiter keeps waiting
        seen: list[int] = []

        def renewed() -> bool:  # the key's remaining time jumped back up
            seen.append(pttl(fresh_redis.url, locks.key("account:1")))
            return len(seen) > 1 and seen[-1] > min(seen) + 50

        await until_async("a renewal by the live holder", renewed, timeout=20, interval=0.01)
        assert not waiter.done()
        os.kill(holder.pid, signal.SIGKILL)
        assert holder.wait(30) == -signal.SIGKILL
        claim = await asyncio.wait_for(waiter, 60)  # the lease ran out: the waiter proceeds
        assert claim.saga_id == "waiter" and await locks.holder("account:1") == "waiter"
        assert not out.exists()  # nothing settled the order yet: it is stranded PENDING
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if holder.stderr:
            holder.stderr.close()
        await locks.close()

    try:
        async with RecoveryDaemon(wal_path, imports=["isoredis_handlers"], clock=lambda: time.time() + 3600) as daemon:
            sweep = await daemon.sweep()
    finally:
        unregister_compensator("isoredis.cancel")
        sys.modules.pop("isoredis_handlers", None)
    (result,) = sweep.results
    assert (result.saga_id, result.status) == ("holder", "ROLLED_BACK")
    (call,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert call["cancel"] == "order-1"
