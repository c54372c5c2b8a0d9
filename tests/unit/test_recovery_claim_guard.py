"""A claim's renewal stops when its saga is done, even if the lock absorbs the cancellation.

redis-py's asyncio client returns normally from a command cancelled mid-call about half
the time (measured with a real Redis: tests/integration/test_recovery_claim_guard_redis.py).
A renewal loop that relied on its one cancellation then ran forever, and the sweep that
waited for it never ended: recoveryd could not drain. Here the lock is a real
``FileClaimLock`` whose renewal absorbs a cancellation the same way, deterministically.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_saga.recovery import FileClaimLock
from agent_saga.recovery.claims import Claim
from agent_saga.recovery.daemon import _ClaimGuard


class AbsorbingLock(FileClaimLock):
    """Renewal takes a while and, the first time it is cancelled meanwhile, finishes and
    returns anyway (later renewals raise the cancellation, as most calls of the client do)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.renewing = asyncio.Event()
        self.absorbed = 0

    async def renew(self, claim: Claim) -> bool:
        self.renewing.set()
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            if self.absorbed:
                raise
            self.absorbed += 1
        return await super().renew(claim)


async def test_stop_returns_when_the_lock_absorbs_the_cancellation_mid_renewal(tmp_path: Path) -> None:
    lock = AbsorbingLock(tmp_path / "claims")
    claim = await lock.acquire("s1", 0.03)  # renewed every 10 ms
    assert claim is not None
    guard = _ClaimGuard(lock, claim)
    await asyncio.wait_for(lock.renewing.wait(), 30)
    stopping = asyncio.ensure_future(guard.stop())
    done, _ = await asyncio.wait({stopping}, timeout=30)  # a deadline, not a speed: forever is the bug
    assert stopping in done, "stop() did not return: the renewal loop outlived its cancellation"
    assert lock.absorbed == 1 and guard._task.done()
    await lock.release(claim)
    await lock.close()
