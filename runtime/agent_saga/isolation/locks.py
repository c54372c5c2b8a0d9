"""Semantic locks: a saga claims a resource id so a concurrent saga cannot dirty-read it.

    locks = SemanticLockManager()                  # process-local (asyncio); the default
    locks = RedisSemanticLocks("redis://...")      # shared by every process of a fleet

    async with saga_scope(wal) as saga:
        await locks.claim(saga, "account:42", wait=5)   # held until the saga is resolved
        ...

Both implementations take the same calls (``SemanticLocks``):

    acquire(resource_id, saga_id, lease=, wait=)  -> LockClaim   (bounded wait)
    renew(claim)                                  -> bool        (compare-and-extend)
    release(resource_id, saga_id)                 -> bool        (compare-and-delete)
    holder(resource_id)                           -> saga id or None
    claim(saga, resource_id, lease=, wait=)       acquire + background renewal + release
                                                  at the saga boundary (``Saga.on_exit``)
    hold(resource_id, saga_id, ...)               the same as an ``async with`` block

Invariants:
- A claim is a lease: it expires ``lease`` seconds after its last renewal, so a holder
  that was SIGKILLed (or whose loop froze) cannot hold a resource forever. ``claim`` and
  ``hold`` renew every ``lease / 3`` seconds from an asyncio task; a renewal that finds
  the claim gone or taken stops and logs the lost isolation (it never re-takes it).
- Acquiring is atomic; a saga that already holds the resource gets it again (the lease
  is extended), never a second claim.
- Only the holder frees a claim: ``release`` by another saga raises
  ``SemanticLockNotHeld`` naming the holder and changes nothing; releasing a claim that
  already lapsed returns False.
- A wait is bounded: after ``wait`` seconds ``SemanticLockTimeout`` names the saga
  that holds the resource. Waiting polls (5 ms doubling to 100 ms), never spins.
- ``claim`` releases at the saga boundary on every exit path (completed, rolled back,
  partial, quarantined, cancelled), after the rollback ran: a concurrent saga never
  reads the resource between a failed saga's step and its compensation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

from ..errors import ConfigurationError
from ..records import validate_id
from .errors import SemanticLockNotHeld, SemanticLockTimeout

__all__ = ["DEFAULT_LOCK_LEASE", "DEFAULT_LOCK_WAIT", "LockClaim", "SemanticLockManager", "SemanticLocks"]

log = logging.getLogger("agent_saga.isolation")

#: Seconds a claim lives after its last renewal (renewed every third of it).
DEFAULT_LOCK_LEASE: Final = 30.0
#: Seconds ``acquire`` waits for another saga's claim before ``SemanticLockTimeout``.
DEFAULT_LOCK_WAIT: Final = 10.0

_FIRST_POLL, _MAX_POLL = 0.005, 0.1


@dataclass(frozen=True, slots=True)
class LockClaim:
    """A held claim: ``saga_id`` holds ``resource_id`` for ``lease`` seconds per renewal."""

    resource_id: str
    saga_id: str
    lease: float


def check_lease(value: object, what: str = "lease") -> float:
    """``value`` as a lease in seconds; ``ConfigurationError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0.05:
        raise ConfigurationError(
            f"{what} must be a number of seconds >= 0.05, got {value!r}: it is how long a claim "
            f"outlives its holder's last renewal (a dead holder frees the resource after it)"
        )
    return float(value)


def check_wait(value: object) -> float:
    """``value`` as a wait in seconds (0 = do not wait); ``ConfigurationError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigurationError(
            f"wait must be a finite number of seconds >= 0, got {value!r}: it bounds how long "
            f"acquire waits for another saga's claim (0: fail at once if it is held)"
        )
    return float(value)


def _saga_id_of(saga: Any) -> str:
    saga_id = getattr(saga, "saga_id", None)
    if not isinstance(saga_id, str) or not callable(getattr(saga, "on_exit", None)):
        raise ConfigurationError(
            f"saga must be the Saga of a saga_scope (async with saga_scope(...) as saga), got {saga!r}; "
            f"outside a saga use acquire()/hold() with a saga_id"
        )
    return saga_id


class SemanticLocks:
    """The interface both lock stores implement (see the module doc). Subclasses
    implement the four ``_do_*`` methods; validation, waiting and renewal live here."""

    description: str = "semantic locks"

    # ------------------------------------------------------------------ store I/O

    async def _do_acquire(self, resource_id: str, saga_id: str, lease: float) -> tuple[bool, str | None]:
        """Atomically claim if free or already ours (extending it); ``(ok, holder)``."""
        raise NotImplementedError

    async def _do_renew(self, resource_id: str, saga_id: str, lease: float) -> bool:
        """Extend the claim if it is still ``saga_id``'s."""
        raise NotImplementedError

    async def _do_release(self, resource_id: str, saga_id: str) -> tuple[bool, str | None]:
        """Delete the claim if it is ``saga_id``'s; ``(released, holder now)``."""
        raise NotImplementedError

    async def _do_holder(self, resource_id: str) -> str | None:
        raise NotImplementedError

    # ------------------------------------------------------------------ interface

    async def acquire(
        self, resource_id: str, saga_id: str, *, lease: float = DEFAULT_LOCK_LEASE, wait: float = DEFAULT_LOCK_WAIT
    ) -> LockClaim:
        """Claim ``resource_id`` for ``saga_id``, waiting at most ``wait`` seconds.

        Raises ``SemanticLockTimeout`` (naming the holder) when the wait ran out,
        ``ConfigurationError`` for an invalid id, lease or wait, ``LockStoreUnavailable``
        if the store cannot be reached (nothing claimed)."""
        validate_id(resource_id, "resource_id")
        validate_id(saga_id, "saga_id")
        lease = check_lease(lease)
        wait = check_wait(wait)
        deadline = time.monotonic() + wait
        delay = _FIRST_POLL
        while True:
            ok, holder = await self._do_acquire(resource_id, saga_id, lease)
            if ok:
                return LockClaim(resource_id, saga_id, lease)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SemanticLockTimeout(
                    f"resource {resource_id!r} is held by saga {holder!r}: saga {saga_id} waited {wait:g}s "
                    f"for it and gave up. Retry later, raise wait=, or look at saga {holder!r} "
                    f"(a dead holder frees it when its lease runs out)",
                    resource_id=resource_id, holder=holder, saga_id=saga_id,
                )
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, _MAX_POLL)

    async def renew(self, claim: LockClaim) -> bool:
        """Extend ``claim`` by its lease if it is still held by its saga; False if it lapsed
        or another saga holds the resource now (never re-taken)."""
        return await self._do_renew(claim.resource_id, claim.saga_id, claim.lease)

    async def release(self, resource_id: str, saga_id: str) -> bool:
        """Free ``resource_id`` if ``saga_id`` holds it (True); False if nobody does (the
        claim lapsed). Raises ``SemanticLockNotHeld`` naming the holder, and changes
        nothing, if another saga holds it."""
        validate_id(resource_id, "resource_id")
        validate_id(saga_id, "saga_id")
        released, holder = await self._do_release(resource_id, saga_id)
        if released:
            return True
        if holder is None:
            return False
        raise SemanticLockNotHeld(
            f"saga {saga_id} cannot release {resource_id!r}: it is held by saga {holder!r}. Only the "
            f"holder frees a claim; it is released at that saga's boundary or when its lease runs out",
            resource_id=resource_id, holder=holder, saga_id=saga_id,
        )

    async def holder(self, resource_id: str) -> str | None:
        """The saga id holding ``resource_id`` now, or ``None``."""
        validate_id(resource_id, "resource_id")
        return await self._do_holder(resource_id)

    async def claim(
        self, saga: Any, resource_id: str, *, lease: float = DEFAULT_LOCK_LEASE, wait: float = DEFAULT_LOCK_WAIT
    ) -> LockClaim:
        """Claim ``resource_id`` for the running ``saga`` until it is resolved.

        The claim is renewed in the background and released by the saga's ``on_exit``
        hook on every exit path, after its rollback. Raises like ``acquire``."""
        saga_id = _saga_id_of(saga)
        claim = await self.acquire(resource_id, saga_id, lease=lease, wait=wait)
        renewal = self._start_renewal(claim)

        async def release(_saga: Any) -> None:
            await _stop(renewal)
            await self._release_own(claim)

        try:
            saga.on_exit(release)
        except BaseException:
            await release(saga)
            raise
        return claim

    @contextlib.asynccontextmanager
    async def hold(
        self, resource_id: str, saga_id: str, *, lease: float = DEFAULT_LOCK_LEASE, wait: float = DEFAULT_LOCK_WAIT
    ) -> AsyncIterator[LockClaim]:
        """``async with locks.hold(rid, saga_id) as claim:`` acquire, renew, and release on
        every way out of the block (shielded from cancellation)."""
        claim = await self.acquire(resource_id, saga_id, lease=lease, wait=wait)
        renewal = self._start_renewal(claim)
        try:
            yield claim
        finally:
            await asyncio.shield(_stop_and_release(self, renewal, claim))

    async def close(self) -> None:
        """Release connections (claims lapse or are released by their sagas)."""

    # ------------------------------------------------------------------ internals

    def _start_renewal(self, claim: LockClaim) -> asyncio.Task[None]:
        return asyncio.ensure_future(self._renew_forever(claim))

    async def _renew_forever(self, claim: LockClaim) -> None:
        every = claim.lease / 3.0
        while True:
            await asyncio.sleep(every)
            try:
                ok = await self.renew(claim)
            except Exception as exc:  # noqa: BLE001 - try again next period; the lease says the truth
                log.warning("saga %s: renewing its claim on %r failed: %s", claim.saga_id, claim.resource_id, exc)
                continue
            if not ok:
                log.error(
                    "saga %s LOST its claim on %r (the lease of %gs ran out before a renewal, or another saga "
                    "holds it): the resource is no longer isolated from other sagas",
                    claim.saga_id, claim.resource_id, claim.lease,
                )
                return

    async def _release_own(self, claim: LockClaim) -> None:
        try:
            if not await self.release(claim.resource_id, claim.saga_id):
                log.warning("saga %s: its claim on %r had lapsed before the release",
                            claim.saga_id, claim.resource_id)
        except SemanticLockNotHeld as exc:
            log.error("%s", exc)
        except Exception as exc:  # noqa: BLE001 - the lease frees it; say so
            log.error("saga %s: releasing %r failed (%s); it is freed when its lease of %gs runs out",
                      claim.saga_id, claim.resource_id, exc, claim.lease)


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def _stop_and_release(locks: SemanticLocks, renewal: asyncio.Task[None], claim: LockClaim) -> None:
    await _stop(renewal)
    await locks._release_own(claim)


class SemanticLockManager(SemanticLocks):
    """Semantic locks held in this process (every event loop of it): the default.

    Claims expire like the shared store's (``time.monotonic``), so code behaves the same
    on one node and on a fleet; a fleet needs ``RedisSemanticLocks``."""

    description = "process-local semantic locks"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, float]] = {}  # resource -> (saga, expires at)

    def _current(self, resource_id: str, now: float) -> str | None:
        held = self._held.get(resource_id)
        if held is None:
            return None
        if held[1] <= now:
            del self._held[resource_id]
            return None
        return held[0]

    async def _do_acquire(self, resource_id: str, saga_id: str, lease: float) -> tuple[bool, str | None]:
        with self._lock:
            now = time.monotonic()
            holder = self._current(resource_id, now)
            if holder is None or holder == saga_id:
                self._held[resource_id] = (saga_id, now + lease)
                return True, saga_id
            return False, holder

    async def _do_renew(self, resource_id: str, saga_id: str, lease: float) -> bool:
        with self._lock:
            now = time.monotonic()
            if self._current(resource_id, now) != saga_id:
                return False
            self._held[resource_id] = (saga_id, now + lease)
            return True

    async def _do_release(self, resource_id: str, saga_id: str) -> tuple[bool, str | None]:
        with self._lock:
            holder = self._current(resource_id, time.monotonic())
            if holder == saga_id:
                del self._held[resource_id]
                return True, None
            return False, holder

    async def _do_holder(self, resource_id: str) -> str | None:
        with self._lock:
            return self._current(resource_id, time.monotonic())

    def __repr__(self) -> str:
        return f"<SemanticLockManager {len(self._held)} claim(s)>"
