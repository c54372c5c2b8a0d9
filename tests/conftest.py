"""Root conftest: loads the real-parts plugin (tests/fixtures/plugin.py) for every suite,
and groups the tests for parallel workers.

Fixtures it provides: kube, control_plane, redis_server, fresh_redis,
redis_server_factory, redis_cluster, postgres_server, postgres_db. See docs/control-plane.md.

Parallel runs (``make test`` runs ``pytest -n 2``, pytest-xdist): every
worker is a whole pytest session with its own session-scoped servers (its own
kube-apiserver + etcd, Redis, PostgreSQL). A module's tests stay together on one worker
(its module-scoped fixtures start once), and the node suite is one group (one real node
per machine).

The groups are handed out longest first (so no worker idles at the end while the other
finishes a long module): the node suite, then the modules of ``_LONGEST`` in that order,
then e2e, chaos, integration, ui and unit modules. ``_LONGEST`` is a hint measured with
``make test PYTEST_ARGS=--durations=0`` (seconds per module); a stale entry costs wall
time, never a result. (pytest-xdist's own default, most tests first, would start the node
suite after a dozen quick unit modules with more tests.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["fixtures.plugin"]

_NODE = "tests/node"
# Modules after the node suite, longest first (seconds measured on a loaded 2-core machine).
_LONGEST = (
    "tests/e2e/test_chart_apiserver.py",  # ~200 s
    "tests/e2e/test_plane_agents.py",  # ~120 s
    "tests/integration/mcp_proxy/test_mcp_boundaries.py",  # ~115 s
    "tests/e2e/test_docs_journey.py",  # ~105 s
    "tests/e2e/test_kube_control_plane_lifecycle.py",  # ~90 s
    "tests/integration/test_recovery_verified_fleet.py",  # ~75 s
    "tests/e2e/test_operator_agents.py",  # ~70 s
    "tests/integration/test_redis_failover.py",  # ~65 s
    "tests/chaos/test_chaos_race.py",  # ~60 s
    "tests/integration/test_recoveryd_fleet.py",  # ~55 s
    "tests/integration/test_limits_redis_fleet.py",  # ~50 s
    "tests/e2e/test_operator_projection.py",  # ~50 s
    "tests/integration/test_plane_wiring.py",  # ~50 s
    "tests/unit/recovery/test_recovery_readonly.py",  # ~45 s
    "tests/integration/test_wal_postgres.py",  # ~45 s
    "tests/integration/test_wal_redis.py",  # ~45 s
    "tests/unit/audit/test_audit_checkpoint.py",  # ~45 s
    "tests/integration/test_approvals_redis.py",  # ~40 s
    "tests/chaos/test_chaos_random.py",  # ~40 s
    "tests/e2e/test_operator_lifecycle.py",  # ~40 s
)
_SUITES = ("e2e", "chaos", "integration", "ui", "unit")


def _scope(nodeid: str) -> str:
    """The group a test runs in: its module, or the whole node suite."""
    path = nodeid.split("::", 1)[0]
    return _NODE if path.startswith(_NODE + "/") else path


def _rank(scope: str) -> tuple[int, int]:
    if scope == _NODE:
        return (0, 0)
    if scope in _LONGEST:
        return (1, _LONGEST.index(scope))
    top = scope.split("/")[1] if scope.count("/") > 1 else ""
    return (2, _SUITES.index(top) if top in _SUITES else len(_SUITES))


@pytest.hookimpl(optionalhook=True)  # pytest without pytest-xdist still runs the suites serially
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole modules to a worker (module-scoped fixtures start once); the node suite as one
    unit (one real node per machine); the longest units first."""
    from xdist.scheduler import LoadScopeScheduling

    # Keep the order the workers collected (below), not xdist's most-tests-first.
    config.option.loadscopereorder = False

    class SuiteScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return SuiteScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # only the order the workers hand to the scheduler
        return
    root = Path(__file__).parent.parent

    def rank(item: pytest.Item) -> tuple[int, int]:
        return _rank(_scope(Path(str(item.path)).relative_to(root).as_posix()))

    items.sort(key=rank)  # stable: the order inside each group is kept


# ``python -m pytest tests/test_chaos.py``: the crash suite's short entry point. Named on
# the command line, it collects tests/chaos/ (as if that directory had been named);
# collected with the rest (``make test``, ``pytest tests``), it holds only its own check,
# so the crash suite never runs twice.
_CHAOS_ENTRY = Path(__file__).resolve().parent / "test_chaos.py"
_CHAOS_DIR = _CHAOS_ENTRY.parent / "chaos"


def chaos_entry_named(config: pytest.Config) -> bool:
    """tests/test_chaos.py is on the command line and nothing else there collects tests/chaos/."""
    here = Path(config.invocation_params.dir)
    paths = [(here / str(arg).split("::")[0]).resolve() for arg in config.args]
    others = [p for p in paths if p != _CHAOS_ENTRY]
    return _CHAOS_ENTRY in paths and not any(
        p == _CHAOS_DIR or p in _CHAOS_DIR.parents or _CHAOS_DIR in p.parents for p in others)


class _CrashSuite(pytest.File):
    """tests/test_chaos.py's second collector: tests/chaos/, with its conftest."""

    def collect(self) -> Any:
        yield pytest.Dir.from_parent(self, path=_CHAOS_DIR)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path == _CHAOS_ENTRY and chaos_entry_named(parent.config):
        return _CrashSuite.from_parent(parent, path=file_path, name="crash-suite")
    return None
