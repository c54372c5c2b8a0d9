"""Root conftest: loads the real-parts plugin (tests/fixtures/plugin.py) for every suite,
and groups the tests for parallel workers.

Fixtures it provides: kube, control_plane, redis_server, fresh_redis,
redis_server_factory, postgres_server, postgres_db. See docs/control-plane.md.

Parallel runs (``make test`` runs ``pytest -n 2``, pytest-xdist): every
worker is a whole pytest session with its own session-scoped servers (its own
kube-apiserver + etcd, Redis, PostgreSQL). A module's tests stay together on one worker
(its module-scoped fixtures start once), and the node suite is one group (one real node
per machine), started first because it is the longest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["fixtures.plugin"]

_FIRST = ("node", "e2e", "chaos")  # the longest groups first, so no worker idles at the end


@pytest.hookimpl(optionalhook=True)  # pytest without pytest-xdist still runs the suites serially
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole modules to a worker (module-scoped fixtures start once); the node suite as one
    unit (one real node per machine)."""
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/node" if path.startswith("tests/node/") else path

    return SuiteScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # only the order the workers hand to the scheduler
        return

    def rank(item: pytest.Item) -> int:
        top = Path(str(item.path)).relative_to(Path(__file__).parent).parts[0]
        return _FIRST.index(top) if top in _FIRST else len(_FIRST)

    items.sort(key=rank)  # stable: the order inside each suite is kept
