"""The node suite's cluster: a real single-node Kubernetes cluster, once per session.

Fixtures
  node_session  session scope: starts the local node on first use (tests/fixtures/node.py)
                or uses --kubeconfig / AGENT_SAGA_E2E_KUBECONFIG (kind, any cluster with
                the images loaded); `.down()` stops the local node (the leftovers tests)
                and the next `.up()` starts a fresh one
  node          function scope: the running cluster (KubeCluster; `.node` is the local Node)
  images        the images this source tree builds (hack/build-images.sh), by name
  release       session scope: the chart installed as "agent-saga" in namespace agent-saga
                (node_support.Release), rolled out; each test gets it ready again
  agents        session scope: examples/payments/deployment.yaml, 3 replicas, on `release`

The leftovers tests (test_node_lifecycle.py) stop the session's node: they run after
every other node test, whatever the order of the files.

A missing binary, package or image fails the test with how to get it; nothing is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.binaries import Image, node_images
from fixtures.controlplane import KubeCluster, external_kubeconfig
from fixtures.node import NodeBusy
from fixtures.procs import MissingPart
from node_support import Agents, NodeSession, Release

_LAST = "test_node_lifecycle.py"
#: Runs before any test that uses the session's release: it installs and uninstalls the
#: same release ("agent-saga" in agent-saga) by the docs' own commands.
_FIRST = "test_docs_journey_on_node.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.path)).parent == here:
            # Fixture setup counts: the first test starts the node and installs the chart,
            # several roll Deployments out on a loaded 2-core machine.
            item.add_marker(pytest.mark.timeout(900))
    first = [i for i in items if Path(str(i.path)).parent == here and Path(str(i.path)).name == _FIRST]
    if first:
        rest = [i for i in items if i not in first]
        start = min((n for n, i in enumerate(rest) if Path(str(i.path)).parent == here), default=len(rest))
        items[:] = rest[:start] + first + rest[start:]
    last = [i for i in items if Path(str(i.path)).parent == here and Path(str(i.path)).name == _LAST]
    if last:
        rest = [i for i in items if i not in last]
        # Right after the other node tests (the node's own files are contiguous).
        end = max((n for n, i in enumerate(rest) if Path(str(i.path)).parent == here), default=len(rest) - 1)
        items[:] = rest[: end + 1] + last + rest[end + 1:]


@pytest.fixture(scope="session")
def node_session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeSession]:
    session = NodeSession(tmp_path_factory.mktemp("nodes"), external_kubeconfig(request.config.getoption("--kubeconfig")))
    try:
        yield session
    finally:
        left = session.down()
        assert left == [], "the node left this behind:\n  " + "\n  ".join(left)


def up(node_session: NodeSession) -> KubeCluster:
    """The session's cluster; a missing part or a busy machine fails the test saying why."""
    try:
        return node_session.up()
    except MissingPart as e:
        pytest.fail(f"missing part: {e}", pytrace=False)
    except NodeBusy as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def node(node_session: NodeSession) -> KubeCluster:
    return up(node_session)


@pytest.fixture(scope="session")
def images() -> dict[str, Image]:
    try:
        return node_images()
    except MissingPart as e:
        pytest.fail(f"missing part: {e}", pytrace=False)


@pytest.fixture(scope="session")
def release(node_session: NodeSession, images: dict[str, Image],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    cluster = up(node_session)
    rel = Release(cluster, images, tmp_path_factory.mktemp("release"))
    rel.notes = rel.install()
    rel.wait_ready()
    yield rel
    if node_session.cluster is cluster:  # the leftovers tests may have stopped the node
        rel.uninstall()


@pytest.fixture
def ready_release(release: Release) -> Release:
    """The session's release, every Deployment rolled out again (a test may have evicted,
    killed or upgraded something)."""
    release.wait_ready()
    return release


@pytest.fixture(scope="session")
def session_agents(release: Release) -> Agents:
    agents = Agents(release)
    agents.apply()
    return agents


@pytest.fixture
def agents(session_agents: Agents, ready_release: Release) -> Agents:
    session_agents.wait_ready()
    return session_agents
