"""A namespace of its own for a test: ``<prefix>-<hex>``, created and deleted."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

from fixtures.controlplane import KubeCluster
from kubernetes import client


@contextlib.contextmanager
def namespace(kube: KubeCluster, prefix: str) -> Iterator[str]:
    """A fresh namespace ``<prefix>-<hex>``, deleted afterwards."""
    core = client.CoreV1Api(kube.api_client())
    name = f"{prefix}-{secrets.token_hex(4)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)
