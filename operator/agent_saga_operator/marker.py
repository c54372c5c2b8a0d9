"""The synced marker: tells readers that the policy plane holds the operator's whole state.

``P:v1:synced`` (a HASH, field ``operator``; docs/policy-plane.md, "The synced marker")
exists whenever every resource this operator manages has been projected. A runtime
reader that has seen the field and finds it gone knows the server lost its data
(FLUSHALL, a restart without persistence) and keeps honouring its last known kill-switch
levers (then fails closed) instead of reading the empty index as "no levers".

``SyncMarker`` is one task per operator process. Every ``interval`` seconds it checks the
field (one ``HEXISTS``). When it is missing (a fresh installation, or data loss) it:

1. notes the instant and writes a pending key (``Projector.begin_sync``);
2. lists the projected kinds' resources (read-only) and waits until kopf's handlers have
   reconciled every one of them after that instant (the resume handlers at start-up,
   the resync timers after a FLUSHALL: within one ``--resync-interval``);
3. sets the field (``Projector.mark_synced``), unless the pending key is gone (the
   server lost its data again meanwhile: start over).

A Redis restored from an older snapshot still holds the field (an old one). Two signs
tell the task the plane went back in time: the change counter is lower than at the last
check, or a periodic resync had to write a document whose generation was already
projected (``Context.drifted``: the resync overtook the counter, or someone edited the
plane by hand). The task then removes the field (``Projector.unmark``) and proceeds as
above; the field it sets at the end is a new value, which tells readers that noticed the
regression themselves that the plane is whole again.

Invariants:
- It never writes a document itself: documents are written only by kopf's handlers, so
  a paused standby replica (whose handlers do not run) never sets the marker, and a
  deletion cannot race a re-projection made from a stale listing.
- A single put never creates the marker: documents without it are a partial state.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any, cast

from . import metrics
from .config import Context
from .models import GROUP, KINDS, VERSION

__all__ = ["PROJECTED_KINDS", "SyncMarker"]

log = logging.getLogger("agent_saga_operator.marker")

PROJECTED_KINDS = ("KillSwitch", "BudgetLimit", "SagaPolicy", "ModelRoute")


class SyncMarker:
    """Re-creates the synced marker once every resource is projected again."""

    def __init__(self, ctx: Context, api_client: Any, *, interval: float) -> None:
        from kubernetes import client

        self.ctx = ctx
        self.api = client.CustomObjectsApi(api_client)
        self.interval = interval
        self.pending: tuple[str, float] | None = None  # (nonce, since: monotonic)
        self.marked = 0
        self.went_back = 0  # times the plane was seen going back in time
        self.last_rev: int | None = None  # the change counter at the last check
        self._waiting_logged: frozenset[str] = frozenset()

    async def _list(self, plural: str) -> list[dict[str, Any]]:
        config = self.ctx.config
        if config.clusterwide:
            got = cast(dict[str, Any], await asyncio.to_thread(self.api.list_cluster_custom_object, GROUP, VERSION,
                                                               plural))
            return list(got.get("items") or [])
        items: list[dict[str, Any]] = []
        for ns in config.namespaces:
            page = cast(dict[str, Any], await asyncio.to_thread(
                self.api.list_namespaced_custom_object, GROUP, VERSION, ns, plural))
            items.extend(page.get("items") or [])
        return items

    async def awaiting(self, since: float) -> list[str]:
        """``<Kind> <ns>/<name>`` of every live resource not reconciled since ``since``."""
        plurals = {m.info.kind: m.info.plural for m in KINDS}
        out = []
        for kind in PROJECTED_KINDS:
            for obj in await self._list(plurals[kind]):
                meta = obj.get("metadata") or {}
                if meta.get("deletionTimestamp"):
                    continue  # its finalizer removes the document
                id_ = f"{meta.get('namespace')}/{meta.get('name')}"
                if self.ctx.projected.get((kind, id_), -float("inf")) < since:
                    out.append(f"{kind} {id_}")
        return sorted(out)

    async def step(self) -> None:
        """One check (see the module doc). Raises on Redis or API failures."""
        projector = self.ctx.projector
        rev = await projector.plane_rev()  # before the marker: a restore in between is seen next time
        last, self.last_rev = self.last_rev, rev
        metrics.PLANE_REV.set(rev or 0)
        drifted, self.ctx.drifted = self.ctx.drifted, None  # while re-projecting, drift is expected
        went_back = rev is not None and last is not None and rev < last
        synced, cause = await projector.is_synced(), "lost"
        if synced and (went_back or drifted):
            self.went_back += 1
            await projector.unmark()
            synced = False
            why = (f"{projector.keys.rev} is {rev}, it was {last}" if went_back else
                   f"the resync had to write {drifted} again although it was projected")
            log.warning("the policy plane went back in time (%s: Redis restored from an older snapshot, or edited "
                        "by hand): synced marker %s removed; every resource is projected again", why,
                        projector.keys.synced)
            cause = "went_back"
        if synced:
            metrics.PLANE_SYNCED.set(1)
            self.pending = None
            return
        metrics.PLANE_SYNCED.set(0)
        if self.pending is None:
            metrics.PLANE_REPROJECTIONS.labels(cause).inc()
            nonce = secrets.token_hex(8)
            since = time.monotonic()
            await projector.begin_sync(nonce)
            self.pending = (nonce, since)
            if cause == "lost":
                log.warning("the policy plane carries no synced marker (%s: a fresh installation, or the server "
                            "lost its data): agents keep their last known kill switches until every resource "
                            "is projected again", projector.keys.synced)
        nonce, since = self.pending
        waiting = await self.awaiting(since)
        if waiting:
            if frozenset(waiting) != self._waiting_logged:
                self._waiting_logged = frozenset(waiting)
                log.info("synced marker waits for %d resource(s) to be projected: %s", len(waiting),
                         ", ".join(waiting[:10]) + (" ..." if len(waiting) > 10 else ""))
            return
        rev = await projector.mark_synced(nonce, now=time.time())
        self.pending = None
        self._waiting_logged = frozenset()
        if rev < 0:
            log.warning("the policy plane lost its data again during the projection: projecting again")
            return
        self.marked += 1
        metrics.PLANE_SYNCED.set(1)
        log.info("every resource is in the policy plane: synced marker %s set (rev %d)", projector.keys.synced, rev)

    async def run(self, stopped: asyncio.Event) -> None:
        """Until ``stopped``: ``step`` every ``interval`` seconds; failures are logged and retried."""
        while not stopped.is_set():
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - Redis or the API server: retried next round
                log.warning("synced marker check failed (%s: %s); retrying", type(e).__name__, e)
            try:
                await asyncio.wait_for(stopped.wait(), timeout=self.interval)
            except TimeoutError:
                pass
