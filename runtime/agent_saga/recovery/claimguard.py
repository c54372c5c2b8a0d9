"""A claim renewed in the background while a daemon resolves the saga it names.

``ClaimGuard.check()`` raises ``ClaimLost`` once the claim is not certainly the daemon's:
a renewal refused, or none confirmed within 90% of the claim's ttl. The resolver calls it
before every handler and reconciler call (once it has a call slot) and before every log
record it writes (``Resolution._append``), so a daemon that lost its claim stops before
its next call or record. Not checked: the ledger's ``attempt`` and ``done`` entries and the
human-queue entry of an ESCALATED record already in the log (each records what was or is
about to be done, and the done entry of a call that ran is what keeps the next holder
from calling it again), nor the saga's journal entry, written once its terminal record is
durable. What a check cannot close remains: a daemon paused past the ttl between the
check and the call, or the record reaching the log, still makes that one call (the
handler's idempotency key absorbs it) or that one record (the log does not compare
claims).
"""

from __future__ import annotations

import asyncio
import logging

from ..clocks import SYSTEM_CLOCK, Clock
from .claims import Claim, ClaimLock
from .errors import ClaimLost, ClaimStoreUnavailable

__all__ = ["ClaimGuard"]

log = logging.getLogger("agent_saga.recovery")


class ClaimGuard:
    """Renews a claim in the background; ``check()`` raises ``ClaimLost`` once it is not
    certainly ours (renewal refused, or not confirmed within 90% of its ttl).

    ``stop()`` does not rely on cancellation alone: a client may absorb a cancellation
    that lands mid-call (redis-py's asyncio client does) and return normally, and a
    renewal loop that missed its one cancel would run, and hold the sweep, forever.
    """

    def __init__(self, lock: ClaimLock, claim: Claim, clock: Clock = SYSTEM_CLOCK) -> None:
        self.lock = lock
        self.claim = claim
        self._clock = clock
        self.confirmed = clock.monotonic()
        self.lost: str | None = None
        self._stopping = False
        self._task = asyncio.ensure_future(self._renew())

    async def _renew(self) -> None:
        period = max(self.claim.ttl / 3.0, 0.01)
        while not self._stopping:
            await self._clock.sleep(period)
            if self._stopping:
                return
            try:
                if await self.lock.renew(self.claim):
                    self.confirmed = self._clock.monotonic()
                else:
                    self.lost = "another daemon holds it now (it expired)"
                    return
            except ClaimStoreUnavailable as exc:
                log.warning("claim on %s not renewed: %s", self.claim.name, exc)

    def check(self) -> None:
        """Raise ``ClaimLost`` unless the claim is still certainly held."""
        if self.lost is None and self._clock.monotonic() - self.confirmed > self.claim.ttl * 0.9:
            self.lost = f"not renewed within its ttl of {self.claim.ttl}s"
        if self.lost is not None:
            raise ClaimLost(
                f"the claim on saga {self.claim.name} was lost: {self.lost}; stopped before "
                f"its next call or record, the holder finishes it",
                saga_id=self.claim.name,
            )

    async def stop(self) -> None:
        """Stop renewing (the claim itself is released by its holder)."""
        self._stopping = True
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
