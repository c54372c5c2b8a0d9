"""The adapter tests' shared fixtures: one World per test module, reset before each test.

``world`` is module-scoped (a framework import is slow: one per module); the module's
name after ``test_`` (or before ``_cases``) names its framework, WAL and saga prefix.
"""

from __future__ import annotations

import pytest
from adapter_support import World, make_world


@pytest.fixture(scope="module")
def world(request, tmp_path_factory) -> World:
    framework = request.module.__name__.removeprefix("test_").removesuffix("_cases")
    return make_world(tmp_path_factory.mktemp(framework), framework)


@pytest.fixture(autouse=True)
def _clean(request) -> None:
    if "world" in request.fixturenames:
        request.getfixturevalue("world").reset()
