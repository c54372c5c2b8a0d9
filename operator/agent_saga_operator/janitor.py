"""Finished Approvals are deleted a while after they finish, like a Job with
``ttlSecondsAfterFinished``.

An Approval is finished once its phase is Approved, Denied or Expired; its ``status.
decidedAt`` is when. With ``--approval-ttl-after-finished SECONDS`` (chart:
``operator.approvalTtlSecondsAfterFinished``) the janitor deletes each finished Approval
that many seconds after ``decidedAt``; 0 keeps them forever. The decision itself stays
where it counts: in the WAL of the saga that waited on it, and in the policy plane's
decision document until its own TTL; the Approval is only the Kubernetes view of it.

Invariants:
- Only finished Approvals are deleted, never a Pending one, and only after the TTL.
- A deletion names the object's uid as a precondition: an Approval recreated under the
  same name in the meantime is never the one deleted.
- The janitor needs ``delete`` on approvals and nothing else beyond ``list``; a failed
  sweep (API unreachable) is logged and retried at the next interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from .models import GROUP, VERSION

__all__ = ["FINISHED_PHASES", "ApprovalJanitor", "due"]

log = logging.getLogger("agent_saga_operator.janitor")

FINISHED_PHASES = frozenset({"Approved", "Denied", "Expired"})


def due(obj: Mapping[str, Any], now: datetime, ttl: float) -> bool:
    """Whether ``obj`` (an Approval) finished at least ``ttl`` seconds before ``now``."""
    status = obj.get("status") or {}
    if ttl <= 0 or status.get("phase") not in FINISHED_PHASES:
        return False
    raw = status.get("decidedAt")
    if not isinstance(raw, str):
        return False
    try:
        decided = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return False
    return decided + timedelta(seconds=ttl) <= now


class ApprovalJanitor:
    """Delete finished Approvals ``ttl`` seconds after they finished (see the module doc)."""

    def __init__(self, api_client: Any, ttl: float, namespaces: Sequence[str] = ()) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)
        self.ttl = ttl
        self.namespaces = tuple(namespaces)
        # Often enough that an Approval outlives its TTL by at most a quarter of it (and a minute).
        self.interval = min(max(ttl / 4, 0.5), 60.0)

    def _list(self) -> list[dict[str, Any]]:
        if not self.namespaces:
            listed: Any = self.api.list_cluster_custom_object(GROUP, VERSION, "approvals")
            return list(listed["items"])
        items: list[dict[str, Any]] = []
        for ns in self.namespaces:
            listed = self.api.list_namespaced_custom_object(GROUP, VERSION, ns, "approvals")
            items += listed["items"]
        return items

    def _delete(self, obj: Mapping[str, Any]) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta = obj["metadata"]
        try:
            self.api.delete_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], "approvals", meta["name"],
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta["uid"])))
        except ApiException as e:
            if e.status in (404, 409):  # already gone, or a new object under that name
                return False
            raise
        log.info("deleted finished Approval %s/%s (phase %s, decided %s; TTL after finished %gs)",
                 meta["namespace"], meta["name"], obj["status"]["phase"], obj["status"]["decidedAt"], self.ttl)
        return True

    def sweep(self, now: datetime | None = None) -> int:
        """Delete every due Approval now; how many were deleted."""
        now = now or datetime.now(UTC)
        return sum(self._delete(o) for o in self._list() if due(o, now, self.ttl))

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.sweep)
            except Exception as e:  # noqa: BLE001 - the API may be briefly unreachable
                log.warning("approval cleanup failed (retrying in %gs): %s", self.interval, e)
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.interval)
            except TimeoutError:
                pass
