"""Replicas split the orphans between them instead of all racing for every one.

A fleet of daemons over one log shares a membership (``RedisClaimLock.members``: a sorted
set in the claims' namespace, each member's score the time its entry expires, kept by the
server's clock). Each daemon renews its own entry in the background (``Heartbeat``) and,
at each sweep, takes only the orphans it owns: the live member with the highest
``hash(member, saga id)`` (rendezvous hashing). When a member dies its entry expires and
only its sagas move, each to the live member that now ranks highest for it.

Invariants:
- Sharding only orders work; it never decides correctness: every saga is still claimed
  before it is touched, re-read after the claim, and the ledger still stops a repeat. Two
  replicas whose views of the membership differ for a moment may both take a saga (the
  claim admits one) or neither (the next sweep, once the views agree, does).
- A dead replica's shard is taken over once its entry expires (``ttl``: at most a few
  sweep intervals); the sagas it held claims on, once those claims expire, as before.
- When the membership cannot be read (the store is unreachable) or this daemon is not in
  it, a daemon takes every orphan: sharding fails towards contention, never towards
  leaving sagas unresolved.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from .errors import ClaimStoreUnavailable

__all__ = ["Heartbeat", "owner_of", "shard_of"]

log = logging.getLogger("agent_saga.recovery")

Members = Callable[[str, float], Awaitable[list[str]]]


def _rank(member: str, saga_id: str) -> bytes:
    return hashlib.blake2b(f"{member}\0{saga_id}".encode(), digest_size=8).digest()


def owner_of(saga_id: str, members: Sequence[str]) -> str:
    """The member that resolves ``saga_id`` (rendezvous hashing over ``members``)."""
    return max(members, key=lambda m: _rank(m, saga_id))


def shard_of(saga_ids: Sequence[str], me: str, members: Sequence[str] | None) -> list[str]:
    """The ids of ``saga_ids`` that ``me`` owns, in order (all of them when ``members`` is
    unknown or does not hold ``me``)."""
    if not members or me not in members or len(members) == 1:
        return list(saga_ids)
    return [s for s in saga_ids if owner_of(s, members) == me]


class Heartbeat:
    """Keeps ``me`` in the membership every ``ttl / 3`` seconds; ``members`` is the live
    membership last read (``None`` until the first renewal, or after one failed)."""

    def __init__(self, renew: Members, me: str, ttl: float) -> None:
        self._renew = renew
        self.me = me
        self.ttl = ttl
        self.members: list[str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def started(self) -> bool:
        """True while renewing in the background (after the first ``start``)."""
        return self._task is not None

    async def beat(self) -> list[str] | None:
        """Renew now; the live membership, or ``None`` if the store cannot be reached."""
        try:
            self.members = await self._renew(self.me, self.ttl)
        except ClaimStoreUnavailable as exc:
            log.warning("recovery membership not renewed (every orphan is taken meanwhile): %s", exc.message)
            self.members = None
        return self.members

    def start(self) -> None:
        """Renew in the background from now on (idempotent)."""
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(max(self.ttl / 3.0, 0.01))
            if not self._stopping:
                await self.beat()

    async def stop(self) -> None:
        """Stop renewing (the entry then expires, unless the caller leaves explicitly).
        Not cancellation alone: a client may absorb a cancel that lands mid-call."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
