"""Fixtures the e2e suites share: the CRDs installed once per module, and a namespace of
its own per test (named ``<NS_PREFIX>-<hex>``, the module's ``NS_PREFIX``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_saga_operator.testing import install_crds
from e2e_namespaces import namespace
from fixtures.controlplane import KubeCluster


@pytest.fixture(scope="module")
def crds(kube: KubeCluster) -> KubeCluster:
    """The session's cluster with this tree's CRDs installed."""
    install_crds(kube.kubectl, kube.api_client())
    return kube


@pytest.fixture
def ns(crds: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace for this test alone."""
    with namespace(crds, getattr(request.module, "NS_PREFIX", "e2e")) as name:
        yield name
