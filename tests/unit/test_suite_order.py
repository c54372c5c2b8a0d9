"""The parallel workers' order (tests/conftest.py): the node suite first, the modules named
as the slowest next, in the order given, then e2e, chaos, integration, ui and unit; a name
in that list is a module that exists (a renamed module would silently lose its place)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
assert _spec is not None and _spec.loader is not None
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)


def test_every_module_named_as_slowest_exists_once() -> None:
    assert len(set(suite._LONGEST)) == len(suite._LONGEST)
    missing = [m for m in suite._LONGEST if not (ROOT / m).is_file()]
    assert missing == [], f"tests/conftest.py _LONGEST names modules that do not exist: {missing}"


def test_units_are_handed_out_node_suite_then_longest_then_by_suite() -> None:
    scopes = ["tests/unit/test_layers.py", "tests/integration/test_ui_redis.py", suite._LONGEST[1],
              "tests/e2e/test_kube_crd.py", suite._scope("tests/node/test_node_cluster.py::test_x"),
              "tests/chaos/test_loop_crash.py", suite._LONGEST[0], "tests/ui/test_ui_browser.py"]
    assert sorted(scopes, key=suite._rank) == [
        "tests/node", suite._LONGEST[0], suite._LONGEST[1], "tests/e2e/test_kube_crd.py",
        "tests/chaos/test_loop_crash.py", "tests/integration/test_ui_redis.py", "tests/ui/test_ui_browser.py",
        "tests/unit/test_layers.py"]
