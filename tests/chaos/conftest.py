"""The crash suite: real worker processes killed with SIGKILL / os._exit, then recovered.

Every test here is marked ``crash``. Helpers live in ``chaos_support``; the bank in
``chaos_bank``; the worker in ``chaos_worker``; the acceptance rules in ``chaos_checks``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

CHAOS_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if CHAOS_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.crash)


@pytest.fixture
def reconcilers() -> Iterator[None]:
    """The chaos.charge reconciler registered for this test (the default)."""
    import chaos_reconcilers
    from agent_saga.recovery import reconciler

    reconciler("chaos.charge")(chaos_reconcilers.find_charge)
    yield


@pytest.fixture
def no_reconcilers() -> Iterator[None]:
    """No reconciler for chaos.charge: a dangling charge can only be escalated."""
    import chaos_reconcilers
    from agent_saga.recovery import reconciler
    from agent_saga.recovery.reconcilers import unregister_reconciler

    unregister_reconciler("chaos.charge")
    yield
    reconciler("chaos.charge")(chaos_reconcilers.find_charge)
