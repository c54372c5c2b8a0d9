"""The published approver keys, also in a ConfigMap agents mount.

Agents that trust only the keys published in the policy plane would find none after the
plane loses its data (until the operator publishes them again), and a process that never
saw them would accept an unsigned approval. So the operator also writes every key it
publishes into one data key, ``operator-published.pem``, of a ConfigMap (``--approval-
keys-configmap NAMESPACE/NAME``; the chart makes ``<release>-approval-keys`` and mounts
it nowhere itself: agents mount it and set ``AGENT_SAGA_APPROVAL_KEYS`` to the directory).
A configured key directory requires signatures even while it is empty.

Invariants:
- The operator patches only that one data key of that one ConfigMap (RBAC: ``get`` and
  ``patch`` on it by name); the chart renders the approvers' keys beside it and keeps
  ``operator-published.pem`` across upgrades.
- Each key keeps its ``Approver:`` lines (whom it may approve as).
- A failure is logged and retried on the next pass; it never stops the bridge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["DATA_KEY", "KeysConfigMap"]

log = logging.getLogger("agent_saga_operator")

DATA_KEY = "operator-published.pem"
#: Seconds between checks once the ConfigMap holds the keys (someone may edit it).
RECHECK = 60.0


class KeysConfigMap:
    """Keep ``DATA_KEY`` of the ConfigMap ``ref`` (``NAMESPACE/NAME``, or ``None``: do
    nothing) equal to the published keys ``keys`` (key id -> PEM with its names)."""

    def __init__(self, api_client: Any, ref: str | None, keys: Mapping[str, str]) -> None:
        self.ref = ref
        self.text = "".join(keys[k] if keys[k].endswith("\n") else keys[k] + "\n" for k in sorted(keys))
        self._api_client = api_client
        self._checked = -RECHECK
        self._failed = False

    async def sync(self) -> bool:
        """Write the keys if the ConfigMap does not hold them; True if it was patched."""
        if self.ref is None or not self.text or time.monotonic() - self._checked < RECHECK:
            return False
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        namespace, _, name = self.ref.partition("/")
        api = client.CoreV1Api(self._api_client)
        try:
            cm = await asyncio.to_thread(api.read_namespaced_config_map, name, namespace)
            if ((cm.data or {}).get(DATA_KEY)) == self.text:
                self._checked, self._failed = time.monotonic(), False
                return False
            await asyncio.to_thread(api.patch_namespaced_config_map, name, namespace,
                                    {"data": {DATA_KEY: self.text}})
        except ApiException as e:
            if not self._failed:
                log.warning("could not write the approver keys into ConfigMap %s (%s %s): agents that mount it "
                            "keep the keys they had; retrying", self.ref, e.status, e.reason)
            self._failed = True
            return False
        self._checked, self._failed = time.monotonic(), False
        log.info("wrote the published approver keys into ConfigMap %s (%s)", self.ref, DATA_KEY)
        return True
