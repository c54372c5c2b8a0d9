"""``python -m pytest tests/test_chaos.py`` runs the crash suite (tests/chaos/), and a
run that collects both never collects a chaos test twice (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collected(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:langsmith_plugin", "-p", "no:cacheprovider",
                          "--collect-only", "-q", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_the_entry_point_collects_the_crash_suite_once() -> None:
    suite = collected("tests/chaos")
    assert suite and all(item.startswith("tests/chaos/") for item in suite)
    entry = collected("tests/test_chaos.py")
    assert sorted(entry) == sorted([*suite, "tests/test_chaos.py::test_the_crash_suite_is_where_this_entry_point_collects_it"])
    assert sorted(collected("tests/test_chaos.py", "tests/chaos")) == sorted(entry)  # not twice
    assert collected("-m", "crash", "tests/test_chaos.py") == suite  # the suite's own conftest applies
